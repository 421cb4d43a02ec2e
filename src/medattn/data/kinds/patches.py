"""Random patches of segmentation samples for training (the PAM paper trains on 160 x 160 x 96 patches).

:class:`RandomPatches` wraps a segmentation dataset (samples ``"input"`` (C, *S), ``"label"`` (*S) with
S the spatial shape, 2D or 3D) and returns one patch of ``patch_size`` per access, cut at the same place
from image and label. Where the patch is centred:

* with probability ``foreground`` on a foreground voxel, class-balanced: a class is drawn uniformly
  among the foreground classes present in the label (1..K-1), then a voxel of that class uniformly;
* otherwise (and when the label has no foreground) on a voxel drawn uniformly from the whole volume.

This is nnU-Net's foreground oversampling (default 1/3 forced foreground, the rest random) with the
class drawn first, as MONAI's ``RandCropByLabelClasses`` does, so small structures are seen as often as
large ones. ``foreground=0`` gives plain uniform random patches (the PAM paper's "random patches").
The patch's start along each axis is ``clamp(centre - size // 2, 0, S - size)``, so the patch stays
inside the volume and always contains its centre voxel; a volume smaller than the patch along an axis
is first padded on both sides (image with its minimum, label with background 0).

Randomness comes from torch's global RNG, which the training loop (:mod:`medattn.train.loop`) seeds per
epoch and DataLoader worker, so
an epoch's patches are reproducible and a resumed run continues with the same draws. (MONAI's
``RandCropByPosNegLabel`` keeps its own NumPy ``RandomState`` instead, and returns MetaTensors.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from ...errors import UserError

#: Default share of patches centred on a foreground voxel (nnU-Net's oversample_foreground_percent).
FOREGROUND = 1 / 3


def sample_centre(label: torch.Tensor, foreground: float) -> tuple[int, ...]:
    """A voxel index of ``label`` (*S): on a foreground voxel (class drawn uniformly among those present,
    then a voxel of it) with probability ``foreground``, else uniform over all voxels."""
    if torch.rand(()).item() < foreground:
        classes = torch.unique(label)
        classes = classes[classes > 0]
        if len(classes):
            chosen = classes[torch.randint(len(classes), ()).item()]
            voxels = (label == chosen).nonzero()  # (M, len(S))
            return tuple(voxels[torch.randint(len(voxels), ()).item()].tolist())
    return tuple(torch.randint(n, ()).item() for n in label.shape)


def crop_at(image: torch.Tensor, label: torch.Tensor, centre: tuple[int, ...],
            size: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``size`` patch of image (C, *S) and label (*S) around ``centre``, kept inside the volume
    (start = clamp(centre - size // 2, 0, S - size)); needs S >= size along every axis."""
    region = tuple(slice(s, s + m) for s, m in
                   ((min(max(c - m // 2, 0), n - m), m) for c, m, n in zip(centre, size, label.shape)))
    return image[(slice(None), *region)], label[region]


def pad_to(image: torch.Tensor, label: torch.Tensor, size: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad image (C, *S) and label (*S) on both sides to at least ``size`` (image: its minimum, label: 0),
    the extra half voxel after, as :func:`~medattn.data.readers.volumes.crop_or_pad` does."""
    extra = [max(m - n, 0) for n, m in zip(label.shape, size)]
    if not any(extra):
        return image, label
    widths = [w for e in reversed(extra) for w in (e // 2, e - e // 2)]  # F.pad wants the last axis first
    fill = float(image.min()) if image.numel() else 0.0
    return F.pad(image, widths, value=fill), F.pad(label, widths, value=0)


class RandomPatches(Dataset):
    """``dataset``'s samples cut to one random ``patch_size`` patch each (see the module docstring).

    ``dataset[i]`` -> the sample with ``"input"`` (C, *patch_size) and ``"label"`` (*patch_size); other
    entries (id, patient) are kept. ``foreground`` in [0, 1]: the share of patches centred on a
    foreground voxel (None: :data:`FOREGROUND`).
    """

    def __init__(self, dataset: Dataset, patch_size: tuple[int, ...], foreground: float | None = None) -> None:
        foreground = FOREGROUND if foreground is None else foreground
        if not 0 <= foreground <= 1:
            raise UserError(f"train.patch_foreground must be in [0, 1], got {foreground!r}")
        if not patch_size or any(not isinstance(m, int) or m < 1 for m in patch_size):
            raise UserError(f"train.patch_size must be positive ints, got {patch_size!r}")
        self.dataset, self.patch_size, self.foreground = dataset, tuple(patch_size), float(foreground)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict:
        sample = self.dataset[index]
        image, label = sample["input"], sample["label"]
        if label.ndim != len(self.patch_size) or image.ndim != label.ndim + 1:
            raise UserError(f"train.patch_size {list(self.patch_size)} has {len(self.patch_size)} axes; the "
                            f"samples are {tuple(image.shape)} images with {tuple(label.shape)} label maps")
        image, label = pad_to(image, label, self.patch_size)
        image, label = crop_at(image, label, sample_centre(label, self.foreground), self.patch_size)
        return {**sample, "input": image.contiguous(), "label": label.contiguous()}
