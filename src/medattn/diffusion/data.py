"""Volumes for the VQ-AE and the diffusion transformer: SYNTHETIC brain-like volumes or NIfTI files from a table.

Two ``data.kind`` values, read by :func:`build_volume_sets` (only the diffusion tasks read them; they
carry no labels):

``synthetic_brain`` (offline, deterministic, generated from a seed; SYNTHETIC, not MRI): keys ``size``
(H, W, D; default [64, 96, 64], multiples of the patch size), ``num_samples`` (default
{train: 24, val: 4, test: 4}), ``seed`` (default: the run's seed), ``noise`` (default 0.03). Each volume
(:func:`medattn.data.synthetic_brain.synthetic_brain`, the generator) has a scalp, a dark skull shell,
cerebrospinal fluid, a grey-matter ellipsoid, a white-matter core with a folded (gyri-like) border, two
ventricles, a smooth bias field and noise, with sizes, positions and folding drawn per volume; intensities in [0, 1].

``nifti_volumes``: a CSV with one NIfTI file per row, read like ``volume_table`` (RAS+ reorientation,
optional ``target_spacing`` resampling, centre crop/pad to ``target_size``, ``normalize``; see
:mod:`medattn.data.volumes`) but without labels. Keys: ``csv`` (required), ``data_root``, ``path_column``
(default "path"), ``patient_column``, ``split_column``, ``target_size`` (default [160, 224, 192], the
OASIS grid of the paper), ``target_spacing``, ``normalize`` (default ``percentile``: [0, 1]),
``val_fraction``, ``test_fraction``, ``folds``, ``fold``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset

from medattn.catalogue import DIFFUSION_KINDS
from medattn.data.options import check_keys, require, split_sizes
from medattn.data.readers.volumes import VolumeLoader
from medattn.data.splits import SPLIT_KEYS, parse_split, split_records
from medattn.data.synthetic_brain import SyntheticBrains
from medattn.data.tables import Record, RecordDataset, read_csv, require_columns, resolve_path
from medattn.data.volumes import volume_options
from medattn.errors import UserError

KINDS = DIFFUSION_KINDS
SYNTHETIC_KEYS = frozenset({"size", "num_samples", "seed", "noise"})
NIFTI_KEYS = frozenset({"csv", "data_root", "path_column", "patient_column", "split_column", "target_size",
                        "target_spacing", "normalize"}) | SPLIT_KEYS
DEFAULT_SYNTHETIC_SIZE = (64, 96, 64)


@dataclass
class VolumeSets:
    """Train/val/test datasets of samples ``{"input": (1, H, W, D) float32, "id": str}`` of one ``shape``."""

    train: Dataset
    val: Dataset
    test: Dataset
    shape: tuple[int, int, int]
    synthetic: bool


def build_volume_sets(cfg: dict, seed: int = 0) -> VolumeSets:
    """The data of a diffusion run from its ``data`` section (kinds: see the module docstring)."""
    kind = cfg.get("kind")
    if kind == "synthetic_brain":
        return _synthetic(cfg, seed)
    if kind == "nifti_volumes":
        return _nifti(cfg, seed)
    raise UserError(f"data.kind: the diffusion tasks read {', '.join(KINDS)}, got {kind!r}")


def _synthetic(cfg: dict, seed: int) -> VolumeSets:
    check_keys(cfg, SYNTHETIC_KEYS, "synthetic_brain")
    size = cfg.get("size", list(DEFAULT_SYNTHETIC_SIZE))
    if not (isinstance(size, (list, tuple)) and len(size) == 3 and all(isinstance(n, int) and n >= 8 for n in size)):
        raise UserError(f"data.size must be three integers >= 8 (H, W, D), got {size!r}")
    noise = cfg.get("noise", 0.03)
    if not isinstance(noise, (int, float)) or not 0 <= noise <= 1:
        raise UserError(f"data.noise must be a number in [0, 1], got {noise!r}")
    sizes = split_sizes(cfg.get("num_samples"), {"train": 24, "val": 4, "test": 4})
    data_seed = cfg.get("seed", seed)
    shape = tuple(size)
    parts = [SyntheticBrains(sizes[name], shape, data_seed, i, float(noise)) for i, name in enumerate(sizes)]
    return VolumeSets(*parts, shape=shape, synthetic=True)


def _nifti(cfg: dict, seed: int) -> VolumeSets:
    kind = "nifti_volumes"
    check_keys(cfg, NIFTI_KEYS, kind)
    csv_path = Path(require(cfg, "csv", kind))
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
    return VolumeSets(*(RecordDataset(parts[name], loader) for name in ("train", "val", "test")), shape=size,
                      synthetic=False)
