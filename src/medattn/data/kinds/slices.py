"""2D segmentation training from 3D image/label volumes, slice by slice (data kind ``nifti_slices``).

BinaryFormer §3.1 trains a 2D ViT-S/8 on slices of 3D MRI. Each volume (one patient) is cut along
``axis`` (0, 1 or 2 of the RAS+ grid: sagittal, coronal, axial); the slices that enter a split are planned
once at build time by :func:`plan_slices`:

* every ``slice_stride``-th slice is a candidate;
* candidates holding any foreground label are all kept;
* of the empty candidates (background only) a seeded random ``empty_fraction`` is kept (training;
  ``eval_empty_fraction``, default 1, for validation and test slices with ``eval_unit: slice``).

Splits are made at patient level on the volumes before slicing (:func:`medattn.data.cohort.splits.split_records`),
so no patient has slices in two splits, and every slice carries its volume's ``patient``: the evaluation's
(:mod:`medattn.train.evaluate`) Dice CI resamples patients, not slices. Validation and test (``eval_unit``):

* ``volume`` (default): whole volumes, the slicing axis moved last ((1, h, w, S)), which the 2D model
  segments slice by slice; a case of the Dice table is a volume (3D Dice per patient, as volumes are scored);
* ``slice``: slices planned as above with ``eval_empty_fraction``; a case is one slice (NaN for a class
  absent from both its label and its prediction, 0 for any false positive on a slice without that class).

Sample: ``"input"`` (1, H, W) float32, ``"label"`` (H, W) int64, ``"id"`` ``"<volume>#<axis>:<slice>"``.
Each volume is normalised as a whole (``normalize``), then centre-cropped or padded in-plane to
``slice_size`` (image and label with their minimum: background for any label map that has some). Every
volume is read once at build time to plan the slices; with ``cache`` (default) it stays in memory (about 5
bytes per voxel after resampling and cropping; set ``cache: false`` for cohorts larger than memory, and the
volume is read again for each slice).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset

from ...errors import UserError
from ..base import DataBundle, TaskInfo
from ..cohort.splits import SPLIT_KEYS, split_records
from ..options import SPLITS, check_keys, int_tuple, require
from ..preprocessing import Preprocessing
from ..readers.slices import in_plane
from ..readers.volumes import normalise
from ..tables import BadSamples, Record, keep_valid, problem
from .segmentation import check_pair_headers, class_names, pair_records, read_pair
from .volumes import volume_options

KIND = "nifti_slices"
SLICE_KEYS = frozenset({"axis", "slice_size", "slice_stride", "empty_fraction", "eval_empty_fraction", "eval_unit",
                        "cache"})
KEYS = frozenset({"csv", "data_root", "image_column", "label_column", "patient_column", "split_column", "classes",
                  "num_classes", "target_spacing", "normalize", "check_files"}) | SLICE_KEYS | SPLIT_KEYS


@dataclass(frozen=True)
class SliceOptions:
    """How volumes become slices (module docstring); :func:`slice_options` reads them from a data config."""

    axis: int = 2
    size: tuple[int, int] = (320, 320)
    stride: int = 1
    empty_fraction: float = 0.1
    eval_empty_fraction: float = 1.0
    eval_unit: str = "volume"


def slice_options(cfg: dict, kind: str, default_size: tuple[int, int]) -> SliceOptions:
    """``axis``, ``slice_size``, ``slice_stride``, ``empty_fraction``, ``eval_empty_fraction``, ``eval_unit``,
    checked."""
    axis = cfg.get("axis", 2)
    if not isinstance(axis, int) or isinstance(axis, bool) or axis not in (0, 1, 2):
        raise UserError(f"{kind}.axis must be 0, 1 or 2 (sagittal, coronal, axial of the RAS+ grid), got {axis!r}")
    stride = cfg.get("slice_stride", 1)
    if not isinstance(stride, int) or isinstance(stride, bool) or stride < 1:
        raise UserError(f"{kind}.slice_stride must be a positive int, got {stride!r}")
    fractions = {}
    for key, default in (("empty_fraction", 0.1), ("eval_empty_fraction", 1.0)):
        value = cfg.get(key, default)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
            raise UserError(f"{kind}.{key} must be a number in [0, 1], got {value!r}")
        fractions[key] = float(value)
    size = int_tuple(cfg.get("slice_size", default_size), 2, f"{kind}.slice_size")
    unit = cfg.get("eval_unit", "volume")
    if unit not in ("volume", "slice"):
        raise UserError(f"{kind}.eval_unit must be volume or slice, got {unit!r}")
    return SliceOptions(axis, size, stride, **fractions, eval_unit=unit)


def foreground_slices(label: torch.Tensor, axis: int) -> torch.Tensor:
    """(H, W, D) label map -> (n,) bool: whether slice i along ``axis`` holds any foreground (label > 0)."""
    return (label.movedim(axis, 0) > 0).flatten(1).any(1)


def plan_slices(foreground: Sequence[torch.Tensor], stride: int, empty_fraction: float,
                seed: int) -> list[tuple[int, int]]:
    """(volume, slice) pairs: every ``stride``-th slice, all that hold foreground and ``round(empty_fraction
    * n_empty)`` of the empty ones per volume, drawn by ``numpy.random.default_rng((seed, volume))``.

    ``foreground[v]`` is :func:`foreground_slices` of volume v. Sorted by volume, then slice.
    """
    plan = []
    for v, flags in enumerate(foreground):
        candidates = np.arange(0, len(flags), stride)
        full = flags.numpy()[candidates]
        empty = candidates[~full]
        chosen = np.random.default_rng((seed, v)).choice(empty, round(empty_fraction * len(empty)), replace=False)
        plan += [(v, int(s)) for s in sorted([*candidates[full], *chosen])]
    return plan


class SliceDataset(Dataset):
    """2D slices of 3D volumes: item i is slice ``plan[i] = (v, s)`` of volume v along ``axis``.

    ``load(v) -> (image (H, W, D) float32, label (H, W, D) int)`` gives a volume ready to slice
    (normalised, in-plane size final); ``ids`` and ``patients`` name the volumes. ``cache`` (a dict, possibly
    filled already, or None) keeps loaded volumes. Items: {"input": (1, h, w) float32, "label": (h, w) int64,
    "id", "patient"}.
    """

    def __init__(self, load: Callable[[int], tuple[torch.Tensor, torch.Tensor]], ids: Sequence[str],
                 patients: Sequence[str], plan: list[tuple[int, int]], axis: int,
                 cache: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
        self.load, self.ids, self.patients, self.plan = load, list(ids), list(patients), plan
        self.axis, self.cache = axis, cache

    def __len__(self) -> int:
        return len(self.plan)

    def volume(self, v: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cache is None:
            return self.load(v)
        if v not in self.cache:
            self.cache[v] = self.load(v)
        return self.cache[v]

    def __getitem__(self, index: int) -> dict:
        v, s = self.plan[index]
        image, label = self.volume(v)
        return {"input": image.select(self.axis, s)[None].float().contiguous(),  # (1, h, w)
                "label": label.select(self.axis, s).long().contiguous(),  # (h, w)
                "id": f"{self.ids[v]}#{self.axis}:{s}", "patient": self.patients[v]}


class VolumeDataset(Dataset):
    """Whole volumes for evaluation, the slicing ``axis`` moved last: item v is {"input": (1, h, w, S) float32,
    "label": (h, w, S) int64, "id", "patient"}; a 2D segmenter scores it slice by slice
    (:class:`medattn.models.segmentation.vit_seg.SegmentationViT` takes volumes so)."""

    def __init__(self, load: Callable[[int], tuple[torch.Tensor, torch.Tensor]], ids: Sequence[str],
                 patients: Sequence[str], axis: int, cache: dict | None = None) -> None:
        self.slices = SliceDataset(load, ids, patients, [], axis, cache)

    def __len__(self) -> int:
        return len(self.slices.ids)

    def __getitem__(self, v: int) -> dict:
        if not 0 <= v < len(self):
            raise IndexError(v)
        image, label = self.slices.volume(v)
        axis = self.slices.axis
        return {"input": image.movedim(axis, -1)[None].float().contiguous(),  # (1, h, w, S)
                "label": label.movedim(axis, -1).long().contiguous(), "id": self.slices.ids[v],
                "patient": self.slices.patients[v]}


def compact(label: torch.Tensor) -> torch.Tensor:
    """A label map in uint8 when its classes fit (a cached volume's label then takes 1 byte per voxel)."""
    return label.to(torch.uint8) if int(label.max()) < 256 else label.long()


class NiftiVolumes:
    """v -> (image normalised as a whole, label), both cut in-plane to ``size``, of record v (:func:`read_pair`);
    a failure is a one-line UserError naming the files and the table row."""

    def __init__(self, records: list[Record], num_classes: int, spacing, method: str, axis: int,
                 size: tuple[int, int]) -> None:
        self.records, self.num_classes, self.spacing, self.method = records, num_classes, spacing, method
        self.axis, self.size = axis, size

    def __call__(self, v: int) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            image, label = read_pair(self.records[v], self.num_classes, self.spacing)
        except Exception as exc:  # any reader's failure becomes one line naming the files and the row
            raise UserError(problem(self.records[v], exc)) from None
        image = in_plane(normalise(image, self.method), self.axis, self.size)
        return image, compact(in_plane(label, self.axis, self.size))


def slice_splits(volumes: dict[str, tuple[Callable, list[str], list[str], list[torch.Tensor], dict | None]],
                 options: SliceOptions, seed: int) -> dict[str, Dataset]:
    """split -> its dataset, from split -> (load, ids, patients, foreground flags per volume, cache): slices
    planned by ``options`` for training, and for validation and test whole volumes (:class:`VolumeDataset`,
    ``eval_unit: volume``) or slices planned with ``eval_empty_fraction`` (``eval_unit: slice``)."""
    out = {}
    for split in SPLITS:
        load, ids, patients, foreground, cache = volumes[split]
        if not ids:
            raise UserError(f"the {split} split has no volumes; change val_fraction / test_fraction or the patients")
        if split != "train" and options.eval_unit == "volume":
            out[split] = VolumeDataset(load, ids, patients, options.axis, cache)
            continue
        fraction = options.empty_fraction if split == "train" else options.eval_empty_fraction
        plan = plan_slices(foreground, options.stride, fraction, seed)
        if not plan:
            raise UserError(f"the {split} split has no slices ({len(ids)} volumes); lower slice_stride or raise "
                            f"empty_fraction")
        out[split] = SliceDataset(load, ids, patients, plan, options.axis, cache)
    return out


def load_all(load: Callable[[int], tuple[torch.Tensor, torch.Tensor]], count: int, axis: int, cache: bool,
             bad: BadSamples | None = None) -> tuple[list[int], list[torch.Tensor], dict | None]:
    """Load volumes 0..count-1 once: (the indices that loaded, their foreground flags along ``axis``, the
    cache holding them when ``cache``). A UserError is reported to ``bad`` (and the volume left out) or raised."""
    kept, flags, store = [], [], {} if cache else None
    for v in range(count):
        try:
            image, label = load(v)
        except UserError as exc:
            if bad is None:
                raise
            bad.report(str(exc))
            continue
        if store is not None:
            store[len(kept)] = image, label
        kept.append(v)
        flags.append(foreground_slices(label, axis))
    return kept, flags, store


def build_nifti_slices(cfg: dict, seed: int = 0, skip_bad: bool = False) -> DataBundle:
    """2D slices of 3D NIfTI image/label pairs listed in a CSV (module docstring).

    Keys: those of ``nifti_segmentation`` (``csv`` required, ``data_root``, ``image_column``,
    ``label_column``, ``patient_column``, ``split_column``, ``classes`` or ``num_classes``,
    ``target_spacing``, ``normalize``, ``check_files``, ``val_fraction``, ``test_fraction``, ``folds``,
    ``fold``) without ``target_size``/``augment``, plus ``axis`` (default 2, axial), ``slice_size`` (H, W,
    default [320, 320]), ``slice_stride`` (default 1), ``empty_fraction`` (default 0.1),
    ``eval_empty_fraction`` (default 1.0), ``eval_unit`` (volume (default) or slice) and ``cache`` (default
    true). Every volume is read once at build
    time to plan the slices; a volume that fails to read is reported (or dropped with ``skip_bad``).
    """
    check_keys(cfg, KEYS, KIND)
    require(cfg, "csv", KIND)
    names = class_names(cfg)
    spacing, _, method = volume_options(cfg, default_size=(1, 1, 1))
    options = slice_options(cfg, KIND, (320, 320))
    bad = BadSamples(skip_bad)
    records, column, problems = pair_records(cfg)
    for message in problems:
        bad.report(message)
    check = check_pair_headers if cfg.get("check_files", True) else None
    records, column = keep_valid(records, column, check, bad, f"{KIND} {cfg['csv']}")
    parts = split_records(records, cfg, seed, column)
    volumes = {}
    for split in SPLITS:
        load = NiftiVolumes(parts[split], len(names), spacing, method, options.axis, options.size)
        kept, flags, store = load_all(load, len(parts[split]), options.axis, bool(cfg.get("cache", True)), bad)
        load.records = [parts[split][v] for v in kept]
        volumes[split] = (load, [r.id for r in load.records], [r.patient for r in load.records], flags, store)
    datasets = slice_splits(volumes, options, seed)
    task = TaskInfo("segmentation", "image2d", len(names), (1, *options.size), names)
    return DataBundle(datasets["train"], datasets["val"], datasets["test"], task, skipped=bad.count,
                      preprocessing=Preprocessing.of(KIND, task, spacing=spacing, normalize=method,
                                                     slice_axis=options.axis))
