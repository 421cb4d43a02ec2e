"""The SYNTHETIC mark of a slide and of a bag: what :mod:`medattn.generators.slides` writes into every slide's
description, and what ``medattn wsi tile`` and ``wsi extract`` carry into the tiles' JSON and the bags' HDF5 attribute
:data:`SYNTHETIC_ATTR` (:func:`is_synthetic`, :func:`bag_is_synthetic`). Reading the mark is the slides' business;
writing a slide is the generator's.
"""

from __future__ import annotations

from pathlib import Path

#: The start of the description of every slide medattn writes (TIFF ImageDescription, OpenSlide's property
#: tiff.ImageDescription): the mark that follows the data, to the tiles' JSON and the bags' HDF5 attribute
#: :data:`SYNTHETIC_ATTR`.
SYNTHETIC_MARK = "SYNTHETIC slide written by medattn (not tissue)"
#: The slide properties that hold a slide's description, one per format (:func:`is_synthetic`).
DESCRIPTIONS = ("tiff.ImageDescription", "ome.Description", "dicom.ImageComments")
#: The HDF5 attribute (and tiles' JSON key) that says a bag comes from a SYNTHETIC slide: True there.
SYNTHETIC_ATTR = "synthetic"


def is_synthetic(slide) -> bool:
    """Whether an open slide (OpenSlide, or a reader of :data:`~medattn.slides.reader.OTHER_READERS`) was written
    by :mod:`medattn.generators.slides`: its description (TIFF ImageDescription, OME Description, DICOM
    ImageComments) starts with :data:`SYNTHETIC_MARK`."""
    properties = getattr(slide, "properties", {})
    return any(str(properties.get(key, "")).startswith(SYNTHETIC_MARK) for key in DESCRIPTIONS)


def bag_is_synthetic(path: Path) -> bool:
    """Whether a bag's HDF5 file says it comes from a SYNTHETIC slide (attribute :data:`SYNTHETIC_ATTR` true)."""
    import h5py

    with h5py.File(path, "r") as f:
        return bool(f.attrs.get(SYNTHETIC_ATTR, False))
