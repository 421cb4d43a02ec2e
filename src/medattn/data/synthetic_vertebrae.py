"""A synthetic 3D labelling task that needs non-local context, in the spirit of vertebra labelling.

Each volume holds a column of ``num_blobs`` near-identical ellipsoidal blobs along the last axis (D),
at a random start, with random spacing and small jitter of centre, radii and brightness, in Gaussian
noise. Voxels of the k-th blob from the top (smallest D) are labelled k (1..num_blobs), background 0.
Since the blobs look alike and the column's start varies by more than one spacing, a voxel's label is
fixed only by how many blobs lie above it: the task needs context along the whole column.
Samples are deterministic functions of ``(seed, index)``.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from .synthetic_base import item_seed


def make_vertebrae(seed: int, size: tuple[int, int, int] = (16, 16, 64), num_blobs: int = 4,
                   spacing: tuple[float, float] = (8.0, 10.0),
                   radius: tuple[float, float, float] = (4.0, 4.0, 2.8),
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
        return make_vertebrae(item_seed("synthetic_vertebrae", self.seed, self.split, index), **self.kwargs)
