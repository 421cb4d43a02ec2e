"""CSV tables of samples: reading, path resolution, label parsing, bad-sample handling and a Dataset of records.

Row numbers in messages are the CSV line numbers (the header is row 1), so ``labels.csv row 7`` is
the line a spreadsheet or ``sed -n 7p`` shows.
"""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils.data import Dataset

from ..errors import UserError
from .base import TASK_TYPES

log = logging.getLogger("medattn.data")


@dataclass
class Record:
    """One sample before loading: where it comes from (``where`` = "file.csv row N") and its label."""

    id: str
    patient: str
    where: str
    paths: tuple[Path, ...]
    label: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)


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
    if not path.is_file():
        raise UserError(f"{what} {path}: file not found")
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


def as_list(value, name: str) -> list[str]:
    """A column name or a list of column names."""
    values = [value] if isinstance(value, str) else list(value or [])
    if not values or not all(isinstance(v, str) and v for v in values):
        raise UserError(f"{name} must be a column name or a list of column names, got {value!r}")
    return values


def resolve_path(root: Path, value: str, where: str) -> Path:
    """``value`` relative to ``root`` (or absolute); a path resolving outside ``root`` is an error."""
    if not value:
        raise UserError(f"{where}: empty path")
    path = (root / value).resolve()
    if not path.is_relative_to(root.resolve()):
        raise UserError(f"{where}: path {value!r} resolves to {path}, outside the data root {root}")
    return path


@dataclass
class LabelSpec:
    """How label cells become label tensors: the task type, class names and the number of outputs."""

    task_type: str
    class_names: list[str]
    num_outputs: int

    def tensor(self, values: list[float]) -> torch.Tensor:
        if self.task_type == "multiclass":
            return torch.tensor(int(values[0]), dtype=torch.int64)
        return torch.tensor(values, dtype=torch.float32)


def parse_cells(cells: list[str], columns: list[str], classes: list[str] | None) -> list[float]:
    """Label cells -> numbers (class indices when ``classes`` names them); ValueError with the reason."""
    values = []
    for column, cell in zip(columns, cells):
        if classes is not None:
            if cell not in classes:
                raise ValueError(f"label {cell!r} in column {column!r} is not one of the classes {classes}")
            values.append(float(classes.index(cell)))
            continue
        try:
            value = float(cell)
        except ValueError:
            raise ValueError(f"label {cell!r} in column {column!r} is not a number") from None
        if not math.isfinite(value) or value != int(value) or value < 0:
            raise ValueError(f"label {cell!r} in column {column!r} is not a non-negative integer")
        values.append(value)
    return values


def infer_label_spec(values: list[list[float]], columns: list[str], task_type: str | None,
                     classes: list[str] | None, num_classes: int | None) -> LabelSpec:
    """Decide the task from the parsed labels unless ``task_type`` is given.

    Several columns: multi-label (0/1 each). One column: binary when its values are 0/1 (or two
    ``classes``), multi-class otherwise (classes 0..K-1, K = ``num_classes`` or max + 1).
    """
    if task_type is not None and task_type not in TASK_TYPES:
        raise UserError(f"task_type must be one of {TASK_TYPES}, got {task_type!r}")
    seen = {v for row in values for v in row}
    if task_type is None:
        if len(columns) > 1:
            task_type = "multilabel"
        elif classes is not None:
            task_type = "binary" if len(classes) == 2 else "multiclass"
        else:
            task_type = "binary" if seen <= {0.0, 1.0} and num_classes in (None, 2) else "multiclass"
    if task_type == "multiclass":
        if len(columns) != 1:
            raise UserError(f"a multiclass task needs one label column, got {columns}")
        count = len(classes) if classes is not None else int(num_classes or (max(seen, default=0) + 1))
        if seen and max(seen) >= count:
            raise UserError(f"label {int(max(seen))} is out of range for {count} classes")
        names = list(classes) if classes is not None else [str(i) for i in range(count)]
        return LabelSpec("multiclass", names, count)
    if not seen <= {0.0, 1.0}:
        raise UserError(f"a {task_type} task needs 0/1 labels in {', '.join(columns)}; found {sorted(seen)[:5]}")
    if task_type == "binary" and len(columns) != 1:
        raise UserError(f"a binary task needs one label column, got {columns}")
    names = [classes[1]] if task_type == "binary" and classes is not None else list(columns)
    return LabelSpec(task_type, names, len(columns))


def label_options(cfg: dict) -> tuple[str | None, list[str] | None, int | None]:
    """The ``task_type``, ``classes`` and ``num_classes`` keys of a table config."""
    classes = cfg.get("classes")
    if classes is not None and (not isinstance(classes, list) or len(classes) < 2):
        raise UserError(f"classes must be a list of at least two class names, got {classes!r}")
    num_classes = cfg.get("num_classes")
    return cfg.get("task_type"), None if classes is None else [str(c) for c in classes], num_classes


class RecordDataset(Dataset):
    """Samples loaded on access by ``load(record) -> {"input": ..., ...}``; ``transform`` augments the input.

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
        return {**sample, "label": record.label, "id": record.id, "patient": record.patient}


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


def problem(record: Record, exc: Exception) -> str:
    """One line: "<table> row <n>: <files>: <what went wrong>"."""
    files = ", ".join(str(p) for p in record.paths)
    reason = str(exc) if isinstance(exc, (UserError, ValueError, FileNotFoundError)) else f"{type(exc).__name__}: {exc}"
    return f"{record.where}: {files}: {reason}".replace("\n", " ")
