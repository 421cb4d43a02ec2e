"""CSV tables of samples: reading, path resolution, bad-sample handling and a Dataset of records; the label
columns are parsed by :mod:`medattn.data.cohort.labels`.

Row numbers in messages are the CSV line numbers (the header is row 1), so ``labels.csv row 7`` is
the line a spreadsheet or ``sed -n 7p`` shows.
"""

from __future__ import annotations

import csv
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch.utils.data import Dataset

from ..errors import UserError
from ..vocabulary.record import Record
from .cohort.labels import LabelSpec, event_values, label_entries, label_options, parse_cells
from .files import check_regular

log = logging.getLogger("medattn.data")


class BadSamples:
    """Raise the first problem (``skip_bad=False``) or log it, count it and let the caller drop the sample."""

    def __init__(self, skip_bad: bool) -> None:
        self.skip_bad = skip_bad
        self.count = 0

    def report(self, message: str) -> None:
        if not self.skip_bad:
            raise UserError(message)
        self.count += 1
        log.warning("skipped: %s", message)


def read_csv(path: str | Path, what: str = "table") -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    """-> (column names, [(row number, {column: value})]); values are stripped strings."""
    path = Path(path)
    try:
        check_regular(path)
    except (OSError, ValueError) as exc:
        looked = "" if path.is_absolute() else f" (looked at {path.absolute()})"
        raise UserError(f"{what} {path}: {exc}{looked}") from None
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            header = [h.strip() for h in next(reader, [])]
            rows = []
            for row in reader:
                if not any(cell.strip() for cell in row):
                    continue
                if len(row) != len(header):
                    raise UserError(f"{what} {path} row {reader.line_num}: {len(row)} fields, the header has "
                                    f"{len(header)}")
                rows.append((reader.line_num, {h: v.strip() for h, v in zip(header, row)}))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise UserError(f"{what} {path}: not a readable CSV file ({exc})") from None
    if not header or not rows:
        raise UserError(f"{what} {path}: no header or no rows")
    return header, rows


def require_columns(header: Sequence[str], columns: Sequence[str], path: str | Path, what: str = "table") -> None:
    """A one-line error naming the missing columns and the ones present."""
    missing = [c for c in columns if c not in header]
    if missing:
        raise UserError(f"{what} {path}: missing column(s) {', '.join(missing)}; columns are {', '.join(header)}")


def resolve_path(root: Path, value: str, where: str) -> Path:
    """``value`` relative to ``root`` (or absolute); a path leaving ``root`` is an error, and so is one
    naming a named pipe, socket or device (a reader would block on it or read without end).

    The root check is lexical (``..`` and absolute paths), so symbolic links inside the root may point
    anywhere, as they often do for shared data sets. A missing path is left to the file checks.
    """
    if not value:
        raise UserError(f"{where}: empty path")
    base = Path(os.path.abspath(root))
    path = Path(os.path.abspath(base / value))
    if not path.is_relative_to(base):
        raise UserError(f"{where}: path {value!r} resolves to {path}, outside the data root {base}")
    try:
        check_regular(path, folders=True)
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:
        raise UserError(f"{where}: {path}: {exc}") from None
    return path


class RecordDataset(Dataset):
    """Samples loaded on access by ``load(record) -> {"input": ..., ...}``; ``transform`` augments the input.

    The label is the record's unless ``load`` returns one (a segmentation label map).

    A failure while loading (a corrupt file, wrong content) becomes a one-line
    :class:`~medattn.errors.UserError` naming the file and the table row.
    """

    def __init__(self, records: list[Record], load: Callable[[Record], dict],
                 transform: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.records = records
        self.load = load
        self.transform = transform

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict:
        record = self.records[index]
        try:
            sample = self.load(record)
        except Exception as exc:  # any reader's failure on a bad file becomes one line naming it
            raise UserError(problem(record, exc)) from None
        if self.transform is not None:
            sample["input"] = self.transform(sample["input"])
        return {"label": record.label, **sample, "id": record.id, "patient": record.patient}


def check_records(records: list[Record], check: Callable[[Record], None], bad: BadSamples) -> list[Record]:
    """Keep the records that pass ``check`` (which raises on a problem); report the others to ``bad``."""
    kept = []
    for record in records:
        try:
            check(record)
        except Exception as exc:  # a reader's failure on a bad file: report it and drop the sample
            bad.report(problem(record, exc))
            continue
        kept.append(record)
    return kept


def table_records(cfg: dict, kind: str, label_columns: list[str], extra_columns: Sequence[str] = (),
                  sides: Sequence[str] = ()) -> tuple[list[Record], LabelSpec, list[str] | None, list[str]]:
    """Read the CSV of an image or volume table.

    -> (records, label spec, split names from the split column or None, problems). Rows whose labels do
    not parse, whose split is unknown or whose path leaves ``data_root`` become problem messages.
    ``extra_columns`` hold further paths (e.g. the subtraction series). With ``sides`` (e.g. left,
    right) each row gives one record per side, labelled from the columns ``<label column>_<side>``
    and with ``extra["side"]`` set.
    """
    from .cohort.splits import parse_split

    csv_path = Path(cfg["csv"])
    root = Path(cfg.get("data_root") or csv_path.parent)
    path_column = cfg.get("path_column", "path")
    patient_column, split_column = cfg.get("patient_column"), cfg.get("split_column")
    header, rows = read_csv(csv_path, "table")
    per_side = {side: [f"{c}_{side}" for c in label_columns] for side in sides} or {None: label_columns}
    wanted = [path_column, *(c for cols in per_side.values() for c in cols), *extra_columns,
              *(c for c in (patient_column, split_column) if c)]
    require_columns(header, wanted, csv_path)
    task_type, classes, _ = label_options(cfg)
    events = event_values(cfg)
    entries, problems = [], []  # (record, parsed labels, split)
    for number, row in rows:
        where = f"{csv_path.name} row {number}"
        try:
            paths = tuple(resolve_path(root, row[c], where) for c in (path_column, *extra_columns))
            split = parse_split(row[split_column], where) if split_column else None
            parsed = {side: parse_cells([row[c] for c in cols], cols, classes, task_type, events)
                      for side, cols in per_side.items()}
        except (UserError, ValueError) as exc:
            message = str(exc)
            problems.append(message if message.startswith(where) else f"{where}: {message}")
            continue
        patient = row[patient_column] if patient_column else row[path_column]
        for side, values in parsed.items():
            sample_id = row[path_column] if side is None else f"{row[path_column]}#{side}"
            record = Record(id=sample_id, patient=patient, where=where, paths=paths, extra={"side": side})
            entries.append((record, values, split))
    records, spec, splits, label_problems = label_entries(entries, label_columns, cfg)
    return records, spec, (splits if split_column else None), problems + label_problems



def keep_valid(records: list[Record], column: list[str] | None, check: Callable[[Record], object] | None,
               bad: BadSamples, what: str) -> tuple[list[Record], list[str] | None]:
    """Drop the records failing ``check`` (reported to ``bad``), keeping the split column aligned."""
    if check is not None:
        passed = {id(r) for r in check_records(records, check, bad)}
        if column is not None:
            column = [c for r, c in zip(records, column) if id(r) in passed]
        records = [r for r in records if id(r) in passed]
    if not records:
        raise UserError(f"{what}: no usable samples")
    return records, column


def problem(record: Record, exc: Exception) -> str:
    """One line: "<table> row <n>: <files>: <what went wrong>"."""
    files = ", ".join(str(p) for p in record.paths)
    reason = str(exc) if isinstance(exc, (UserError, ValueError, FileNotFoundError)) else f"{type(exc).__name__}: {exc}"
    return f"{record.where}: {files}: {reason}".replace("\n", " ")
