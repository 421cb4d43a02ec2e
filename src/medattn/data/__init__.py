"""Data sets for every input kind, patient-level splits, transforms and the synthetic benchmark."""
