"""The data kinds' builders, one module per kind (``catalogue.DATA_KINDS``): a config's ``data`` section to a
:class:`~medattn.data.base.DataBundle` (image, volume and bag tables, MedMNIST, NIfTI segmentation, slices and
unlabelled volumes, and the random patches a segmentation kind trains on). The SYNTHETIC kinds are generators'
(:mod:`medattn.generators`); the one entry point is :func:`medattn.data.build_datasets`.
"""
