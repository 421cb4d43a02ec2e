"""One split's per-sample results, as every objective gathers them (:mod:`medattn.train.objectives`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Predictions:
    """One split's per-sample results in dataset order (see the objective's :meth:`outputs`).

    Classification: ``outputs`` = probabilities (N, K), ``labels`` (N, K) or (N,) class indices.
    Segmentation: ``outputs`` = per-class Dice (N, K), ``labels`` = label voxels per class (N, K).
    Survival: ``outputs`` = risk scores (N, 1), ``labels`` = ``[time, event]`` (N, 2).
    Regression: ``outputs`` = predicted values in the targets' units (N, K), ``labels`` = the targets (N, K).
    """

    ids: list[str]
    patients: list[str]
    outputs: np.ndarray
    labels: np.ndarray
    loss: float
    statistic: np.ndarray | None = None  # (N,) a trivial statistic per sample (image mean, bag size), or None


def refuse_classification_options(task, loss: str | None, label_smoothing: float, pos_weight) -> None:
    """A UserError when ``train.loss`` names no loss of the task's type (:attr:`TaskType.losses`, null always fits) or
    ``train.label_smoothing``/``train.pos_weight`` are set: the options of a task without classes (survival,
    regression) checked by its objective's ``create``."""
    from medattn.errors import UserError
    from medattn.vocabulary import task_types

    losses = task_types.of(task.task_type).losses
    if loss not in (None, *losses) or label_smoothing or pos_weight is not None:
        raise UserError(f"train.label_smoothing and train.pos_weight do not apply to a {task.task_type} task "
                        f"(leave them null / 0); train.loss: null" + (f", {' or '.join(losses)}" if losses else ""))
