"""SYNTHETIC brain-like volumes (not MRI), generated from a seed: the data kind ``synthetic_brain``
(:func:`build_synthetic_brain`), unlabelled volumes for the diffusion stages (docs/diffusion.md).

Each volume (:func:`synthetic_brain`) has a scalp, a dark skull shell, cerebrospinal fluid, a grey-matter ellipsoid,
a white-matter core with a folded (gyri-like) border, two ventricles, a smooth bias field and noise, with sizes,
positions and folding drawn per volume; intensities in [0, 1].
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from ..data.base import DataBundle, TaskInfo
from ..data.options import SPLITS, check_keys, integer, number, split_sizes
from ..data.preprocessing import Preprocessing
from ..errors import UserError
from ..vocabulary.task_types import UNLABELLED

NAME = "synthetic_brain"
KEYS = frozenset({"size", "num_samples", "seed", "noise"})
DEFAULT_SIZE = (64, 96, 64)
DEFAULT_SIZES = {"train": 24, "val": 4, "test": 4}


def _ellipsoid(coords: np.ndarray, centre, radii) -> np.ndarray:
    """Normalised radius ``sqrt(sum(((x - c) / r)^2))`` of every voxel: < 1 inside."""
    return np.sqrt(sum(((coords[i] - centre[i]) / radii[i]) ** 2 for i in range(3)))


def synthetic_brain(shape: tuple[int, int, int], rng: np.random.Generator, noise: float = 0.03) -> np.ndarray:
    """One SYNTHETIC brain-like volume (H, W, D) float32 in [0, 1] (see the module docstring)."""
    coords = np.stack(np.meshgrid(*(np.linspace(-1, 1, n) for n in shape), indexing="ij"))
    centre = rng.normal(0, 0.03, 3)
    radii = np.array([0.92, 0.95, 0.9]) * (1 + rng.normal(0, 0.03, 3))
    head = _ellipsoid(coords, centre, radii)
    volume = np.zeros(shape)
    volume[head < 1.0] = 0.55  # scalp
    volume[head < 0.93] = 0.08  # skull
    volume[head < 0.86] = 0.2  # cerebrospinal fluid
    brain = head < 0.82
    volume[brain] = 0.5  # grey matter
    angles = np.arctan2(coords[1] - centre[1], coords[0] - centre[0]), np.arctan2(coords[2] - centre[2],
                                                                                  coords[0] - centre[0])
    folds = sum(rng.uniform(0.02, 0.05) * np.sin(rng.integers(5, 11) * a + rng.uniform(0, 2 * np.pi)) for a in angles)
    white = _ellipsoid(coords, centre, radii * rng.uniform(0.55, 0.65)) < 1 + folds
    volume[brain & white] = 0.8
    offset = rng.uniform(0.08, 0.14)
    for side in (-1, 1):
        ventricle = centre + np.array([side * offset, rng.normal(0.05, 0.02), rng.normal(0.05, 0.02)])
        vradii = np.array([0.06, 0.25, 0.12]) * (1 + rng.normal(0, 0.1, 3))
        volume[_ellipsoid(coords, ventricle, vradii) < 1] = 0.15
    bias = 1 + 0.05 * sum(rng.normal() * coords[i] for i in range(3))
    volume = volume * bias + rng.normal(0, noise, shape)
    return np.clip(volume, 0, 1).astype(np.float32)


class SyntheticBrains(Dataset):
    """``count`` SYNTHETIC volumes; volume ``i`` is generated on access from the seed ``(seed, split, i)``."""

    def __init__(self, count: int, shape: tuple[int, int, int], seed: int, split: int, noise: float) -> None:
        self.count, self.shape, self.seed, self.split, self.noise = count, shape, seed, split, noise

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict:
        rng = np.random.default_rng([self.seed, self.split, index])
        volume = torch.from_numpy(synthetic_brain(self.shape, rng, self.noise))[None]
        return {"input": volume, "id": f"synthetic_brain_{'tvs'[self.split]}{index:04d}"}


def build_synthetic_brain(cfg: dict, seed: int = 0, skip_bad: bool = False) -> DataBundle:
    """SYNTHETIC brain-like volumes, unlabelled: samples ``{"input": (1, H, W, D) float32 in [0, 1], "id": str}``.

    Keys: ``size`` (H, W, D; default [64, 96, 64]; the diffusion stages need multiples of their patch size),
    ``num_samples`` (volumes per split; default 24/4/4), ``seed`` (data seed, default: the run seed), ``noise``
    (standard deviation of the Gaussian noise, default 0.03). Deterministic; ``skip_bad`` has nothing to skip.
    """
    check_keys(cfg, KEYS, NAME)
    size = cfg.get("size", list(DEFAULT_SIZE))
    if not (isinstance(size, (list, tuple)) and len(size) == 3 and
            all(isinstance(n, int) and not isinstance(n, bool) and n >= 8 for n in size)):
        raise UserError(f"data.size must be three integers >= 8 (H, W, D), got {size!r}")
    noise = number(cfg, "noise", 0.03, 0, 1, NAME)
    sizes = split_sizes(cfg.get("num_samples"), DEFAULT_SIZES)
    data_seed = integer(cfg, "seed", seed, 0, 2**32 - 1, NAME)
    shape = tuple(size)
    parts = [SyntheticBrains(sizes[split], shape, data_seed, i, noise) for i, split in enumerate(SPLITS)]
    task = TaskInfo(UNLABELLED, "volume3d", 0, (1, *shape), synthetic=True)
    return DataBundle(*parts, task, preprocessing=Preprocessing.of(NAME, task))
