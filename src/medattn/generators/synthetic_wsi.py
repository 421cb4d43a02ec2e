"""Synthetic whole-slide feature bags (built-in benchmark; not real data).

A synthetic slide is a bag of N patch features (N uniform in ``num_instances``, the paper's TCGA bags
reach 11,039) on a grid of tissue cells (coords in pixels, patch size 256). Normal tissue comes from
``NUM_TISSUES`` Gaussian clusters in feature space, arranged in contiguous regions of the slide (a
Voronoi partition of the tissue). A positive slide also carries one contiguous tumour region holding a
small fraction (``tumour_fraction``, default 2 % to 10 %) of its patches, whose features come from a
tumour cluster: one normal cluster's centre shifted by ``tumour_shift`` noise standard deviations in a
fixed random direction. The label (tumour present) is decided by a few patches anywhere in a bag of
hundreds to thousands, so the model has to attend over the whole sequence.

Cluster centres depend only on the data seed, so all splits share one feature space.
"""

from __future__ import annotations

import math
from functools import partial

import torch

from ..data.base import DataBundle, TaskInfo
from ..data.options import SPLITS, check_keys, flag, integer, number, split_sizes
from ..data.preprocessing import Preprocessing
from ..data.readers.bags import subsample
from ..data.seeded import SyntheticDataset, item_generator
from ..errors import UserError

NAME = "synthetic_wsi"
NUM_TISSUES = 6
PATCH_PIXELS = 256
KEYS = frozenset({"num_instances", "feature_dim", "tumour_fraction", "tumour_shift", "num_samples", "seed",
                  "max_instances", "cache"})
DEFAULT_SIZES = {"train": 200, "val": 100, "test": 100}


def _range(value, name: str, kind=float, high: float = float("inf")) -> tuple:
    """``[min, max]`` with 0 < min <= max <= high, of ints (``kind=int``) or finite numbers."""
    def fits(v) -> bool:
        return isinstance(v, int if kind is int else (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(map(fits, value))
            and 0 < value[0] <= value[1] <= high):
        raise UserError(f"{NAME}.{name} must be [min, max] with 0 < min <= max <= {high:g}, got {value!r}")
    return kind(value[0]), kind(value[1])


def feature_space(feature_dim: int, shift: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (tissue centres (NUM_TISSUES, F), tumour centre (F,)), fixed by the data seed."""
    gen = item_generator(f"{NAME}-centres", seed, "all", 0)
    centres = 1.5 * torch.randn(NUM_TISSUES, feature_dim, generator=gen)
    direction = torch.nn.functional.normalize(torch.randn(feature_dim, generator=gen), dim=0)
    return centres, centres[0] + shift * direction


def render_bag(gen: torch.Generator, n_range: tuple[int, int], fraction: tuple[float, float],
               centres: torch.Tensor, tumour: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Draw one synthetic bag: -> (features (N, F), coords (N, 2) in pixels, tumour present)."""
    n = int(torch.randint(n_range[0], n_range[1] + 1, (), generator=gen))
    side = math.ceil(math.sqrt(n / 0.7))
    cells = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij"), -1).reshape(-1, 2)
    centre = (side - 1) / 2
    radial = (cells.float() - centre).norm(dim=-1) + 0.3 * side * torch.rand(len(cells), generator=gen)
    cells = cells[radial.argsort()[:n]]  # a blob of tissue, n cells
    cells = cells[(cells[:, 0] * side + cells[:, 1]).argsort()]  # tiling order (row-major)
    seeds = cells[torch.randint(n, (NUM_TISSUES,), generator=gen)].float()
    tissue = torch.cdist(cells.float(), seeds).argmin(dim=1)  # (N,) contiguous tissue regions
    features = centres[tissue] + torch.randn(n, centres.shape[1], generator=gen)
    positive = float(torch.rand((), generator=gen)) < 0.5
    if positive:
        k = max(1, round(n * (fraction[0] + (fraction[1] - fraction[0]) * float(torch.rand((), generator=gen)))))
        focus = cells[int(torch.randint(n, (), generator=gen))].float()
        region = (cells.float() - focus).norm(dim=-1).argsort()[:k]  # the k cells nearest to the focus
        features[region] = tumour + torch.randn(k, centres.shape[1], generator=gen)
    return features, cells.float() * PATCH_PIXELS, positive


def make_sample(n_range: tuple[int, int], fraction: tuple[float, float], centres: torch.Tensor,
                tumour: torch.Tensor, seed: int, split: str, index: int) -> dict:
    """Bag ``index`` of ``split``."""
    features, coords, positive = render_bag(item_generator(NAME, seed, split, index), n_range, fraction, centres,
                                            tumour)
    sample_id = f"{NAME}-{split}-{index:06d}"
    return {"input": features, "coords": coords, "label": torch.tensor([float(positive)]), "id": sample_id,
            "patient": sample_id}


def limit_instances(limit: int, sample: dict) -> dict:
    """Training: a random subset of at most ``limit`` instances (torch's global RNG)."""
    features, coords = subsample(sample["input"], sample["coords"], limit)
    return {**sample, "input": features, "coords": coords}


def build_synthetic_wsi(cfg: dict, seed: int = 0, skip_bad: bool = False) -> DataBundle:
    """Synthetic whole-slide tumour-detection benchmark on feature bags (binary).

    Keys: ``num_instances`` ([min, max] bag length, default [200, 1000]; the paper's scale is
    [500, 12000]), ``feature_dim`` (default 64), ``tumour_fraction`` ([min, max], default [0.02, 0.1]),
    ``tumour_shift`` (distance of the tumour cluster in noise standard deviations, default 3.0),
    ``num_samples`` (bags per split, default 200/100/100), ``seed`` (data seed, default: the run seed),
    ``max_instances`` (training only: randomly keep at most this many instances per bag; default none),
    ``cache`` (default true: keep generated bags in memory, N x F x 4 bytes each; turn off at the
    paper's scale).
    ``skip_bad`` has nothing to skip.
    """
    check_keys(cfg, KEYS, NAME)
    n_range = _range(cfg.get("num_instances", (200, 1000)), "num_instances", int, 1 << 24)
    fraction = _range(cfg.get("tumour_fraction", (0.02, 0.1)), "tumour_fraction", high=1)
    feature_dim = integer(cfg, "feature_dim", 64, 1, 1 << 16, NAME)
    shift = number(cfg, "tumour_shift", 3.0, 0, 1e6, NAME, low_open=True)
    max_instances = None if cfg.get("max_instances") is None else integer(cfg, "max_instances", None, 1, 1 << 24, NAME)
    data_seed = integer(cfg, "seed", seed, 0, 2**32 - 1, NAME)
    sizes = split_sizes(cfg.get("num_samples"), DEFAULT_SIZES)
    centres, tumour = feature_space(feature_dim, shift, data_seed)

    make = partial(make_sample, n_range, fraction, centres, tumour, data_seed)
    finish = partial(limit_instances, int(max_instances)) if max_instances else None
    datasets = {s: SyntheticDataset(sizes[s], partial(make, s), finish if s == "train" else None,
                                    flag(cfg, "cache", True, NAME)) for s in SPLITS}
    task = TaskInfo("binary", "bag", 1, (feature_dim,), ["tumour"], synthetic=True)
    return DataBundle(datasets["train"], datasets["val"], datasets["test"], task,
                      preprocessing=Preprocessing.of(NAME, task))
