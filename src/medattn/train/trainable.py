"""Tables a survival or regression model cannot learn from, refused before the first epoch with the reason.

Without these checks such a table trained an epoch and then failed on a symptom: a Cox loss of 0 in every batch (no
event), a validation score that does not exist (a C-index without a comparable pair, an R^2 of a constant target).
:func:`check_trainable` reads the training and validation labels (a table's records, no file decoded) and raises a
:class:`~medattn.errors.UserError` naming what is missing:

* survival: no event at all (every case censored); a single event (the training split and the validation split each
  need one); no event in the training split (the Cox partial likelihood learns from events); no comparable pair in
  the validation split (Harrell's C-index, the score that keeps the best epoch, is undefined);
* regression: a target constant in the training split (nothing to learn; it has no scale to standardise by) or in
  the validation split (R^2 is undefined).

A target or time too large for float32 (the label tensors' dtype) is refused earlier, row by row
(:meth:`medattn.data.cohort.labels.LabelSpec.tensor`). Classification and segmentation are not checked here.
"""

from __future__ import annotations

import numpy as np

from medattn.data.base import DataBundle, TaskInfo, dataset_labels
from medattn.errors import UserError
from medattn.vocabulary import task_types


def check_trainable(bundle: DataBundle) -> None:
    """Raise a UserError when ``bundle``'s training and validation labels cannot train its survival or regression
    task (see the module docstring); nothing for other tasks."""
    task = bundle.task
    kind = task_types.of(task.task_type)
    if not kind.numeric:
        return
    train, val = (dataset_labels(split).double().numpy().reshape(len(split), -1) for split in (bundle.train,
                                                                                                  bundle.val))
    problem = survival_problem(train, val, kind.causes) if kind.events else regression_problem(task, train, val)
    if problem:
        raise UserError(f"this table cannot train a {task.task_type} model: {problem}")


def _has_pair(time: np.ndarray, event: np.ndarray) -> bool:
    """Whether an event precedes another case's time (or meets a censoring at its time): a comparable pair."""
    if not event.any():
        return False
    first = time[event].min()
    return bool((time > first).any() or ((time == first) & ~event).any())


def survival_problem(train: np.ndarray, val: np.ndarray, causes: bool = False) -> str | None:
    """Why ``[time, event]`` labels (N, 2) of the training and validation splits cannot train a Cox model, or None;
    ``causes``: the event cell is a cause 1..K (competing risks), and cause 1's C-index keeps the best epoch."""
    n, events = len(train) + len(val), int((train[:, 1] > 0).sum() + (val[:, 1] > 0).sum())
    if events == 0:
        return (f"no event: all {n} training and validation cases are censored (event 0); a survival model learns "
                f"from observed events (event 1): check data.event_column and its values")
    if events == 1:
        return (f"only 1 event among {n} training and validation cases: the training split needs events to learn "
                f"from and the validation split events to score (C-index)")
    if not train[:, 1].any():
        return (f"the training split has no event ({len(train)} cases, all censored; {events} events in the "
                f"validation split): the Cox loss learns from events; set data.split_column or other fractions")
    if not _has_pair(val[:, 0], val[:, 1] == 1 if causes else val[:, 1] > 0):
        return (f"the validation split ({len(val)} cases, {int((val[:, 1] > 0).sum())} events) has no comparable "
                f"pair {'of cause 1 ' if causes else ''}(an "
                f"event before another case's time), so the C-index that keeps the best epoch is undefined; give it "
                f"more cases or events (data.val_fraction, data.split_column)")
    return None


def regression_problem(task: TaskInfo, train: np.ndarray, val: np.ndarray) -> str | None:
    """Why targets (N, K) of the training and validation splits cannot train a regression model, or None."""
    names = task.class_names if len(task.class_names) == train.shape[1] else [str(k) for k in range(train.shape[1])]
    for split, values in (("training", train), ("validation", val)):
        for k, name in enumerate(names):
            column = values[:, k]
            if len(column) and np.all(column == column[0]):
                why = ("nothing to learn" if split == "training" else
                       "R^2, the score that keeps the best epoch, is undefined")
                return (f"target {name!r} is constant in the {split} split (all {len(column)} cases are "
                        f"{column[0]:g}): {why}")
    return None
