"""What self-supervised pretraining reads: the task's training cases without their labels, and an unlabelled pool.

The pool (``pretrain.pool``) is a CSV with the data config's path column (``data.path_column``, default
``path``) and nothing else required: no label, no split. Its files are read by the training split's own
reader, preprocessing and augmentation (the data kind's loader, :attr:`RecordDataset.load`), so pretraining sees
what training sees; its relative paths are relative to the CSV's folder (``data_root`` of the pool is that
folder). Validation and test cases are never pretrained on: a pool file that is one of the config's validation or
test images (the same file, by its real path) is left out and counted (``pool_held_out``), and a pool of nothing else
is refused.
"""

from __future__ import annotations

import os
from pathlib import Path

from torch.utils.data import ConcatDataset, Dataset

from medattn.data.base import DataBundle
from medattn.data.tables import Record, RecordDataset, read_csv, require_columns, resolve_path
from medattn.errors import UserError


def pool_records(table: str | Path, path_column: str = "path") -> list[Record]:
    """One record per row of the unlabelled table (no label); a one-line UserError for a missing column,
    a path outside the table's folder or an empty table."""
    table = Path(table)
    header, rows = read_csv(table, "unlabelled pool")
    require_columns(header, [path_column], table, "unlabelled pool")
    root = table.absolute().parent
    records = []
    for number, row in rows:
        where = f"{table.name} row {number}"
        path = resolve_path(root, row[path_column], where)
        if not path.is_file():
            raise UserError(f"{where}: {path} is not a file")
        records.append(Record(id=row[path_column], patient=row[path_column], where=where, paths=(path,),
                              extra={"side": None}))
    if not records:
        raise UserError(f"unlabelled pool {table}: the table lists no file")
    return records


def pretraining_set(bundle: DataBundle, data_cfg: dict, pool: str | Path | None) -> tuple[Dataset, dict]:
    """The training split (labels unused) and, with ``pool``, the pool's files read like it, less those of the
    validation and test splits; -> (dataset, what it holds: ``{"train_cases": n, "pool": path, "pool_cases": m}``,
    with a pool also ``"pool_held_out"``: the pool files left out)."""
    described = {"train_cases": len(bundle.train), "pool": None, "pool_cases": 0}
    if pool is None:
        return bundle.train, described
    if not isinstance(bundle.train, RecordDataset):
        raise UserError(f"pretrain.pool: data kind {data_cfg.get('kind')!r} is not read from a table; an unlabelled "
                        f"pool needs image_table, volume_table or wsi_bags data")
    records = pool_records(pool, data_cfg.get("path_column", "path"))
    held = held_out_files(bundle)
    kept = [r for r in records if not any(os.path.realpath(path) in held for path in r.paths)]
    if not kept:
        raise UserError(f"unlabelled pool {pool}: every file it lists is one of the config's validation or test "
                        f"images, which are never pretrained on")
    described.update(pool=str(pool), pool_cases=len(kept), pool_held_out=len(records) - len(kept))
    records = kept
    return ConcatDataset([bundle.train, RecordDataset(records, bundle.train.load, bundle.train.transform)]), described


def held_out_files(bundle: DataBundle) -> set[str]:
    """The real paths of every file the validation and test splits read (table kinds; a split generated from a seed
    reads none)."""
    held = set()
    for split in (bundle.val, bundle.test):
        for record in getattr(split, "records", None) or []:
            held.update(os.path.realpath(path) for path in record.paths)
    return held
