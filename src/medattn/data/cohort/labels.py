"""Label cells to label tensors: the task a label table describes.

:class:`LabelSpec` turns parsed cells into label tensors; :func:`parse_cells` parses them (class names, class
indices, or the real numbers of survival and regression); :func:`infer_label_spec` decides the task from the labels
unless the config names it, :func:`inferred_class_problems` checks a class set inferred from them; the label keys of a
table config are read by :func:`label_columns` and :func:`label_options`; :func:`label_entries` labels the rows a
table reader parsed (:mod:`medattn.data.tables`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ...errors import UserError
from ...vocabulary.task_types import TASK_TYPES, TaskType, names_where, task_type
from ..options import require

if TYPE_CHECKING:
    from ...vocabulary.record import Record

#: Task types a label table can describe (segmentation labels come as label maps, not columns).
TABLE_TASKS = names_where("table")
#: Task types whose label cells are real numbers (a follow-up time, a biomarker level), not class numbers.
NUMERIC_TASKS = names_where("numeric")

log = logging.getLogger("medattn.data")


def as_list(value, name: str) -> list[str]:
    """A column name or a list of column names."""
    values = [value] if isinstance(value, str) else list(value or [])
    if not values or not all(isinstance(v, str) and v for v in values):
        raise UserError(f"{name} must be a column name or a list of column names, got {value!r}")
    return values


@dataclass
class LabelSpec:
    """How label cells become label tensors: the task type, class names and the number of outputs."""

    task_type: str
    class_names: list[str]
    num_outputs: int

    @property
    def kind(self) -> TaskType:
        """The task type (:mod:`medattn.vocabulary.task_types`)."""
        return task_type(self.task_type)

    def tensor(self, values: list[float]) -> torch.Tensor:
        """Parsed cells -> the label tensor (:meth:`~medattn.vocabulary.task_types.TaskType.tensor`); ValueError when
        they do not fit the task. Survival: ``[time, event]`` with time >= 0 and event 0 (censored) or 1 (observed);
        regression: the values as they are. A value beyond float32's range (the tensors' dtype) is refused, as it
        would become inf."""
        if self.kind.numeric:
            _check_float32(values)
        return self.kind.tensor(values, self.num_outputs)

    def targets(self, train: Sequence[Record]) -> dict:
        """``TaskInfo``'s ``target_mean`` and ``target_std`` for regression: per target over the training records
        (population std; a constant target gets 1, so it is only centred); empty for other tasks."""
        if not train:
            return {}
        return self.kind.targets(torch.stack([r.label for r in train]))

    def stratum(self, label: torch.Tensor) -> str:
        """The key splits stratify by (:func:`medattn.data.cohort.splits.assign_splits`): the label of a class, the
        event flag of a survival label (so events spread over the splits), nothing for regression."""
        return self.kind.stratum(label)


#: The largest float32: label tensors are float32, so a larger time or target would become inf.
FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def _check_float32(values: list[float]) -> None:
    """ValueError for a value a float32 label tensor cannot hold (it would train on inf)."""
    for value in values:
        if abs(value) > FLOAT32_MAX:
            raise ValueError(f"value {value:g} is too large for float32 (largest {FLOAT32_MAX:.3g}): rescale the "
                             f"column (other units)")


def parse_cells(cells: list[str], columns: list[str], classes: list[str] | None,
                task_type: str | None = None, events: dict[str, float] | None = None) -> list[float]:
    """Label cells -> numbers (class indices when ``classes`` names them; any finite number for survival and
    regression, :data:`NUMERIC_TASKS`; a survival event cell through ``events``, :func:`event_values`); ValueError
    with the reason."""
    kind = TASK_TYPES.get(task_type)
    if kind and kind.events and len(cells) == 2:
        return [_finite(cells[0], columns[0]), _event(cells[1], columns[1], events or {}, kind.causes)]
    if kind and kind.numeric:
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


def _declared(name) -> TaskType | None:
    """The task type a config declares (``data.task_type``), None where it declares none (inferred from the labels);
    a UserError for a type a label table cannot describe."""
    if name is None:
        return None
    if name not in TABLE_TASKS:
        raise UserError(f"task_type must be one of {TABLE_TASKS}, got {name!r}")
    return task_type(name)


def _finite(cell: str, column: str) -> float:
    try:
        value = float(cell)
    except ValueError:
        raise ValueError(f"value {cell!r} in column {column!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"value {cell!r} in column {column!r} is not a finite number")
    return value


#: The cells PyYAML reads as true/false (YAML 1.1): ``data.event_values: {yes: 1, no: 0}`` has bool keys.
_YAML_BOOLS = {True: ("yes", "true", "on"), False: ("no", "false", "off")}


def event_values(cfg: dict) -> dict[str, float] | None:
    """``data.event_values``: how the event column's cells map to 1 (event observed) and 0 (censored), e.g.
    ``{yes: 1, no: 0}``, ``{dead: 1, alive: 0}`` or ``{2: 1, 1: 0}``; for ``task_type: competing_risks`` to 0
    (censored) or a cause 1..K, e.g. ``{alive: 0, cancer: 1, other: 2}`` -> {cell text: number}, None when not
    given. Keys are matched to the cell's text (spaces around it ignored); a key YAML reads as a bool (yes/no,
    true/false, on/off, unquoted) matches those words in any case. Only for task types with events; a UserError
    otherwise."""
    given = cfg.get("event_values")
    if given is None:
        return None
    kind = _declared(cfg.get("task_type"))
    if not getattr(kind, "events", False):
        raise UserError("data.event_values maps the event column of a survival task; set task_type: survival "
                        "(or competing_risks)")
    causes = getattr(kind, "causes", False)
    codes = "0 (censored) or a cause 1..K" if causes else "1 (event observed) or 0 (censored)"
    if not isinstance(given, dict) or not given:
        example = "{alive: 0, cancer: 1, other: 2}" if causes else "{yes: 1, no: 0}"
        raise UserError(f"data.event_values must map the event column's values to {codes}, e.g. {example}; got "
                        f"{given!r}")
    mapped: dict[str, float] = {}
    for key, value in given.items():
        allowed = isinstance(value, int) and value >= 0 if causes else value in (0, 1)
        if isinstance(value, bool) or not allowed:
            raise UserError(f"data.event_values: {key!r} maps to {value!r}; each value must be {codes}")
        texts = [*_YAML_BOOLS[key], *(t.upper() for t in _YAML_BOOLS[key]),
                 *(t.title() for t in _YAML_BOOLS[key])] if isinstance(key, bool) else [str(key).strip()]
        mapped.update({text: float(value) for text in texts})
    return mapped


def _event(cell: str, column: str, events: dict[str, float], causes: bool = False) -> float:
    """An event cell -> its number by ``events`` (:func:`event_values`), else as a number (checked later by
    :meth:`LabelSpec.tensor`: 0/1, or 0..K with ``causes``); text that is neither is a ValueError saying which codes
    are expected and how to map it."""
    text = cell.strip()
    if text in events:
        return events[text]
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isfinite(value):
        return value
    codes = "0 (censored) or a cause 1..K" if causes else "1 (event observed) or 0 (censored)"
    if events:
        how = f" (data.event_values maps {', '.join(sorted(events))})"
    elif causes:
        how = "; map the column's values with data.event_values, e.g. {alive: 0, cancer: 1, other: 2}"
    else:
        example = "{true: 1, false: 0}" if text.lower() in ("true", "false", "on", "off") else "{yes: 1, no: 0}"
        how = f"; map the column's values with data.event_values, e.g. {example}"
    raise ValueError(f"event {cell!r} in column {column!r} is not {codes}{how}")


def label_columns(cfg: dict, kind: str) -> list[str]:
    """The label columns a table config names: ``label_columns`` (one or several); for ``task_type: survival``
    the ``time_column`` (follow-up time, any unit) and ``event_column`` (1 event, 0 censored; other values through
    ``event_values``, :func:`event_values`), in that order."""
    declared = _declared(cfg.get("task_type"))
    if not getattr(declared, "events", False):
        if any(cfg.get(key) is not None for key in ("time_column", "event_column", "event_values")):
            raise UserError(f"data kind {kind!r}: time_column, event_column and event_values describe a survival "
                            f"task; set task_type: survival (or competing_risks)")
        return as_list(require(cfg, "label_columns", kind), "label_columns")
    if cfg.get("label_columns") is not None:
        raise UserError(f"data kind {kind!r} with task_type: {declared.name} takes time_column and event_column, "
                        f"not label_columns")
    missing = [key for key in ("time_column", "event_column") if not cfg.get(key)]
    if missing:
        flag = "0 censored / 1..K the cause" if getattr(declared, "causes", False) else "1 event / 0 censored"
        raise UserError(f"data kind {kind!r} with task_type: {declared.name} needs data."
                        f"{' and data.'.join(missing)} (the follow-up time and the event flag, {flag})")
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
    if task_type is None:
        seen = {v for row in values for v in row}
        if len(columns) > 1:
            task_type = "multilabel"
        elif classes is not None:
            task_type = "binary" if len(classes) == 2 else "multiclass"
        elif num_classes is not None:
            task_type = "binary" if num_classes == 2 else "multiclass"
        else:
            task_type = "binary" if seen <= {0.0, 1.0} else "multiclass"
    kind = _declared(task_type)
    seen = {row[-1] for row in values} if kind.events else {v for row in values for v in row}  # events: event cells
    names, count = kind.table_spec(columns, classes, num_classes, seen)
    return LabelSpec(kind.name, names, count)


def inferred_class_problems(values: list[list[float]], wheres: list[str], column: str, spec: LabelSpec,
                            declared: bool) -> tuple[list[str], set[int]]:
    """Check a multi-class set inferred from the labels (``declared`` False: no ``classes``/``num_classes``).

    -> (one problem per row of a class seen in fewer than :data:`MIN_CLASS_ROWS` rows, naming the row,
    the value and the counts of every class; the indices of those rows). A class 0..K-1 seen in no row
    is a :class:`UserError`. The inferred classes and their counts are logged as a warning, so an
    inferred task never goes unseen.
    """
    if declared or not spec.kind.class_index:
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
    """The ``task_type``, ``classes`` and ``num_classes`` keys of a table config; a competing-risks task's
    ``cause_names`` are its classes (the names of its outputs, cause 1 first)."""
    classes = cfg.get("classes")
    if cfg.get("cause_names") is not None:
        if not getattr(_declared(cfg.get("task_type")), "causes", False) or classes is not None:
            raise UserError("data.cause_names names the causes 1..K of a competing_risks task's event column (set "
                            "task_type: competing_risks; not with data.classes)")
        classes = cfg["cause_names"]
        if not isinstance(classes, list) or len(classes) < 2:
            raise UserError(f"data.cause_names must list two or more causes 1..K in order (one cause: task_type: "
                            f"survival), got {classes!r}")
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
