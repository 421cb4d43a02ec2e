"""Training augmentation of the paper (§3.1), written as small torch ops.

* 2D images: random rotation within +-``max_degrees`` (45) and a vertical flip with p = 0.5.
* 3D volumes: a flip along every spatial axis, each with p = 0.5.
* Feature bags: none; optional random instance subsampling lives in :mod:`medattn.data.bags`.

All randomness comes from torch's global RNG (``torch.rand``), which the engine seeds per epoch and
DataLoader worker, so an augmented epoch is reproducible. MONAI's ``RandRotate``/``RandFlip`` would do
the same, but importing ``monai.transforms`` took about 8 s on the 2-core CI machine (torch itself
about 4 s) and its randomness comes from NumPy ``RandomState`` objects, not from torch's seeding; these
two transforms are a few lines of torch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


class RandomRotateFlip2d:
    """(C, H, W) -> (C, H, W): rotate by an angle uniform in [-max_degrees, max_degrees], then flip
    upside down (along H) with probability ``p_vflip``. Bilinear; corners outside the image become 0,
    so apply it before intensity normalisation (0 = black)."""

    def __init__(self, max_degrees: float = 45.0, p_vflip: float = 0.5) -> None:
        if max_degrees < 0 or not 0 <= p_vflip <= 1:
            raise ValueError(f"need max_degrees >= 0 and 0 <= p_vflip <= 1, got {max_degrees}, {p_vflip}")
        self.max_degrees = max_degrees
        self.p_vflip = p_vflip

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        if image.ndim != 3:
            raise ValueError(f"expected an image (C, H, W), got {tuple(image.shape)}")
        angle = math.radians(float(torch.rand(())) * 2 * self.max_degrees - self.max_degrees)
        flip = float(torch.rand(())) < self.p_vflip
        if angle != 0.0:
            image = rotate2d(image, angle)
        return image.flip(-2) if flip else image


def rotate2d(image: torch.Tensor, angle: float) -> torch.Tensor:
    """Rotate (C, H, W) by ``angle`` radians about the centre, keeping the size (bilinear, zero fill)."""
    _, H, W = image.shape
    cos, sin = math.cos(angle), math.sin(angle)
    # affine_grid works in coordinates normalised to [-1, 1] per axis: undo the aspect ratio.
    theta = torch.tensor([[cos, -sin * H / W, 0.0], [sin * W / H, cos, 0.0]], dtype=torch.float32)
    grid = F.affine_grid(theta[None], [1, *image.shape], align_corners=False)  # (1, H, W, 2)
    out = F.grid_sample(image[None].float(), grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return out[0].to(image.dtype)


class RandomFlip3d:
    """(C, H, W, D) -> (C, H, W, D): flip along each spatial axis independently with probability ``p``."""

    def __init__(self, p: float = 0.5) -> None:
        if not 0 <= p <= 1:
            raise ValueError(f"p must be in [0, 1], got {p}")
        self.p = p

    def __call__(self, volume: torch.Tensor) -> torch.Tensor:
        if volume.ndim != 4:
            raise ValueError(f"expected a volume (C, H, W, D), got {tuple(volume.shape)}")
        axes = [axis for axis, u in zip((1, 2, 3), torch.rand(3).tolist()) if u < self.p]
        return volume.flip(axes) if axes else volume
