"""3D volume tables (data kind ``volume_table``): NIfTI files or DICOM series folders, listed in a CSV.

Each sample is read and prepared by :class:`~medattn.data.readers.volumes.VolumeLoader`; its steps (RAS+,
subtraction, resampling, left/right split, crop or pad, normalisation, augmentation) are listed in
:mod:`medattn.data.readers.volumes`. The sample is (1, H, W, D).
"""

from __future__ import annotations

from ...errors import UserError
from ..base import DataBundle, TaskInfo
from ..cohort.duplicates import resolve_duplicates
from ..cohort.labels import label_columns as table_label_columns
from ..cohort.splits import SPLIT_KEYS, split_records
from ..options import check_keys, float_tuple, int_tuple, require
from ..preprocessing import Preprocessing
from ..readers.volumes import NORMALISATIONS, VolumeLoader, check_volume_header, resampled_shape
from ..tables import BadSamples, Record, RecordDataset, keep_valid, table_records
from ..transforms import augment_level, build_augmentation

SIDES = ("left", "right")
KEYS = frozenset({"csv", "data_root", "path_column", "label_columns", "patient_column", "split_column",
                  "time_column", "event_column", "event_values", "cause_names",
                  "subtract_column", "task_type", "classes", "num_classes", "target_spacing", "target_size",
                  "normalize", "split_sides", "augment", "check_files"}) | SPLIT_KEYS


def crop_warning(grids: list[tuple[tuple[int, ...], tuple[float, ...]]], spacing: tuple[float, ...] | None,
                 size: tuple[int, ...], halves: bool) -> str | None:
    """A sentence when the default ``target_size`` centre-crops volumes (None when nothing is cut).

    ``grids``: the (shape, spacing) of the volumes in RAS+ order (:func:`check_volume_header`); ``spacing``:
    ``target_spacing`` or None; ``halves``: the volumes are split into left and right halves along H first.
    The extent after resampling is :func:`resampled_shape`, the grid the loader makes.
    """
    lost = 0.0
    cropped = 0
    for shape, zooms in grids:
        extent = resampled_shape(shape, zooms, spacing) if spacing else list(shape)
        if halves:
            extent[0] /= 2
        fraction = max(1 - m / n for n, m in zip(extent, size))
        if fraction > 0:
            cropped += 1
            lost = max(lost, fraction)
    if not cropped:
        return None
    return (f"data.target_size is not set: {cropped} of {len(grids)} volume(s) are larger than the default "
            f"{list(size)} and are centre-cropped (up to {lost:.0%} of an axis lost; a finding outside the centre "
            f"can vanish while its label stays); set data.target_size (and data.target_spacing) to fit the data")


def volume_options(cfg: dict, default_size: tuple[int, int, int]):
    """``target_spacing`` (mm, or None to keep), ``target_size`` and ``normalize`` of a volume config, checked."""
    spacing = cfg.get("target_spacing")
    spacing = None if spacing is None else float_tuple(spacing, 3, "target_spacing")
    size = int_tuple(cfg.get("target_size", default_size), 3, "target_size")
    method = cfg.get("normalize", "zscore")
    if method not in NORMALISATIONS:
        raise UserError(f"normalize must be one of {NORMALISATIONS}, got {method!r}")
    return spacing, size, method

def build_volume_table(cfg: dict, seed: int = 0, skip_bad: bool = False) -> DataBundle:
    """3D volumes listed in a CSV (one NIfTI file or DICOM series folder per row).

    Keys: ``csv`` (required), ``data_root`` (default: the CSV's folder; paths must stay inside it),
    ``path_column`` (default "path"), ``label_columns`` (required), ``patient_column``,
    ``split_column``, ``subtract_column`` (a second volume subtracted from the first),
    ``task_type``, ``classes``, ``num_classes`` (as for ``image_table``), ``target_spacing`` (mm along
    H, W, D, e.g. [0.7, 0.7, 3.0]; default: no resampling), ``target_size`` (H, W, D, default
    [256, 256, 32]), ``normalize`` (zscore (default), percentile, none), ``split_sides`` (default
    false; see the module docstring), ``augment`` (training split only; true: flips along every axis,
    the paper's; default "strong": flips, then crops, elastic and intensity transforms, see
    :func:`~medattn.data.transforms.build_augmentation`; false: none), ``check_files`` (default true),
    ``val_fraction``, ``test_fraction``, ``folds``, ``fold``.

    Validation: labels, split values and paths while reading the CSV; existence and headers at build
    time (``check_files``); with ``skip_bad`` every volume is also loaded once at build time, so
    corrupt content is dropped then. Without ``skip_bad`` corrupt content raises at load time.
    """
    kind = "volume_table"
    check_keys(cfg, KEYS, kind)
    require(cfg, "csv", kind)
    label_columns = table_label_columns(cfg, kind)
    spacing, size, method = volume_options(cfg, default_size=(256, 256, 32))
    subtract = [cfg["subtract_column"]] if cfg.get("subtract_column") else []
    sides = SIDES if cfg.get("split_sides", False) else ()
    bad = BadSamples(skip_bad)
    records, spec, column, problems = table_records(cfg, kind, label_columns, subtract, sides)
    for message in problems:
        bad.report(message)
    plain = VolumeLoader(spacing, size, method)

    grids = []

    def check_headers(record: Record) -> None:
        grids.extend(grid for grid in map(check_volume_header, record.paths[:1]) if grid is not None)
        for path in record.paths[1:]:
            check_volume_header(path)

    def check_all(record: Record) -> None:
        check_headers(record)
        plain(record)

    check = check_all if skip_bad else check_headers if cfg.get("check_files", True) else None
    records, column = keep_valid(records, column, check, bad, f"volume_table {cfg['csv']}")
    warning = None if "target_size" in cfg else crop_warning(grids, spacing, size, bool(sides))
    records, column = resolve_duplicates(records, column, bad)
    parts = split_records(records, cfg, seed, column, spec.stratum)
    level, chosen = augment_level(cfg, 3)
    train_loader = VolumeLoader(spacing, size, method, build_augmentation(level, 3))
    task = TaskInfo(spec.task_type, "volume3d", spec.num_outputs, (1, *size), spec.class_names,
                    **spec.targets(parts["train"]))
    return DataBundle(RecordDataset(parts["train"], train_loader), RecordDataset(parts["val"], plain),
                      RecordDataset(parts["test"], plain), task, skipped=bad.count,
                      warnings=[warning] if warning else [], defaults=chosen,
                      preprocessing=Preprocessing.of(kind, task, spacing=spacing, normalize=method,
                                                     subtract=bool(subtract), split_sides=bool(sides)))
