"""Unlabelled NIfTI volumes listed in a CSV (data kind ``nifti_volumes``): the diffusion stages' own scans.

Read like ``volume_table`` (:mod:`medattn.data.kinds.volumes`: RAS+ reorientation, optional ``target_spacing``
resampling, centre crop or pad to ``target_size``, ``normalize``) but without labels, one file per row. A sample is
``{"input": (1, H, W, D) float32, "id": the path as listed, "patient": str}`` (and a placeholder ``label``, the
record's, zeros (1,)).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...errors import UserError
from ...vocabulary.task_types import UNLABELLED
from ..base import DataBundle, TaskInfo
from ..cohort.splits import SPLIT_KEYS, parse_split, split_records
from ..options import check_keys, require
from ..preprocessing import Preprocessing
from ..readers.volumes import VolumeLoader
from ..tables import Record, RecordDataset, read_csv, require_columns, resolve_path
from .volumes import volume_options

KIND = "nifti_volumes"
KEYS = frozenset({"csv", "data_root", "path_column", "patient_column", "split_column", "target_size",
                  "target_spacing", "normalize"}) | SPLIT_KEYS


def build_nifti_volumes(cfg: dict, seed: int = 0, skip_bad: bool = False) -> DataBundle:
    """The volumes of a CSV with one NIfTI file per row, split by patient; unlabelled.

    Keys: ``csv`` (required), ``data_root`` (default: the CSV's folder), ``path_column`` (default "path"),
    ``patient_column``, ``split_column``, ``target_size`` (default [160, 224, 192], the OASIS grid of BinaryFormer),
    ``target_spacing``, ``normalize`` (default ``percentile``: [0, 1]), ``val_fraction``, ``test_fraction``,
    ``folds``, ``fold``. Every listed file must exist (``skip_bad`` is not read: a missing file is an error).
    """
    check_keys(cfg, KEYS, KIND)
    csv_path = Path(require(cfg, "csv", KIND))
    root = Path(cfg.get("data_root") or csv_path.parent)
    cfg = {**cfg, "normalize": cfg.get("normalize", "percentile")}
    spacing, size, method = volume_options(cfg, default_size=(160, 224, 192))
    path_column, patient_column, split_column = (cfg.get("path_column", "path"), cfg.get("patient_column"),
                                                 cfg.get("split_column"))
    header, rows = read_csv(csv_path, "table")
    require_columns(header, [c for c in (path_column, patient_column, split_column) if c], csv_path)
    records, splits = [], []
    for number, row in rows:
        where = f"{csv_path.name} row {number}"
        path = resolve_path(root, row[path_column], where)
        if not path.is_file():
            raise UserError(f"{where}: {path} does not exist")
        records.append(Record(id=row[path_column], patient=row[patient_column] if patient_column else
                              row[path_column], where=where, paths=(path,), label=torch.zeros(1)))
        if split_column:
            splits.append(parse_split(row[split_column], where))
    parts = split_records(records, cfg, seed, splits if split_column else None)
    loader = VolumeLoader(spacing, size, method)
    task = TaskInfo(UNLABELLED, "volume3d", 0, (1, *size))
    return DataBundle(*(RecordDataset(parts[name], loader) for name in ("train", "val", "test")), task,
                      preprocessing=Preprocessing.of(KIND, task, spacing=spacing, normalize=method))
