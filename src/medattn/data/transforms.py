"""Training augmentation of the paper (§3.1), written as small torch ops.

* 2D images: random rotation within +-``max_degrees`` (45) and a vertical flip with p = 0.5.
* 3D volumes: a flip along every spatial axis, each with p = 0.5.
* Feature bags: none; optional random instance subsampling lives in :mod:`medattn.data.kinds.bags`.

``augment: strong`` (the small-data recipe, issue 10; :func:`build_augmentation`) adds, after the
paper's transforms: a random resized crop, nnU-Net's intensity transforms and a smooth elastic
deformation, for 2D images and 3D volumes alike (defaults and their sources in each class). It is the
default (:data:`DEFAULT_AUGMENT`) of the volume classification kinds: on the SYNTHETIC breast-MRI volumes it
raised the CNN baseline and, with the small presets' convolutional stem, the ViTs (docs/small_data.md, "The
small-data recipe"). 2D image kinds default to the paper's transforms (``augment: true``): on the realistic
brain-MRI slices the strong recipe cost the ResNet 0.08 AUROC (docs/realistic.md).

All randomness comes from torch's global RNG (``torch.rand``), which the training loop
(:mod:`medattn.train.loop`) seeds per epoch and DataLoader worker, so an augmented epoch is reproducible.
MONAI's ``RandRotate``/``RandFlip`` would do the same, but importing ``monai.transforms`` took about 8 s
on the 2-core CI machine (torch itself about 4 s) and its randomness comes from NumPy ``RandomState``
objects, not from torch's seeding; these transforms are a few lines of torch each
(``grid_sample``/``interpolate``), the same in 2D and 3D.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from medattn.errors import UserError


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


class Compose:
    """Apply transforms in order: (C, *spatial) -> (C, *spatial)."""

    def __init__(self, *transforms) -> None:
        self.transforms = transforms

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for transform in self.transforms:
            x = transform(x)
        return x


def _uniform(low: float, high: float) -> float:
    return low + (high - low) * float(torch.rand(()))


def _check_spatial(x: torch.Tensor) -> int:
    if x.ndim not in (3, 4):
        raise ValueError(f"expected an image (C, H, W) or a volume (C, H, W, D), got {tuple(x.shape)}")
    return x.ndim - 1


def _resample(x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """Sample (C, *spatial) at ``grid`` (1, *spatial, dims) in normalised [-1, 1] coordinates, (x=last axis
    first, as ``grid_sample`` wants); bilinear/trilinear, border values repeated."""
    out = F.grid_sample(x[None].float(), grid, mode="bilinear", padding_mode="border", align_corners=False)
    return out[0].to(x.dtype)


def _identity_grid(shape: tuple[int, ...]) -> torch.Tensor:
    """(1, *shape, dims): the identity sampling grid of ``grid_sample`` for a (C, *shape) input."""
    dims = len(shape)
    theta = torch.eye(dims, dims + 1)[None]  # (1, dims, dims + 1)
    return F.affine_grid(theta, [1, 1, *shape], align_corners=False)


class RandomResizedCrop:
    """(C, *spatial) -> (C, *spatial): crop a random box covering a fraction ``scale`` of the area
    (volume) with an aspect ratio log-uniform in ``ratio`` (2D: H/W; 3D: H/W, depth kept in proportion),
    then resize it back to the input size (bilinear / trilinear). ``scale`` defaults to (0.7, 1.0), not
    the ImageNet (0.08, 1.0) of Szegedy et al. 2015: a crop that cuts the finding out keeps its label,
    and findings in medical images are often small or near the border."""

    def __init__(self, scale: tuple[float, float] = (0.7, 1.0), ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> None:
        if not 0 < scale[0] <= scale[1] <= 1 or not 0 < ratio[0] <= ratio[1]:
            raise ValueError(f"need 0 < scale[0] <= scale[1] <= 1 and 0 < ratio[0] <= ratio[1], got {scale}, {ratio}")
        self.scale, self.ratio = scale, ratio

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        dims = _check_spatial(x)
        area = _uniform(*self.scale)
        aspect = math.exp(_uniform(math.log(self.ratio[0]), math.log(self.ratio[1])))
        # fractions of each axis: prod(f) = area, f_H / f_W = aspect, clipped to 1 (then the area is smaller)
        side = area ** (1 / dims)
        fractions = [side * math.sqrt(aspect), side / math.sqrt(aspect), side][:dims]
        fractions = [min(1.0, f) for f in fractions]
        centres = [_uniform(-(1 - f), 1 - f) for f in fractions]  # normalised [-1, 1] coordinates
        theta = torch.zeros(1, dims, dims + 1)
        for axis, (f, c) in enumerate(zip(fractions, centres)):
            row = dims - 1 - axis  # grid_sample's coordinates run from the last axis to the first
            theta[0, row, row], theta[0, row, dims] = f, c
        grid = F.affine_grid(theta, [1, 1, *x.shape[1:]], align_corners=False)
        return _resample(x, grid)


class RandomIntensity:
    """(C, *spatial) -> (C, *spatial): nnU-Net's intensity augmentation (Isensee et al. 2021), each with
    its own probability: multiplicative brightness x U(0.75, 1.25) (p 0.15), contrast about the mean
    x U(0.75, 1.25) clipped to the input's range (p 0.15), gamma U(0.7, 1.5) on the min-max normalised
    input (p 0.3), Gaussian noise with variance U(0, 0.1) times the input's variance (p 0.1). Works on
    any intensity scale (0-1 images or z-scored volumes)."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        _check_spatial(x)
        x = x.float()
        if float(torch.rand(())) < 0.15:
            x = x * _uniform(0.75, 1.25)
        if float(torch.rand(())) < 0.15:
            low, high, mean = x.min(), x.max(), x.mean()
            x = ((x - mean) * _uniform(0.75, 1.25) + mean).clamp(low, high)
        if float(torch.rand(())) < 0.3:
            low, span = x.min(), (x.max() - x.min()).clamp_min(1e-8)
            x = low + span * ((x - low) / span) ** _uniform(0.7, 1.5)
        if float(torch.rand(())) < 0.1:
            x = x + torch.randn(x.shape) * math.sqrt(_uniform(0.0, 0.1) * float(x.var()))
        return x


class RandomElastic:
    """(C, *spatial) -> (C, *spatial) with probability ``p``: a smooth random deformation. Displacements
    drawn N(0, ``magnitude``^2) (in units of the half extent of each axis, the [-1, 1] grid) on a coarse
    grid of ``control_points`` per axis, upsampled bicubic (2D) / trilinear (3D), added to the identity
    sampling grid; bilinear resampling, border values repeated. Defaults: p 0.2 (nnU-Net's probability of
    its elastic deformation), magnitude 0.03 (about 1.5% of the extent: a 64-pixel image moves by about a
    pixel, anatomy bends but keeps its layout), 4 control points."""

    def __init__(self, p: float = 0.2, magnitude: float = 0.03, control_points: int = 4) -> None:
        if not 0 <= p <= 1 or magnitude < 0 or control_points < 2:
            raise ValueError(f"need 0 <= p <= 1, magnitude >= 0, control_points >= 2; got {p}, {magnitude}, "
                             f"{control_points}")
        self.p, self.magnitude, self.control_points = p, magnitude, control_points

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        dims = _check_spatial(x)
        if float(torch.rand(())) >= self.p:
            return x
        shape = tuple(x.shape[1:])
        coarse = torch.randn(1, dims, *(self.control_points,) * dims) * self.magnitude  # (1, dims, *control)
        mode = "bicubic" if dims == 2 else "trilinear"
        field = F.interpolate(coarse, size=shape, mode=mode, align_corners=True)  # (1, dims, *shape)
        return _resample(x, _identity_grid(shape) + field.movedim(1, -1))


#: ``augment`` of the image (2) and volume (3) classification kinds when the config gives none: the paper's
#: rotation and flip for 2D images, the strong recipe for 3D volumes. Strong augmentation lifted every model on
#: the SYNTHETIC breast-MRI volumes, but on the realistic brain-MRI slices (real anatomy) it cost the ResNet 0.08
#: AUROC and the ViTs nothing (3 seeds, docs/realistic.md): a default that hurts real anatomy loses.
DEFAULT_AUGMENT: dict[int, bool | str] = {2: True, 3: "strong"}
#: What :func:`build_augmentation` returns: (C, *spatial) -> (C, *spatial).
Augmentation = Callable[[torch.Tensor], torch.Tensor]


def augment_level(cfg: dict, spatial_dims: int) -> tuple[bool | str, dict]:
    """A data config's ``augment`` value and, when the config gives none, the default for ``spatial_dims``
    (:data:`DEFAULT_AUGMENT`) with ``{"data.augment": value}`` for :attr:`DataBundle.defaults
    <medattn.data.base.DataBundle>`."""
    if "augment" in cfg:
        return cfg["augment"], {}
    return DEFAULT_AUGMENT[spatial_dims], {"data.augment": DEFAULT_AUGMENT[spatial_dims]}


def build_augmentation(level: bool | str, spatial_dims: int) -> Augmentation | None:
    """Training augmentation of a data config's ``augment`` value: false/None -> None; true -> the paper's
    (2D rotation +-45 and vertical flip, 3D flips); ``"strong"`` -> the paper's, then
    :class:`RandomResizedCrop`, :class:`RandomElastic`, :class:`RandomIntensity`. Another value is a
    UserError naming ``data.augment``."""
    if level in (None, False):
        return None
    if level is not True and level != "strong":
        raise UserError(f"data.augment must be true, false or 'strong', got {level!r}")
    paper = RandomRotateFlip2d() if spatial_dims == 2 else RandomFlip3d()
    if level is True:
        return paper
    return Compose(paper, RandomResizedCrop(), RandomElastic(), RandomIntensity())
