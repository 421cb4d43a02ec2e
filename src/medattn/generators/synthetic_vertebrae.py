"""A synthetic 3D labelling task that needs non-local context, in the spirit of vertebra labelling.

Each volume holds a column of ``num_blobs`` near-identical ellipsoidal blobs along the last axis (D),
at a random start, with random spacing and small jitter of centre, radii and brightness, in Gaussian
noise. Voxels of the k-th blob from the top (smallest D) are labelled k (1..num_blobs), background 0.
Since the blobs look alike and the column's start varies by more than one spacing, a voxel's label is
fixed only by how many blobs lie above it: the task needs context along the whole column.
Samples are deterministic functions of ``(seed, index)``. :func:`build_synthetic_vertebrae` is the data
kind ``synthetic_vertebrae`` (a segmentation task for ``medattn train``).
"""

from __future__ import annotations

from functools import partial

import torch
from torch.utils.data import Dataset

from ..data.base import DataBundle, TaskInfo
from ..data.options import SPLITS, check_keys, flag, int_tuple, integer, number, split_sizes
from ..data.preprocessing import Preprocessing
from ..data.seeded import SyntheticDataset, item_seed
from ..errors import UserError

NAME = "synthetic_vertebrae"
KEYS = frozenset({"volume_size", "num_blobs", "num_samples", "noise", "seed", "cache"})
DEFAULT_SIZES = {"train": 64, "val": 16, "test": 16}
SPACING = (8.0, 10.0)  # range of the distance between blob centres along D, voxels
RADIUS = (4.0, 4.0, 2.8)  # blob radii along H, W, D before a +-10 % jitter, voxels


def make_vertebrae(seed: int, size: tuple[int, int, int] = (16, 16, 64), num_blobs: int = 4,
                   spacing: tuple[float, float] = SPACING, radius: tuple[float, float, float] = RADIUS,
                   noise: float = 0.15) -> tuple[torch.Tensor, torch.Tensor]:
    """One sample: image (1, H, W, D) float32 and label (H, W, D) int64 in [0, num_blobs]."""
    height, width, depth = size
    if num_blobs < 1 or min(size) < 1:
        raise ValueError(f"need num_blobs >= 1 and a positive size, got {num_blobs} and {size}")
    gen = torch.Generator().manual_seed(seed)

    def uniform(low: float, high: float, n: int = 1) -> torch.Tensor:
        return low + (high - low) * torch.rand(n, generator=gen, dtype=torch.float64)

    step = uniform(*spacing).item()
    length = step * (num_blobs - 1) + 2 * radius[2] + 2
    if length > depth:
        raise ValueError(f"a column of {num_blobs} blobs {step:.1f} apart does not fit into depth {depth}")
    start = radius[2] + 1 + uniform(0, depth - length).item()
    grid = torch.stack(torch.meshgrid(*[torch.arange(n, dtype=torch.float64) for n in size], indexing="ij"))
    image = torch.zeros(size, dtype=torch.float64)
    label = torch.zeros(size, dtype=torch.int64)
    for k in range(num_blobs):
        centre = torch.tensor([(height - 1) / 2, (width - 1) / 2, start + k * step], dtype=torch.float64)
        centre[:2] += uniform(-1.0, 1.0, 2)
        radii = torch.tensor(radius, dtype=torch.float64) * uniform(0.9, 1.1, 3)
        distance = (((grid - centre.view(3, 1, 1, 1)) / radii.view(3, 1, 1, 1)) ** 2).sum(0)
        inside = distance <= 1
        image[inside] = uniform(0.9, 1.1).item()
        label[inside] = k + 1
    image += noise * torch.randn(size, generator=gen, dtype=torch.float64)
    return image.float().unsqueeze(0), label


class SyntheticVertebrae(Dataset):
    """``length`` samples of :func:`make_vertebrae`; item i uses ``item_seed("synthetic_vertebrae", seed,
    split, i)``, so splits never share a sample. ``num_classes`` is ``num_blobs + 1`` (background included).
    Items: (image (1, H, W, D) float32, label (H, W, D) int64); ``kwargs`` go to :func:`make_vertebrae`.
    """

    def __init__(self, length: int, seed: int = 0, split: str = "train", **kwargs) -> None:
        if length < 1:
            raise ValueError(f"length must be positive, got {length}")
        self.length, self.seed, self.split, self.kwargs = length, seed, split, kwargs
        self.num_classes = kwargs.get("num_blobs", 4) + 1

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self.length:
            raise IndexError(index)
        return make_vertebrae(item_seed(NAME, self.seed, self.split, index), **self.kwargs)


def make_sample(seed: int, split: str, index: int, **kwargs) -> dict:
    """Sample ``index`` of ``split`` in the sample-dict contract (:mod:`medattn.data.base`)."""
    image, label = make_vertebrae(item_seed(NAME, seed, split, index), **kwargs)
    sample_id = f"{NAME}-{split}-{index:06d}"
    return {"input": image, "label": label, "id": sample_id, "patient": sample_id}


def build_synthetic_vertebrae(cfg: dict, seed: int = 0, skip_bad: bool = False) -> DataBundle:
    """Synthetic vertebra-labelling segmentation benchmark (SYNTHETIC, not real data).

    Keys: ``volume_size`` (H, W, D; default [16, 16, 64]), ``num_blobs`` (default 4; classes are
    background + one per blob), ``num_samples`` (per split; default 64/16/16), ``noise`` (default
    0.15), ``seed`` (data seed, default: the run seed), ``cache`` (default true). No augmentation: a
    flip along D would reverse the labelling order. ``skip_bad`` has nothing to skip. Item i of a
    split is the same as ``SyntheticVertebrae(n, seed, split)[i]``.
    """
    check_keys(cfg, KEYS, NAME)
    size = int_tuple(cfg.get("volume_size", (16, 16, 64)), 3, f"{NAME}.volume_size")
    num_blobs = cfg.get("num_blobs", 4)
    if not isinstance(num_blobs, int) or isinstance(num_blobs, bool) or num_blobs < 1:
        raise UserError(f"{NAME}.num_blobs must be a positive int, got {num_blobs!r}")
    noise = number(cfg, "noise", 0.15, 0, 10, NAME)  # in units of the phantom's intensities (0 to 1)
    longest = SPACING[1] * (num_blobs - 1) + 2 * RADIUS[2] + 2  # as make_vertebrae's check, widest spacing
    if longest > size[2]:
        raise UserError(f"{NAME}: a column of {num_blobs} blobs needs a depth (volume_size[2]) of at least "
                        f"{longest:.0f}, got {size[2]}")
    kwargs = dict(size=size, num_blobs=num_blobs, noise=float(noise))
    data_seed = integer(cfg, "seed", seed, 0, 2**32 - 1, NAME)
    sizes = split_sizes(cfg.get("num_samples"), DEFAULT_SIZES)
    datasets = {s: SyntheticDataset(sizes[s], partial(make_sample, data_seed, s, **kwargs),
                                    cache=flag(cfg, "cache", True, NAME)) for s in SPLITS}
    names = ["background", *[f"blob{k}" for k in range(1, num_blobs + 1)]]
    task = TaskInfo("segmentation", "volume3d", num_blobs + 1, (1, *size), names, synthetic=True)
    return DataBundle(datasets["train"], datasets["val"], datasets["test"], task,  # volumes as rendered
                      preprocessing=Preprocessing.of(NAME, task, normalize="none"))
