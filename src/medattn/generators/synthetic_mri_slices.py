"""A synthetic abdominal-MRI-like 2D segmentation task: 3D phantoms cut into slices (SYNTHETIC, not real data).

Each patient is a volume (H, W, D) (D along the body) holding, in Gaussian noise under a smooth bias field:
a body ellipse with a bright fat rim and soft tissue, a dark vertebral column (no label, a distractor
with the kidneys' brightness), and five labelled structures of very different sizes::

    1 liver         large, on the image's left; 2 spleen   medium, on the right
    3 kidney_left   4 kidney_right: the same size and brightness, told apart only by their position
                    (left or right of the body's midline, which moves a little from patient to patient)
    5 lesion        small bright sphere (radius 2-3 voxels) inside the liver, in 80 % of patients

Centres, radii (+-10-15 %), intensities, bias field and noise vary per patient; the organs span the
middle of D, so the first and last slices are empty. A patient is a deterministic function of
``(seed, split, index)``; splits never share a patient. :func:`build_synthetic_mri_slices` is the data kind
``synthetic_mri_slices``: slices along ``axis`` as :mod:`medattn.data.kinds.slices` plans them.
"""

from __future__ import annotations

import torch

from ..data.base import DataBundle, TaskInfo
from ..data.kinds.slices import SLICE_KEYS, compact, load_all, slice_options, slice_splits
from ..data.options import SPLITS, check_keys, flag, int_tuple, integer, number, split_sizes
from ..data.preprocessing import Preprocessing
from ..data.seeded import item_seed
from ..errors import UserError

NAME = "synthetic_mri_slices"
KEYS = frozenset({"volume_size", "num_patients", "noise", "seed"}) | SLICE_KEYS
CLASSES = ["background", "liver", "spleen", "kidney_left", "kidney_right", "lesion"]
DEFAULT_PATIENTS = {"train": 24, "val": 6, "test": 12}
# structure -> (centre (H, W, D) as fractions of the size, radii as fractions, intensity); H runs anterior to
# posterior, W the image's left to right
ORGANS = {
    "liver": ((0.45, 0.33, 0.45), (0.20, 0.17, 0.30), 0.30),
    "spleen": ((0.42, 0.72, 0.42), (0.09, 0.08, 0.18), 0.60),
    "kidney_left": ((0.66, 0.34, 0.58), (0.08, 0.06, 0.17), 0.75),
    "kidney_right": ((0.66, 0.66, 0.58), (0.08, 0.06, 0.17), 0.75),
}
SPINE = ((0.78, 0.50), (0.07, 0.07), 0.75)  # centre, radii in-plane (runs along all of D), intensity


def make_phantom(seed: int, size: tuple[int, int, int] = (64, 64, 32),
                 noise: float = 0.06) -> tuple[torch.Tensor, torch.Tensor]:
    """One patient: image (H, W, D) float32 and label (H, W, D) int64 in [0, 5] (module docstring)."""
    if min(size) < 8:
        raise ValueError(f"the phantom needs at least 8 voxels per axis, got {size}")
    gen = torch.Generator().manual_seed(seed)

    def uniform(low: float, high: float, n: int = 1) -> torch.Tensor:
        return low + (high - low) * torch.rand(n, generator=gen, dtype=torch.float64)

    extent = torch.tensor(size, dtype=torch.float64)
    grid = torch.stack(torch.meshgrid(*[torch.arange(n, dtype=torch.float64) for n in size], indexing="ij"))
    shift = torch.cat([uniform(-0.06, 0.06, 2), torch.zeros(1, dtype=torch.float64)])  # body position in-plane

    def ellipsoid(centre, radii) -> torch.Tensor:
        c = (torch.tensor(centre, dtype=torch.float64) + shift) * extent
        r = torch.tensor(radii, dtype=torch.float64) * extent
        return (((grid - c.view(3, 1, 1, 1)) / r.view(3, 1, 1, 1)) ** 2).sum(0) <= 1

    image = torch.zeros(size, dtype=torch.float64)
    label = torch.zeros(size, dtype=torch.int64)
    body_radii = (0.40 * uniform(0.92, 1.05).item(), 0.44 * uniform(0.92, 1.05).item(), 10.0)
    body = ellipsoid((0.5, 0.5, 0.5), body_radii)
    inner = ellipsoid((0.5, 0.5, 0.5), (body_radii[0] - 0.05, body_radii[1] - 0.05, 10.0))
    image[body] = 0.85 * uniform(0.9, 1.1).item()  # fat rim
    image[inner] = 0.45 * uniform(0.9, 1.1).item()  # soft tissue
    (sh, sw), (rh, rw), level = SPINE
    image[ellipsoid((sh, sw, 0.5), (rh, rw, 10.0))] = level * uniform(0.9, 1.1).item()
    for k, (centre, radii, level) in enumerate(ORGANS.values(), start=1):
        centre = [c + d for c, d in zip(centre, uniform(-0.03, 0.03, 3).tolist())]
        radii = [r * f for r, f in zip(radii, uniform(0.88, 1.12, 3).tolist())]
        inside = ellipsoid(centre, radii) & inner
        image[inside] = level * uniform(0.92, 1.08).item()
        label[inside] = k
        if k == 1 and uniform(0, 1).item() < 0.8:  # a lesion inside the liver
            liver_centre = torch.tensor(centre) + shift
            offset = uniform(-0.4, 0.4, 3) * torch.tensor(radii, dtype=torch.float64)
            where = (liver_centre + offset / 2) * extent
            radius = uniform(2.0, 3.2).item()
            sphere = ((grid - where.view(3, 1, 1, 1)) ** 2).sum(0) <= radius**2
            lesion = sphere & inside
            image[lesion] = 0.70 * uniform(0.92, 1.08).item()
            label[lesion] = 5
    direction = torch.nn.functional.normalize(torch.randn(3, generator=gen, dtype=torch.float64), dim=0)
    coords = (grid - (extent.view(3, 1, 1, 1) - 1) / 2) / extent.view(3, 1, 1, 1)
    bias = 1 + 0.25 * (direction.view(3, 1, 1, 1) * coords).sum(0)  # smooth multiplicative field
    image = image * bias + noise * torch.randn(size, generator=gen, dtype=torch.float64)
    return image.float(), label


class Phantoms:
    """v -> :func:`make_phantom` of patient v of ``split``, normalised (z-score over the volume)."""

    def __init__(self, seed: int, split: str, size: tuple[int, int, int], noise: float) -> None:
        self.seed, self.split, self.size, self.noise = seed, split, size, noise

    def __call__(self, v: int) -> tuple[torch.Tensor, torch.Tensor]:
        image, label = make_phantom(item_seed(NAME, self.seed, self.split, v), self.size, self.noise)
        return (image - image.mean()) / image.std().clamp_min(1e-6), compact(label)


def build_synthetic_mri_slices(cfg: dict, seed: int = 0, skip_bad: bool = False) -> DataBundle:
    """Synthetic multi-structure MRI-like 2D segmentation (SYNTHETIC): slices of :func:`make_phantom` volumes.

    Keys: ``volume_size`` (H, W, D; default [64, 64, 32]; slices along ``axis`` 2 are H x W),
    ``num_patients`` (per split; default 24/6/12), ``noise`` (default 0.06), ``seed`` (data seed, default:
    the run seed), and the slice keys of :mod:`medattn.data.kinds.slices` (``axis``, ``slice_stride``,
    ``empty_fraction``, ``eval_empty_fraction``, ``cache``; ``slice_size`` must be left out: it is the
    volume's in-plane size). No augmentation: a left-right flip would swap the kidneys' labels.
    """
    check_keys(cfg, KEYS, NAME)
    if "slice_size" in cfg:
        raise UserError(f"{NAME}.slice_size: the slices have the volume's in-plane size; set volume_size instead")
    size = int_tuple(cfg.get("volume_size", (64, 64, 32)), 3, f"{NAME}.volume_size")
    if min(size) < 8:
        raise UserError(f"{NAME}.volume_size needs at least 8 voxels per axis, got {list(size)}")
    noise = number(cfg, "noise", 0.06, 0, 10, NAME)  # in units of the phantom's intensities (0 to 1)
    axis = cfg.get("axis", 2)
    plane = tuple(n for i, n in enumerate(size) if i != axis) if axis in (0, 1, 2) else (1, 1)
    options = slice_options(cfg, NAME, plane)
    data_seed = integer(cfg, "seed", seed, 0, 2**32 - 1, NAME)
    counts = split_sizes(cfg.get("num_patients"), DEFAULT_PATIENTS)
    volumes = {}
    for split in SPLITS:
        load = Phantoms(data_seed, split, size, float(noise))
        kept, flags, store = load_all(load, counts[split], options.axis, flag(cfg, "cache", True, NAME))
        ids = [f"{NAME}-{split}-{v:04d}" for v in kept]
        volumes[split] = (load, ids, ids, flags, store)
    datasets = slice_splits(volumes, options, data_seed)
    task = TaskInfo("segmentation", "image2d", len(CLASSES), (1, *options.size), list(CLASSES), synthetic=True)
    return DataBundle(datasets["train"], datasets["val"], datasets["test"], task,  # Phantoms z-score each volume
                      preprocessing=Preprocessing.of(NAME, task, normalize="zscore", slice_axis=options.axis))
