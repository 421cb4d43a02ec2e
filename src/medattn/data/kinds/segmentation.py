"""3D segmentation data: NIfTI image/label pairs listed in a CSV (data kind ``nifti_segmentation``).

A row names an image (a NIfTI file or a DICOM series folder, read as in :mod:`medattn.data.kinds.volumes`)
and a NIfTI label map of integer class indices (0 = background) on the same voxel grid. Loading:

1. read both and reorient them to RAS+ (:func:`~medattn.data.readers.volumes.read_volume`); their shapes must
   agree and the label must hold integers in [0, num_classes);
2. resampling (optional) to ``target_spacing``: the image trilinearly, the label by nearest neighbour
   onto the image's new grid;
3. centre crop or pad both to ``target_size`` (the image with its minimum, the label with its minimum,
   i.e. background whenever the label map has background);
4. intensity normalisation of the image (``zscore``, ``percentile``, ``none``);
5. training augmentation (optional, ``augment``): flips along every axis with p = 0.5, the same flips
   for image and label.

Sample: ``"input"`` (1, H, W, D) float32, ``"label"`` (H, W, D) int64.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from ...errors import UserError
from ..base import DataBundle, TaskInfo
from ..cohort.duplicates import resolve_duplicates
from ..cohort.splits import SPLIT_KEYS, parse_split, split_records
from ..options import check_keys, require
from ..preprocessing import Preprocessing
from ..readers.volumes import check_volume_header, crop_or_pad, is_nifti, normalise, read_volume, resample
from ..tables import BadSamples, Record, RecordDataset, keep_valid, read_csv, require_columns, resolve_path
from ..transforms import RandomFlip3d
from .volumes import volume_options

KIND = "nifti_segmentation"
KEYS = frozenset({"csv", "data_root", "image_column", "label_column", "patient_column", "split_column",
                  "classes", "num_classes", "target_spacing", "target_size", "normalize", "augment",
                  "check_files"}) | SPLIT_KEYS


class PairLoader:
    """record (paths: image, label) -> {"input": (1, H, W, D) float32, "label": (H, W, D) int64}."""

    def __init__(self, spacing: tuple[float, ...] | None, size: tuple[int, ...], method: str, num_classes: int,
                 augment: RandomFlip3d | None = None) -> None:
        self.spacing, self.size, self.method = spacing, size, method
        self.num_classes, self.augment = num_classes, augment

    def __call__(self, record: Record) -> dict:
        image, label = read_pair(record, self.num_classes, self.spacing)
        image = normalise(crop_or_pad(image, self.size), self.method)[None]
        label = crop_or_pad(label, self.size)
        if self.augment is not None:
            both = self.augment(torch.cat([image, label[None]]))
            image, label = both[:1], both[1]
        return {"input": image.contiguous(), "label": label.long().contiguous()}


def read_pair(record: Record, num_classes: int, spacing: tuple[float, ...] | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 1-2 of the module docstring: record (paths: image, label) -> image (H, W, D) float32 and label
    (H, W, D) float32 holding integer class indices, both RAS+, resampled to ``spacing`` when given."""
    image, image_spacing = read_volume(record.paths[0])
    label, _ = read_volume(record.paths[1])
    if image.shape != label.shape:
        raise ValueError(f"image shape {tuple(image.shape)} and label shape {tuple(label.shape)} differ")
    if not torch.equal(label, label.round()) or label.min() < 0:
        bad = label[(label != label.round()) | (label < 0)][0].item()
        raise ValueError(f"the label map holds a value {bad:g}; expected integer class indices 0..K-1")
    if label.max() >= num_classes:
        raise ValueError(f"label value {int(label.max())} is out of range for {num_classes} classes")
    if spacing is not None:
        image = resample(image, image_spacing, spacing)
        label = F.interpolate(label[None, None], size=image.shape, mode="nearest-exact")[0, 0]
    return image, label


def check_pair_headers(record: Record) -> None:
    """Both files exist and read as 3D volumes; two NIfTI headers must give the same shape."""
    for path in record.paths:
        try:
            check_volume_header(path)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}") from None
    if all(is_nifti(p) for p in record.paths):
        import nibabel as nib

        image_shape, label_shape = (nib.load(p).shape[:3] for p in record.paths)
        if image_shape != label_shape:
            raise ValueError(f"image shape {image_shape} and label shape {label_shape} differ")


def class_names(cfg: dict) -> list[str]:
    """From ``classes`` (names, background first) or ``num_classes`` (background included)."""
    classes, num_classes = cfg.get("classes"), cfg.get("num_classes")
    if classes is not None:
        if not isinstance(classes, list) or len(classes) < 2:
            raise UserError(f"{KIND}: classes must list at least two names (background first), got {classes!r}")
        if num_classes is not None and num_classes != len(classes):
            raise UserError(f"{KIND}: num_classes ({num_classes}) differs from the {len(classes)} classes")
        return [str(c) for c in classes]
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 2:
        raise UserError(f"{KIND} needs classes (names, background first) or num_classes >= 2 (background "
                        f"included), got num_classes={num_classes!r}")
    return ["background", *[str(k) for k in range(1, num_classes)]]


def pair_records(cfg: dict) -> tuple[list[Record], list[str] | None, list[str]]:
    """-> (records with paths (image, label), split names from the split column or None, problems)."""
    csv_path = Path(cfg["csv"])
    root = Path(cfg.get("data_root") or csv_path.parent)
    image_column, label_column = cfg.get("image_column", "image"), cfg.get("label_column", "label")
    patient_column, split_column = cfg.get("patient_column"), cfg.get("split_column")
    header, rows = read_csv(csv_path, "table")
    require_columns(header, [image_column, label_column, *(c for c in (patient_column, split_column) if c)],
                    csv_path)
    records, splits, problems = [], [], []
    for number, row in rows:
        where = f"{csv_path.name} row {number}"
        try:
            paths = tuple(resolve_path(root, row[c], where) for c in (image_column, label_column))
            split = parse_split(row[split_column], where) if split_column else None
        except UserError as exc:
            problems.append(str(exc))
            continue
        patient = row[patient_column] if patient_column else row[image_column]
        # the constant label makes patient-level splits plain seeded shuffles (nothing to stratify on)
        records.append(Record(id=row[image_column], patient=patient, where=where, paths=paths,
                              label=torch.zeros((), dtype=torch.int64)))
        splits.append(split)
    return records, (splits if split_column else None), problems


def build_nifti_segmentation(cfg: dict, seed: int = 0, skip_bad: bool = False) -> DataBundle:
    """3D image/label pairs listed in a CSV (see the module docstring).

    Keys: ``csv`` (required), ``data_root`` (default: the CSV's folder; paths must stay inside it),
    ``image_column`` (default "image"), ``label_column`` (default "label"), ``patient_column``,
    ``split_column``, ``classes`` (class names, background first) or ``num_classes`` (background
    included; one of the two is required), ``target_spacing`` (mm along H, W, D; default: no
    resampling), ``target_size`` (H, W, D, default [128, 128, 64]), ``normalize`` (zscore (default),
    percentile, none), ``augment`` (default false: flips can swap left/right structures),
    ``check_files`` (default true), ``val_fraction``, ``test_fraction``, ``folds``, ``fold``.

    Validation: paths and split values while reading the CSV; existence, headers and matching NIfTI
    shapes at build time (``check_files``); with ``skip_bad`` every pair is also loaded once at build
    time, so non-integer or out-of-range labels are dropped then. Without ``skip_bad`` corrupt content
    raises a one-line error naming the files and the row when the sample is loaded.
    """
    check_keys(cfg, KEYS, KIND)
    require(cfg, "csv", KIND)
    names = class_names(cfg)
    spacing, size, method = volume_options(cfg, default_size=(128, 128, 64))
    bad = BadSamples(skip_bad)
    records, column, problems = pair_records(cfg)
    for message in problems:
        bad.report(message)
    plain = PairLoader(spacing, size, method, len(names))
    check = plain if skip_bad else check_pair_headers if cfg.get("check_files", True) else None
    records, column = keep_valid(records, column, check, bad, f"{KIND} {cfg['csv']}")
    records, column = resolve_duplicates(records, column, bad, inputs=1)
    parts = split_records(records, cfg, seed, column)
    train_loader = PairLoader(spacing, size, method, len(names), RandomFlip3d() if cfg.get("augment") else None)
    task = TaskInfo("segmentation", "volume3d", len(names), (1, *size), names)
    return DataBundle(RecordDataset(parts["train"], train_loader), RecordDataset(parts["val"], plain),
                      RecordDataset(parts["test"], plain), task, skipped=bad.count,
                      preprocessing=Preprocessing.of(KIND, task, spacing=spacing, normalize=method))
