"""Brain MRI cases from real anatomy (the MNI152 template, :mod:`.anatomy`) with SYNTHETIC findings.

A case is the template moved by a random affine (each patient lies differently in the scanner), given an
individual texture (smooth random field, 4% of the intensity), then perhaps a finding, then the scanner's
acquisition (:class:`Acquisition`: gain, gamma, bias field, Rician noise).

* **finding** (label 1): a hypointense ellipsoidal lesion inside the white matter (white-matter probability
  >= 0.8), radii ``LESION_RADII`` mm (``LESION_RADII_3D`` for the coarser volumes), intensity x (1 - c) with
  c drawn from ``LESION_CONTRAST``: on a T1 template this brings white matter down to about grey-matter
  intensity (a lacune- or plaque-like spot);
* **mimic** (either label, probability 0.5): the same kind of spot in the cortex (grey-matter probability
  >= 0.6), where a dark spot is sulcal CSF-like and harmless; so "a dark spot" does not solve the task, a
  dark spot *in white matter* does.

The lesion only darkens and is small: neither the image's maximum nor its mean tells the classes apart (the
benchmark's probe checks this on every task it writes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from .anatomy import Brain

LESION_RADII = (8.0, 14.0)  # mm, each ellipsoid axis drawn uniformly (2D slices at 64 px: 3.6 mm per pixel)
LESION_RADII_3D = (12.0, 20.0)  # mm: the slab is resampled to 32 x 32 x 16 (6-8 mm voxels), a lesion spans 3+
LESION_CONTRAST = (0.35, 0.55)  # fraction of the local intensity removed at the lesion's centre
MIMIC_PROBABILITY = 0.5
TEXTURE = 0.04


@dataclass(frozen=True)
class Acquisition:
    """A scanner's intensity habits, each drawn per case from its range: ``gain`` multiplies, ``gamma``
    bends the contrast, ``bias`` is the amplitude of a smooth multiplicative field, ``noise`` the Rician
    noise sigma (fraction of the white-matter intensity)."""

    gain: tuple[float, float] = (0.85, 1.15)
    gamma: tuple[float, float] = (0.85, 1.2)
    bias: float = 0.15
    noise: tuple[float, float] = (0.01, 0.03)


#: The development cohort and an external one (another scanner: flatter contrast, stronger bias, more noise).
COHORTS = {"a": Acquisition(), "b": Acquisition(gain=(0.7, 1.0), gamma=(1.1, 1.4), bias=0.25, noise=(0.03, 0.05))}


def _affine(ndim: int, rng: np.random.Generator, shape: tuple[int, ...], max_angle: float, max_shift: float):
    """(matrix, offset) for ``ndimage.affine_transform``: a rotation in the first two axes, isotropic scale and a
    shift, about the array's centre."""
    angle = np.deg2rad(rng.uniform(-max_angle, max_angle))
    scale = rng.uniform(0.92, 1.08)
    matrix = np.eye(ndim)
    matrix[:2, :2] = [[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]]
    matrix /= scale
    centre = (np.array(shape) - 1) / 2
    shift = np.r_[rng.uniform(-max_shift, max_shift, 2), np.zeros(ndim - 2)]
    return matrix, centre - matrix @ centre + shift


def _ellipsoid(shape: tuple[int, ...], centre: np.ndarray, radii: np.ndarray) -> np.ndarray:
    """A soft-edged ellipsoid in [0, 1] (1 inside, a logistic edge one voxel wide)."""
    grids = np.meshgrid(*[np.arange(n, dtype=np.float32) for n in shape], indexing="ij")
    d = np.sqrt(sum(((g - c) / r) ** 2 for g, c, r in zip(grids, centre, radii)))
    return 1.0 / (1.0 + np.exp((d - 1.0) * 2.0 * radii.mean()))


def _spot(image: np.ndarray, where: np.ndarray, voxel_mm: np.ndarray, radii_mm: tuple[float, float],
          rng: np.random.Generator) -> np.ndarray:
    """``image`` with a dark ellipsoid (axes drawn from ``radii_mm``) centred on a random voxel of ``where``."""
    candidates = np.argwhere(where)
    centre = candidates[rng.integers(len(candidates))].astype(np.float32)
    radii = rng.uniform(*radii_mm, size=image.ndim) / voxel_mm
    return image * (1.0 - rng.uniform(*LESION_CONTRAST) * _ellipsoid(image.shape, centre, radii))


def _bias_field(shape: tuple[int, ...], amplitude: float, rng: np.random.Generator) -> np.ndarray:
    """exp of a random linear + cross term over the normalised grid: a smooth multiplicative field."""
    grids = np.meshgrid(*[np.linspace(-1, 1, n, dtype=np.float32) for n in shape], indexing="ij")
    field = sum(rng.uniform(-1, 1) * g for g in grids) + rng.uniform(-1, 1) * grids[0] * grids[1]
    return np.exp(amplitude * field / 2)


def brain_case(brain: Brain, lesion: bool, acquisition: Acquisition, rng: np.random.Generator, *,
               region: tuple[slice, ...], zoom: float, radii_mm: tuple[float, float] = LESION_RADII,
               max_angle: float = 12.0, max_shift: float = 4.0) -> np.ndarray:
    """One case: the template cut to ``region`` (2 slices for a 2D case, 3 for a volume), resampled by ``zoom``
    (voxel size 2 mm / zoom), moved, textured, perhaps given a lesion (and a mimic), then acquired.
    -> float32 array, white matter near 1 before the acquisition's gain."""
    maps = [np.squeeze(ndimage.zoom(m[region].astype(np.float32), zoom, order=1))
            for m in (brain.t1, brain.white, brain.grey, brain.mask)]
    shape = maps[0].shape
    matrix, offset = _affine(len(shape), rng, shape, max_angle, max_shift)
    t1, white, grey, mask = (ndimage.affine_transform(m, matrix, offset, order=1) for m in maps)
    voxel_mm = np.full(len(shape), 2.0 / zoom)
    texture = ndimage.gaussian_filter(rng.standard_normal(shape).astype(np.float32), 1.5)
    image = t1 * (1 + TEXTURE * texture / texture.std())
    inside = ndimage.binary_erosion(mask > 0.5, iterations=2)
    if lesion:
        image = _spot(image, inside & (white >= 0.8), voxel_mm, radii_mm, rng)
    if rng.random() < MIMIC_PROBABILITY:
        image = _spot(image, inside & (grey >= 0.6), voxel_mm, radii_mm, rng)
    image = np.clip(image * _bias_field(shape, acquisition.bias, rng), 0, None) ** rng.uniform(*acquisition.gamma)
    sigma = rng.uniform(*acquisition.noise)
    noisy = np.hypot(image + sigma * rng.standard_normal(shape), sigma * rng.standard_normal(shape))  # Rician
    return (rng.uniform(*acquisition.gain) * noisy).astype(np.float32)
