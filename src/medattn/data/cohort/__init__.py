"""Who is in which split and with which label: the label columns of a table (``labels``), the patient-level
splits (``splits``), k-fold cross-validation of the kinds that draw from a seed (``folds``) and the same file in
several rows kept in one split (``duplicates``).
"""
