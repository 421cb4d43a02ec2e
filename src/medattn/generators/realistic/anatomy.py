"""Real anatomy that installable packages ship, loaded offline: nilearn's MNI152 templates and tissue maps,
scikit-image's immunohistochemistry image. Nothing is downloaded: both packages carry these files.

Both packages are optional (``pip install 'medattn[realistic]'``); a missing one is a one-line UserError.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from medattn.extras import require


def _require(module: str):
    return require(module, "the realistic benchmark (real anatomy shipped offline by nilearn and scikit-image)")


@dataclass(frozen=True)
class Brain:
    """The MNI152 2009a symmetric template at 2 mm: T1 intensity in [0, 1], grey- and white-matter
    probability maps and the brain mask, each (99, 117, 95) float32 (x: left-right, y: back-front, z: up)."""

    t1: np.ndarray
    grey: np.ndarray
    white: np.ndarray
    mask: np.ndarray


@lru_cache(maxsize=1)
def mni152_brain() -> Brain:
    """The template of :class:`Brain`, read from nilearn's packaged files (no download)."""
    datasets = _require("nilearn.datasets")

    def load(function: str) -> np.ndarray:
        return np.asarray(getattr(datasets, function)(resolution=2).get_fdata(), dtype=np.float32)

    return Brain(load("load_mni152_template"), load("load_mni152_gm_template"), load("load_mni152_wm_template"),
                 load("load_mni152_brain_mask") > 0.5)


@lru_cache(maxsize=1)
def ihc_image() -> np.ndarray:
    """scikit-image's immunohistochemistry image (512, 512, 3) uint8: human colon tissue, haematoxylin
    counterstain and DAB (brown) immunostaining, as scikit-image ships it."""
    return np.asarray(_require("skimage.data").immunohistochemistry())


@lru_cache(maxsize=1)
def retina_image() -> np.ndarray:
    """scikit-image's retinal fundus photograph (1411, 1411, 3) uint8: a human retina (vessels, optic disc, a dark
    surround outside the field of view), as scikit-image ships it."""
    return np.asarray(_require("skimage.data").retina())
