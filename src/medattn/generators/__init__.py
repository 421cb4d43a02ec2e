"""Every generator of data that is not a patient's: the SYNTHETIC data kinds (``synthetic_*``, drawn from a seed on
access, each a data kind of ``catalogue.DATA_KINDS`` with its builder), the SYNTHETIC whole slides
(:mod:`medattn.generators.slides`, pyramidal TIFF, OME-TIFF or DICOM, ``medattn wsi synthetic``) and the realistic
benchmark (:mod:`medattn.generators.realistic`, ``medattn realistic``: files from real anatomy that the table kinds
read).

A generator stands above what it writes or builds: the data layer (the bundle, the readers, the seeded dataset of
:mod:`medattn.data.seeded` that k-fold cross-validation pools) and the slides' writers (``slides.ome``,
``slides.dicom``); nothing below imports it (``docs/architecture.md``).
"""
