"""Synthetic breast-MRI subtraction volumes (built-in benchmark; not real data).

A sample mirrors the paper's DUKE setup: one side (breast) of a bilateral subtraction volume,
(1, H, W, D) with H the left-right axis, W anterior-posterior and D the slices. Samples 2p and 2p + 1
are the left and right side of synthetic patient p (they share the patient's enhancement level and
gain, and splits never separate them). Each side shows a half-ellipsoid breast on the chest wall with
smooth fibroglandular texture and background parenchymal enhancement, the strongly enhancing heart and
chest wall at the posterior edge, one to three enhancing vessels running through the breast, and noise.

Label: an enhancing lesion (a bright ellipsoid of radius 2 to 3.5 voxels at 32 x 32 x 16) is present in
this side, with probability 1/2 per side. Vessels and the chest wall are as bright as lesions, so a
bright patch alone does not decide the label: the model has to see whether the bright structure
continues through neighbouring patches (a vessel) or ends (a lesion), which is where attention across
the volume helps.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from ..data.base import DataBundle, TaskInfo
from ..data.options import SPLITS, check_keys, flag, int_tuple, integer, split_sizes
from ..data.preprocessing import Preprocessing
from ..data.seeded import SyntheticDataset, item_generator
from ..data.transforms import Augmentation, augment_level, build_augmentation
from ..errors import UserError

NAME = "synthetic_breast_mri"
SIDES = ("left", "right")
KEYS = frozenset({"volume_size", "num_samples", "seed", "augment", "cache"})
DEFAULT_SIZES = {"train": 256, "val": 128, "test": 128}


def _uniform(gen: torch.Generator, low: float, high: float, shape=()) -> torch.Tensor | float:
    value = low + (high - low) * torch.rand(shape, generator=gen)
    return float(value) if shape == () else value


def render_breast_side(size: tuple[int, int, int], patient_gen: torch.Generator, side_gen: torch.Generator,
                       side: str) -> tuple[torch.Tensor, bool]:
    """Draw one synthetic side: -> (volume (1, H, W, D) z-scored, lesion present)."""
    H, W, D = size
    gain = _uniform(patient_gen, 0.7, 1.3)
    parenchyma = _uniform(patient_gen, 0.05, 0.25)
    axes = [(torch.arange(n, dtype=torch.float32) + 0.5) / n for n in size]
    x, y, z = torch.meshgrid(*axes, indexing="ij")  # (H, W, D) in (0, 1); y = 1 is the chest wall
    if side == "right":
        x = 1 - x  # mirror so that the sternum is on the inner side of both halves
    cx, cz = _uniform(side_gen, 0.4, 0.55), _uniform(side_gen, 0.45, 0.55)
    rx, ry, rz = _uniform(side_gen, 0.35, 0.45), _uniform(side_gen, 0.55, 0.75), _uniform(side_gen, 0.35, 0.45)
    breast = (((x - cx) / rx) ** 2 + ((y - 0.85) / ry) ** 2 + ((z - cz) / rz) ** 2 < 1) & (y < 0.85)
    texture = F.interpolate(torch.randn(1, 1, 5, 5, 4, generator=side_gen), size=size, mode="trilinear",
                            align_corners=False)[0, 0]
    volume = breast.float() * parenchyma * (texture > 0.3).float() * (1 + 0.5 * texture)
    volume = volume + 0.6 * (y > 0.88).float()  # enhancing heart and chest wall
    voxels = torch.stack([x, y, z], dim=-1) * torch.tensor(size, dtype=torch.float32)  # (H, W, D, 3) voxel units
    for _ in range(int(torch.randint(1, 4, (), generator=side_gen))):
        start = torch.tensor([_uniform(side_gen, 0.2, 0.8), 0.85, _uniform(side_gen, 0.2, 0.8)]) * torch.tensor(
            size, dtype=torch.float32)
        direction = F.normalize(_uniform(side_gen, -1, 1, (3,)) * torch.tensor([1.0, 0.3, 0.5])
                                - torch.tensor([0.0, 1.0, 0.0]), dim=0)  # from the chest wall to the front
        rel = voxels - start
        dist = (rel - (rel @ direction)[..., None] * direction).norm(dim=-1)  # distance to the vessel's axis
        volume = volume + _uniform(side_gen, 0.5, 0.9) * torch.sigmoid((1.2 - dist) * 3) * breast
    lesion = float(torch.rand((), generator=side_gen)) < 0.5
    if lesion:
        inside = torch.nonzero(breast & (y < 0.75))
        centre = inside[int(torch.randint(len(inside), (), generator=side_gen))].float()
        radius = _uniform(side_gen, 2.0, 3.5) * H / 32  # voxels along H
        offset = (voxels - 0.5 - centre) / torch.tensor([radius, radius, radius * D / H * 2])
        volume = volume + _uniform(side_gen, 0.6, 1.0) * torch.sigmoid((1 - offset.norm(dim=-1)) * 4)
    volume = gain * volume + 0.05 * torch.randn(size, generator=side_gen)
    volume = (volume - volume.mean()) / volume.std().clamp_min(1e-6)
    return volume[None], lesion


def make_sample(size: tuple[int, int, int], seed: int, split: str, index: int) -> dict:
    """Sample ``index`` of ``split``: side ``index % 2`` of synthetic patient ``index // 2``."""
    patient, side = index // 2, SIDES[index % 2]
    volume, lesion = render_breast_side(size, item_generator(NAME, seed, split, 2 * patient),
                                        item_generator(f"{NAME}-side", seed, split, index), side)
    patient_id = f"{NAME}-{split}-{patient:06d}"
    return {"input": volume, "label": torch.tensor([float(lesion)]), "id": f"{patient_id}-{side}",
            "patient": patient_id}


def augment_input(augment: Augmentation, sample: dict) -> dict:
    return {**sample, "input": augment(sample["input"])}


def build_synthetic_breast_mri(cfg: dict, seed: int = 0, skip_bad: bool = False) -> DataBundle:
    """Synthetic breast-MRI lesion-per-side benchmark (binary).

    Keys: ``volume_size`` (H, W, D; default [32, 32, 16]), ``num_samples`` (sides per split; default
    256/128/128), ``seed`` (data seed, default: the run seed), ``augment`` (default "strong": flips, crops, elastic and
    intensity transforms, :func:`~medattn.data.transforms.build_augmentation`; true = flips along every axis
    with p = 0.5; false: none),
    ``cache`` (default true: keep rendered volumes in memory, 64 KB
    each at 32 x 32 x 16). ``skip_bad`` has nothing to skip.
    """
    check_keys(cfg, KEYS, NAME)
    size = int_tuple(cfg.get("volume_size", (32, 32, 16)), 3, f"{NAME}.volume_size")
    if min(size) < 8:
        raise UserError(f"{NAME}: volume_size must be at least 8 along every axis, got {size}")
    data_seed = integer(cfg, "seed", seed, 0, 2**32 - 1, NAME)
    sizes = split_sizes(cfg.get("num_samples"), DEFAULT_SIZES)
    level, chosen = augment_level(cfg, 3)
    augment = build_augmentation(level, 3)

    finish = partial(augment_input, augment) if augment else None
    datasets = {s: SyntheticDataset(sizes[s], partial(make_sample, size, data_seed, s),
                                    finish if s == "train" else None, flag(cfg, "cache", True, NAME)) for s in SPLITS}
    task = TaskInfo("binary", "volume3d", 1, (1, *size), ["lesion"], synthetic=True)
    return DataBundle(datasets["train"], datasets["val"], datasets["test"], task, defaults=chosen,  # z-scored sides
                      preprocessing=Preprocessing.of(NAME, task, normalize="zscore"))
