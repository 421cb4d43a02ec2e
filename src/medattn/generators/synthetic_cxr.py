"""Synthetic chest-radiograph phantom (built-in benchmark; not real data).

Each synthetic image is a frontal chest-radiograph phantom drawn in normalised coordinates, so it
renders at any resolution: body soft tissue, two dark lung fields whose outer edges span the thorax
width, a bright heart overlapping them, curved ribs, the spine, low-frequency and pixel noise, and a
random gamma. The label is cardiomegaly: cardiothoracic ratio CTR = heart width / thorax width > 0.5,
the rule the VinDr-CXR cardiomegaly label encodes.

Deciding the label needs long-range context: the thorax width varies from image to image
(0.55 to 0.85 of the image width), so the heart's width alone does not give the answer; the model has
to compare it with the lung edges at the far sides of the image. CTR is drawn uniformly from
[0.35, 0.47] (negative) or [0.53, 0.65] (positive) with probability 1/2 each; the band within 0.03 of the
threshold is left out so that labels are unambiguous at 64 x 64.
"""

from __future__ import annotations

from functools import partial

import torch

from ..data.base import DataBundle, TaskInfo
from ..data.options import SPLITS, check_keys, flag, integer, number, split_sizes
from ..data.preprocessing import Preprocessing
from ..data.seeded import SyntheticDataset, item_generator
from ..data.transforms import augment_level, build_augmentation
from ..errors import UserError

NAME = "synthetic_cxr"
CTR_NEGATIVE = (0.35, 0.47)
CTR_POSITIVE = (0.53, 0.65)
KEYS = frozenset({"image_size", "num_samples", "in_chans", "seed", "augment", "mean", "std", "cache"})
DEFAULT_SIZES = {"train": 256, "val": 128, "test": 128}


def _uniform(gen: torch.Generator, low: float, high: float) -> float:
    return low + (high - low) * float(torch.rand((), generator=gen))


def _ellipse(x: torch.Tensor, y: torch.Tensor, cx: float, cy: float, ax: float, ay: float, edge: float):
    """Soft indicator of an axis-aligned ellipse: ~1 inside, ~0 outside, ``edge`` wide transition."""
    r = torch.sqrt(((x - cx) / ax) ** 2 + ((y - cy) / ay) ** 2)
    return torch.sigmoid((1.0 - r) * min(ax, ay) / edge)


def render_cxr(size: int, gen: torch.Generator) -> tuple[torch.Tensor, float]:
    """Draw one synthetic phantom: -> (image (1, size, size) in [0, 1], cardiothoracic ratio)."""
    positive = float(torch.rand((), generator=gen)) < 0.5
    ctr = _uniform(gen, *(CTR_POSITIVE if positive else CTR_NEGATIVE))
    half_thorax = _uniform(gen, 0.55, 0.85)  # T: half the thorax width, in units of half the image width
    x0, y0 = _uniform(gen, -0.08, 0.08), _uniform(gen, -0.12, 0.02)
    lung_h = _uniform(gen, 0.55, 0.72)
    heart_w = ctr * half_thorax  # half width, so that CTR = heart_w / half_thorax
    heart_h = _uniform(gen, 0.22, 0.32)
    heart_x = x0 + _uniform(gen, 0.05, 0.15) * half_thorax  # shifted to the patient's left (image right)
    heart_y = y0 + lung_h * _uniform(gen, 0.4, 0.55)

    coords = (torch.arange(size, dtype=torch.float32) + 0.5) / size * 2 - 1
    y, x = torch.meshgrid(coords, coords, indexing="ij")  # (size, size), y down, x right
    edge = 1.5 * 2 / size  # transitions about 1.5 pixels wide
    body = _ellipse(x, y, x0, y0 + 0.15, half_thorax + 0.14, 1.15, edge)
    lungs = torch.maximum(
        _ellipse(x, y, x0 - half_thorax / 2, y0, half_thorax / 2, lung_h, edge),
        _ellipse(x, y, x0 + half_thorax / 2, y0, half_thorax / 2, lung_h, edge),
    )
    heart = _ellipse(x, y, heart_x, heart_y, heart_w, heart_h, edge)
    image = 0.05 + 0.4 * body - 0.28 * lungs
    n_ribs = int(torch.randint(7, 10, (), generator=gen))
    rib_width = _uniform(gen, 0.025, 0.04)
    inside = torch.sigmoid((half_thorax + 0.05 - (x - x0).abs()) / edge) * body
    for k in range(n_ribs):
        rib_y = y0 - lung_h + (k + 0.5) * 2 * lung_h / n_ribs + 0.12 * ((x - x0) / half_thorax) ** 2
        image = image + 0.1 * inside * torch.sigmoid((rib_width - (y - rib_y).abs()) / edge)
    image = image * (1 - heart) + (0.62 + _uniform(gen, -0.04, 0.04)) * heart
    image = image + 0.12 * torch.sigmoid((0.05 - (x - x0).abs()) / edge) * body  # spine
    lowfreq = torch.nn.functional.interpolate(torch.randn(1, 1, 6, 6, generator=gen), size=(size, size),
                                              mode="bicubic", align_corners=False)[0, 0]
    image = image + 0.04 * lowfreq + 0.03 * torch.randn(size, size, generator=gen)
    image = image.clamp(0, 1) ** _uniform(gen, 0.8, 1.25)
    return image[None], ctr


def make_sample(size: int, seed: int, split: str, index: int) -> dict:
    """Sample ``index`` of ``split``: the [0, 1] phantom (1, size, size) and its label."""
    image, ctr = render_cxr(size, item_generator(NAME, seed, split, index))
    sample_id = f"{NAME}-{split}-{index:06d}"
    return {"input": image, "label": torch.tensor([float(ctr > 0.5)]), "id": sample_id, "patient": sample_id}


def finish_sample(transform, mean: float, std: float, in_chans: int, sample: dict) -> dict:
    """Per access: augment (training), normalise, repeat to ``in_chans``."""
    image = sample["input"] if transform is None else transform(sample["input"])
    return {**sample, "input": ((image - mean) / std).expand(in_chans, -1, -1).contiguous()}


def build_synthetic_cxr(cfg: dict, seed: int = 0, skip_bad: bool = False) -> DataBundle:
    """Synthetic chest-radiograph cardiomegaly benchmark (binary).

    Keys: ``image_size`` (int, default 64), ``num_samples`` (per split; default 256/128/128),
    ``in_chans`` (1 or 3, default 1; the gray image is repeated), ``seed`` (data seed, default: the run
    seed), ``augment`` (default "strong": rotation, flip, crops, elastic and intensity transforms; true:
    rotation and flip only; false: none; see :func:`~medattn.data.transforms.build_augmentation`), ``mean``/``std``
    (normalisation of the [0, 1] image, default 0.5/0.5), ``cache`` (default true: keep rendered
    images in memory, about 16 KB each at 64 x 64). ``skip_bad`` has nothing to skip.
    """
    check_keys(cfg, KEYS, NAME)
    size = integer(cfg, "image_size", 64, 16, 4096, NAME)
    in_chans = integer(cfg, "in_chans", 1, 1, 3, NAME)
    data_seed = integer(cfg, "seed", seed, 0, 2**32 - 1, NAME)
    mean, std = number(cfg, "mean", 0.5, -1e6, 1e6, NAME), number(cfg, "std", 0.5, 1e-6, 1e6, NAME)
    if size < 16 or in_chans not in (1, 3) or std <= 0:
        raise UserError(f"{NAME}: need image_size >= 16, in_chans 1 or 3 and std > 0; "
                         f"got {size}, {in_chans}, {std}")
    sizes = split_sizes(cfg.get("num_samples"), DEFAULT_SIZES)
    level, chosen = augment_level(cfg, 2)
    augment = build_augmentation(level, 2)
    cache = flag(cfg, "cache", True, NAME)

    datasets = {s: SyntheticDataset(sizes[s], partial(make_sample, size, data_seed, s),
                                    partial(finish_sample, augment if s == "train" else None, mean, std, in_chans),
                                    cache) for s in SPLITS}
    task = TaskInfo("binary", "image2d", 1, (in_chans, size, size), ["cardiomegaly"], synthetic=True)
    return DataBundle(datasets["train"], datasets["val"], datasets["test"], task, defaults=chosen,
                      preprocessing=Preprocessing.of(NAME, task, mean=[mean] * in_chans, std=[std] * in_chans))
