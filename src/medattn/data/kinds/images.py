"""2D image tables (data kind ``image_table``): a CSV of image paths and labels; PNG, JPEG, TIFF and DICOM.

Each image is read and prepared by :class:`~medattn.data.readers.images.ImageLoader` (see
:mod:`medattn.data.readers.images`: [0, 1] scaling, channels, resize, augmentation, ``(x - mean) / std``).
"""

from __future__ import annotations

from ...errors import UserError
from ..base import DataBundle, TaskInfo
from ..cohort.duplicates import resolve_duplicates
from ..cohort.labels import label_columns as table_label_columns
from ..cohort.splits import SPLIT_KEYS, split_records
from ..options import check_keys, int_tuple, require
from ..preprocessing import Preprocessing
from ..readers.images import ImageLoader, check_image_header
from ..tables import BadSamples, RecordDataset, keep_valid, table_records
from ..transforms import augment_level, build_augmentation

KEYS = frozenset({"csv", "data_root", "path_column", "label_columns", "patient_column", "split_column",
                  "time_column", "event_column", "event_values", "cause_names",
                  "task_type", "classes", "num_classes", "image_size", "in_chans", "mean", "std", "augment",
                  "check_files"}) | SPLIT_KEYS


def _per_channel(value, in_chans: int, name: str) -> list[float]:
    values = [float(value)] * in_chans if isinstance(value, (int, float)) else [float(v) for v in value]
    if len(values) != in_chans or (name == "std" and min(values) <= 0):
        raise UserError(f"{name} must be a number or {in_chans} numbers (std > 0), got {value!r}")
    return values


def build_image_table(cfg: dict, seed: int = 0, skip_bad: bool = False) -> DataBundle:
    """2D images listed in a CSV.

    Keys: ``csv`` (required), ``data_root`` (default: the CSV's folder; paths must stay inside it),
    ``path_column`` (default "path"), ``label_columns`` (required; one or several),
    ``patient_column``, ``split_column`` (values train/val/test), ``task_type``
    (binary/multiclass/multilabel; inferred when absent), ``classes`` (class names, when the label
    cells hold names), ``num_classes``, ``image_size`` (int or [H, W], default 224), ``in_chans``
    (1 or 3, default 3), ``mean``/``std`` (after scaling to [0, 1]; default 0.5/0.5), ``augment``
    (training split only; true: rotation +-45 degrees and vertical flip p = 0.5, the paper's; default
    "strong": those, then crops, elastic and intensity transforms,
    :func:`~medattn.data.transforms.build_augmentation`; false: none),
    ``check_files`` (default true: check at build time that every file exists and its header reads),
    ``val_fraction``, ``test_fraction``, ``folds``, ``fold`` (see :mod:`medattn.data.cohort.splits`).

    Validation: unparsable labels and paths outside the root are found while reading the CSV; missing
    files and unreadable headers at build time (``check_files``); with ``skip_bad`` every image is also
    decoded once at build time, so corrupt content is dropped then. Without ``skip_bad`` corrupt
    content raises when the sample is loaded.
    """
    kind = "image_table"
    check_keys(cfg, KEYS, kind)
    require(cfg, "csv", kind)
    label_columns = table_label_columns(cfg, kind)
    in_chans = int(cfg.get("in_chans", 3))
    if in_chans not in (1, 3):
        raise UserError(f"image_table: in_chans must be 1 or 3, got {in_chans}")
    size = int_tuple(cfg.get("image_size", 224), 2, "image_size")
    mean, std = _per_channel(cfg.get("mean", 0.5), in_chans, "mean"), _per_channel(cfg.get("std", 0.5), in_chans, "std")
    bad = BadSamples(skip_bad)
    records, spec, column, problems = table_records(cfg, kind, label_columns)
    for message in problems:
        bad.report(message)
    plain = ImageLoader(size, in_chans, mean, std)
    check = plain if skip_bad else (lambda r: check_image_header(r.paths[0])) if cfg.get("check_files", True) else None
    records, column = keep_valid(records, column, check, bad, f"image_table {cfg['csv']}")
    records, column = resolve_duplicates(records, column, bad)
    parts = split_records(records, cfg, seed, column, spec.stratum)
    level, chosen = augment_level(cfg, 2)
    augment = build_augmentation(level, 2)
    train_loader = ImageLoader(size, in_chans, mean, std, augment)
    task = TaskInfo(spec.task_type, "image2d", spec.num_outputs, (in_chans, *size), spec.class_names,
                    **spec.targets(parts["train"]))
    return DataBundle(RecordDataset(parts["train"], train_loader), RecordDataset(parts["val"], plain),
                      RecordDataset(parts["test"], plain), task, skipped=bad.count, defaults=chosen,
                      preprocessing=Preprocessing.of(kind, task, mean=mean, std=std))
