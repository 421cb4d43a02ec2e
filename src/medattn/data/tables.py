"""CSV tables of samples: reading, path resolution, label parsing, bad-sample handling and a Dataset of records.

Row numbers in messages are the CSV line numbers (the header is row 1), so ``labels.csv row 7`` is
the line a spreadsheet or ``sed -n 7p`` shows.
"""

from __future__ import annotations

import csv
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils.data import Dataset

from ..errors import UserError
from .base import CLASSIFICATION_TASKS
from .files import check_regular
from .options import require

#: Task types a label table can describe (segmentation labels come as label maps, not columns).
TABLE_TASKS = (*CLASSIFICATION_TASKS, "survival", "regression")
#: Task types whose label cells are real numbers (a follow-up time, a biomarker level), not class numbers.
NUMERIC_TASKS = ("survival", "regression")

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


def as_list(value, name: str) -> list[str]:
    """A column name or a list of column names."""
    values = [value] if isinstance(value, str) else list(value or [])
    if not values or not all(isinstance(v, str) and v for v in values):
        raise UserError(f"{name} must be a column name or a list of column names, got {value!r}")
    return values


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


@dataclass
class LabelSpec:
    """How label cells become label tensors: the task type, class names and the number of outputs."""

    task_type: str
    class_names: list[str]
    num_outputs: int

    def tensor(self, values: list[float]) -> torch.Tensor:
        """Parsed cells -> the label tensor; ValueError when they do not fit the task. Survival: ``[time, event]``
        with time >= 0 and event 0 (censored) or 1 (observed); regression: the values as they are."""
        if self.task_type == "survival":
            time, event = values
            if time < 0:
                raise ValueError(f"follow-up time {time:g} is negative")
            if event not in (0.0, 1.0):
                raise ValueError(f"event {event:g} is not 0 (censored) or 1 (event observed)")
            return torch.tensor(values, dtype=torch.float32)
        if self.task_type == "regression":
            return torch.tensor(values, dtype=torch.float32)
        if self.task_type == "multiclass":
            if values[0] >= self.num_outputs:
                raise ValueError(f"label {int(values[0])} is out of range for {self.num_outputs} classes")
            return torch.tensor(int(values[0]), dtype=torch.int64)
        if any(v not in (0.0, 1.0) for v in values):
            shown = int(values[0]) if len(values) == 1 else [int(v) for v in values]
            raise ValueError(f"label {shown} is not 0/1, as a {self.task_type} task needs")
        return torch.tensor(values, dtype=torch.float32)

    def targets(self, train: Sequence[Record]) -> dict:
        """``TaskInfo``'s ``target_mean`` and ``target_std`` for regression: per target over the training records
        (population std; a constant target gets 1, so it is only centred); empty for other tasks."""
        if self.task_type != "regression" or not train:
            return {}
        values = torch.stack([r.label for r in train]).double()
        std = values.std(0, correction=0)
        std = torch.where(std > 0, std, torch.ones_like(std))
        return {"target_mean": values.mean(0).tolist(), "target_std": std.tolist()}

    def stratum(self, label: torch.Tensor) -> str:
        """The key splits stratify by (:func:`medattn.data.splits.assign_splits`): the label of a class, the event
        flag of a survival label (so events spread over the splits), nothing for regression."""
        if self.task_type == "survival":
            return str(int(label[1]))
        return "" if self.task_type == "regression" else str(label.tolist())


def parse_cells(cells: list[str], columns: list[str], classes: list[str] | None,
                task_type: str | None = None) -> list[float]:
    """Label cells -> numbers (class indices when ``classes`` names them; any finite number for survival and
    regression, :data:`NUMERIC_TASKS`); ValueError with the reason."""
    if task_type in NUMERIC_TASKS:
        return [_finite(cell, column) for column, cell in zip(columns, cells)]
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


def _finite(cell: str, column: str) -> float:
    try:
        value = float(cell)
    except ValueError:
        raise ValueError(f"value {cell!r} in column {column!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"value {cell!r} in column {column!r} is not a finite number")
    return value


def label_columns(cfg: dict, kind: str) -> list[str]:
    """The label columns a table config names: ``label_columns`` (one or several); for ``task_type: survival``
    the ``time_column`` (follow-up time, any unit) and ``event_column`` (1 event, 0 censored), in that order."""
    if cfg.get("task_type") != "survival":
        if cfg.get("time_column") is not None or cfg.get("event_column") is not None:
            raise UserError(f"data kind {kind!r}: time_column and event_column describe a survival task; set "
                            f"task_type: survival")
        return as_list(require(cfg, "label_columns", kind), "label_columns")
    if cfg.get("label_columns") is not None:
        raise UserError(f"data kind {kind!r} with task_type: survival takes time_column and event_column, not "
                        f"label_columns")
    missing = [key for key in ("time_column", "event_column") if not cfg.get(key)]
    if missing:
        raise UserError(f"data kind {kind!r} with task_type: survival needs data.{' and data.'.join(missing)} (the "
                        f"follow-up time and the event flag, 1 event / 0 censored)")
    return [*as_list(cfg["time_column"], "time_column"), *as_list(cfg["event_column"], "event_column")]


#: An inferred class (no ``classes``/``num_classes`` declared) needs this many rows: fewer cannot reach
#: train, validation and test, and are most often a typo (a ``2`` in a 0/1 column).
MIN_CLASS_ROWS = 3


def infer_label_spec(values: list[list[float]], columns: list[str], task_type: str | None,
                     classes: list[str] | None, num_classes: int | None) -> LabelSpec:
    """Decide the task from the parsed labels unless ``task_type`` is given.

    Several columns: multi-label (0/1 each). One column: binary when there are two ``classes``,
    ``num_classes`` is 2, or (nothing declared) its values are 0/1; multi-class otherwise (classes
    0..K-1, K = ``num_classes``, the number of ``classes`` or the largest label + 1). Rows that do not
    fit are rejected by :meth:`LabelSpec.tensor`; an inferred class set is checked by
    :func:`inferred_class_problems`.
    """
    if task_type is not None and task_type not in TABLE_TASKS:
        raise UserError(f"task_type must be one of {TABLE_TASKS}, got {task_type!r}")
    if task_type == "survival":
        if len(columns) != 2:
            raise UserError(f"a survival task needs a time and an event column, got {columns}")
        return LabelSpec("survival", [], 1)
    if task_type == "regression":
        return LabelSpec("regression", list(columns), len(columns))
    seen = {v for row in values for v in row}
    if task_type is None:
        if len(columns) > 1:
            task_type = "multilabel"
        elif classes is not None:
            task_type = "binary" if len(classes) == 2 else "multiclass"
        elif num_classes is not None:
            task_type = "binary" if num_classes == 2 else "multiclass"
        else:
            task_type = "binary" if seen <= {0.0, 1.0} else "multiclass"
    if task_type != "multilabel" and len(columns) != 1:
        raise UserError(f"a {task_type} task needs one label column, got {columns}")
    if task_type == "multiclass":
        count = len(classes) if classes is not None else int(num_classes or (max(seen, default=0) + 1))
        names = list(classes) if classes is not None else [str(i) for i in range(count)]
        return LabelSpec("multiclass", names, count)
    names = [classes[1]] if task_type == "binary" and classes is not None else list(columns)
    return LabelSpec(task_type, names, len(columns))


def inferred_class_problems(values: list[list[float]], wheres: list[str], column: str, spec: LabelSpec,
                            declared: bool) -> tuple[list[str], set[int]]:
    """Check a multi-class set inferred from the labels (``declared`` False: no ``classes``/``num_classes``).

    -> (one problem per row of a class seen in fewer than :data:`MIN_CLASS_ROWS` rows, naming the row,
    the value and the counts of every class; the indices of those rows). A class 0..K-1 seen in no row
    is a :class:`UserError`. The inferred classes and their counts are logged as a warning, so an
    inferred task never goes unseen.
    """
    if declared or spec.task_type != "multiclass":
        return [], set()
    counts = {k: 0 for k in range(spec.num_outputs)}
    for row in values:
        counts[int(row[0])] = counts.get(int(row[0]), 0) + 1
    summary = ", ".join(f"{k}: {n}" for k, n in sorted(counts.items()))
    rare = {k for k, n in counts.items() if 0 < n < MIN_CLASS_ROWS}
    rows = {i for i, row in enumerate(values) if int(row[0]) in rare}
    problems = [f"{wheres[i]}: label {int(values[i][0])} in column {column!r} occurs in fewer than "
                f"{MIN_CLASS_ROWS} rows (rows per class {summary}); fix the row, or declare num_classes or "
                f"classes to keep such a class" for i in sorted(rows)]
    kept = sorted(k for k, n in counts.items() if n >= MIN_CLASS_ROWS)
    if kept != list(range(len(kept))):  # without the rare rows the classes would not be 0..K-1
        if problems:
            raise UserError(problems[0])
        raise UserError(f"label column {column!r} read as {spec.num_outputs} classes (rows per class {summary}), "
                        f"but some never occur; declare num_classes or classes, or number the classes 0..K-1")
    if not rows:
        log.warning("label column %r: no classes or num_classes given; read as a %d-class task (rows per class "
                    "%s)", column, len(kept), summary)
    return problems, rows


def label_options(cfg: dict) -> tuple[str | None, list[str] | None, int | None]:
    """The ``task_type``, ``classes`` and ``num_classes`` keys of a table config."""
    classes = cfg.get("classes")
    if classes is not None and (not isinstance(classes, list) or len(classes) < 2):
        raise UserError(f"classes must be a list of at least two class names, got {classes!r}")
    if classes is not None and len({str(c) for c in classes}) != len(classes):
        raise UserError(f"classes must be distinct names, got {classes!r}")
    num_classes = cfg.get("num_classes")
    if num_classes is not None and (not isinstance(num_classes, int) or isinstance(num_classes, bool)
                                    or num_classes < 2):
        raise UserError(f"num_classes must be an int >= 2, got {num_classes!r}")
    if num_classes is not None and classes is not None and num_classes != len(classes):
        raise UserError(f"num_classes ({num_classes}) differs from the {len(classes)} classes")
    return cfg.get("task_type"), None if classes is None else [str(c) for c in classes], num_classes


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
    from .splits import parse_split

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
    entries, problems = [], []  # (record, parsed labels, split)
    for number, row in rows:
        where = f"{csv_path.name} row {number}"
        try:
            paths = tuple(resolve_path(root, row[c], where) for c in (path_column, *extra_columns))
            split = parse_split(row[split_column], where) if split_column else None
            parsed = {side: parse_cells([row[c] for c in cols], cols, classes, task_type)
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


def label_entries(entries: list[tuple[Record, list[float], str | None]], label_columns: list[str],
                  cfg: dict) -> tuple[list[Record], LabelSpec, list[str | None], list[str]]:
    """(record, parsed label cells, split) -> records with label tensors, the spec, their splits and the
    problems of rows whose labels do not fit the task (or, for an inferred class set, belong to a class
    of too few rows: :func:`inferred_class_problems`; the spec is then inferred from the other rows)."""
    task_type, classes, num_classes = label_options(cfg)
    spec = infer_label_spec([e[1] for e in entries], label_columns, task_type, classes, num_classes)
    declared = classes is not None or num_classes is not None
    problems, rare = inferred_class_problems([e[1] for e in entries], [e[0].where for e in entries],
                                             label_columns[0], spec, declared)
    if rare:  # reported (or skipped): the task is the one the other rows describe
        entries = [e for i, e in enumerate(entries) if i not in rare]
        spec = infer_label_spec([e[1] for e in entries], label_columns, task_type, classes, num_classes)
    records, splits = [], []
    for record, values, split in entries:
        try:
            record.label = spec.tensor(values)
        except ValueError as exc:
            problems.append(f"{record.where}: {exc}")
            continue
        records.append(record)
        splits.append(split)
    return records, spec, splits, problems


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
