"""Did a run learn? Judged against a constant predictor, not only against its own first epoch.

A run **did not learn** (``verdict["learned"] is False``, with the reasons) when either holds:

* at no epoch was its mean train loss lower than the loss of the best *constant* predictor under the same
  training objective (label smoothing and ``pos_weight`` included; with
  ``class_balance`` the classes weigh equally): for a balanced binary task that is ln 2 = 0.693, the entropy
  of the label prior. A model that fits its own
  training data no better than the label prior has learned nothing, whatever one validation figure says;
* its best validation AUROC (the maximum over the epochs, an optimistic figure) lies inside the interval
  that a model scoring at random reaches with the same numbers of positives and negatives:
  ``|AUROC - 0.5| <= z * se0``, ``se0 = sqrt((n1 + n0 + 1) / (12 n1 n0))`` (the Mann-Whitney null, Hanley &
  McNeil 1982), z for ``eval.ci``; per output averaged for multi-class (one-vs-rest) and multi-label;
* segmentation: the best validation Dice is below :data:`DICE_FLOOR`;
* survival: the constant predictor is a constant risk (every sample equally at risk), its Cox loss measured on
  batches of the training batch size; chance is the C-index interval of randomly permuted risks
  (:meth:`~medattn.train.survival_objective.Survival.chance_interval`);
* regression: the constant predictor is the best constant under the Huber loss; chance is a best validation
  R^2 at or below the squared correlation a predictor unrelated to the targets reaches
  (:meth:`~medattn.train.regression_objective.Regression.chance_interval`; 0.064 for 60 validation cases).

Two warnings that do not make the verdict: a lowest train loss within :data:`NEAR_CONSTANT` of the constant
predictor's ("barely below a constant predictor"), and a budget that looks too short (the best epoch is the
last and the validation score rose over the last quarter of the epochs). The lowest epoch, not the last or
the kept one: an epoch's mean train loss lags (epoch 1's includes the random start), and a run that fitted,
then fell back (TransMIL on the realistic bags: validation AUROC 0.90 at epoch 13, train loss back above
ln 2 by epoch 20) keeps its good checkpoint.

``compare`` and ``cv`` mark an arm with a run that did not learn, keep it out of the paired tests and say why.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from medattn.vocabulary import task_types

CONSTANT_FRACTION = 1.0
NEAR_CONSTANT = 0.95
DICE_FLOOR = 0.01


def constant_loss(objective, labels: torch.Tensor, weights: torch.Tensor | None = None) -> float:
    """The lowest mean training loss any constant logits reach on ``labels`` ((N, K) or (N,) class indices),
    samples weighted by ``weights`` (N,) when given; found by L-BFGS over the K logits (the loss is convex)."""
    k = labels.shape[1] if labels.ndim == 2 else int(labels.max()) + 1
    logits = torch.zeros(k, dtype=torch.float64, requires_grad=True)
    weights = torch.ones(len(labels), dtype=torch.float64) if weights is None else weights.double()
    weights = weights / weights.sum()
    optimizer = torch.optim.LBFGS([logits], max_iter=200, line_search_fn="strong_wolfe")

    def mean_loss() -> torch.Tensor:
        return (objective.loss(logits.expand(len(labels), k), labels, per_sample=True).double() * weights).sum()

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = mean_loss()
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(closure)
    with torch.no_grad():
        return float(mean_loss())


def chance_halfwidth(labels: np.ndarray, task_type: str, ci: float) -> float | None:
    """Half-width of the AUROC interval around 0.5 of a random scorer (see the module docstring); None when an
    output has no positive or no negative."""
    from scipy.stats import norm

    labels = np.asarray(labels)
    columns = (labels[:, None] == np.arange(int(labels.max()) + 1)) if task_types.of(task_type).class_index else labels
    errors = []
    for column in np.asarray(columns, dtype=bool).reshape(len(labels), -1).T:
        n1, n0 = int(column.sum()), int((~column).sum())
        if n1 == 0 or n0 == 0:
            return None
        errors.append(math.sqrt((n1 + n0 + 1) / (12 * n1 * n0)))
    return float(norm.ppf(0.5 + ci / 2) * np.mean(errors))


def judge(rows: list[dict], score_key: str, objective, *, best_epoch: int | None = None,
          constant: float | None = None, val_labels: np.ndarray | None = None, ci: float = 0.95) -> dict:
    """The verdict of a finished run from its metrics.csv ``rows`` (train loss and validation score per epoch).

    ``objective`` (:func:`medattn.train.objectives.objective_for`) names the score (``metric_label``), its floor
    (``score_floor``: segmentation's :data:`DICE_FLOOR`) and where it lies by chance (``chance_interval``:
    classification's Mann-Whitney null, survival's permutation null of the C-index, regression's Fisher bound);
    ``best_epoch``: the epoch of the tested checkpoint (default: the highest validation score); ``constant``: the
    objective's ``constant_loss`` of the training labels; ``val_labels``: the validation labels (for the chance
    interval). -> ``{"learned": bool, "reasons": [...], "warnings": [...], "constant_loss": ...,
    "chance_interval": [low, high] or None}``."""
    reasons, warnings = [], []
    scores = [row[score_key] for row in rows]
    epochs = [int(row["epoch"]) for row in rows]
    best = epochs.index(best_epoch) if best_epoch in epochs else max(range(len(scores)), key=lambda i: scores[i])
    lowest = min(range(len(rows)), key=lambda i: rows[i]["train_loss"])
    lowest_loss = rows[lowest]["train_loss"]
    label, floor = objective.metric_label, getattr(objective, "score_floor", None)
    if floor is not None and max(scores) < floor:
        reasons.append(f"the best validation {label} is {max(scores):.4f} (below {floor})")
    if constant is not None and lowest_loss >= CONSTANT_FRACTION * constant:
        reasons.append(f"the lowest train loss (epoch {epochs[lowest]}), {lowest_loss:.4f}, is no lower than a "
                       f"constant predictor's {constant:.4f} ({objective.constant_name})")
    elif constant is not None and lowest_loss >= NEAR_CONSTANT * constant:
        warnings.append(f"the lowest train loss (epoch {epochs[lowest]}), {lowest_loss:.4f}, is within "
                        f"{1 - NEAR_CONSTANT:.0%} of a constant predictor's {constant:.4f}: the model barely fit "
                        f"the training data")
    interval = None if val_labels is None else objective.chance_interval(val_labels, ci)
    if interval is not None and interval[0] <= max(scores) <= interval[1]:
        reasons.append(f"the best validation {label} {max(scores):.3f} lies within chance "
                       f"({_bound(interval[0])} to {_bound(interval[1])} at {ci:.0%} for these validation labels)")
    quarter = max(1, len(scores) // 4)
    if best == len(scores) - 1 and len(scores) >= 4 and scores[-1] > scores[-1 - quarter]:
        warnings.append(f"the best epoch is the last ({len(scores)}) and the validation score still rose over the "
                        f"last {quarter} epoch(s) ({scores[-1 - quarter]:.3f} -> {scores[-1]:.3f}): the budget may "
                        f"be too short (train.epochs)")
    return {"learned": not reasons, "reasons": reasons, "warnings": warnings, "constant_loss": constant,
            "chance_interval": interval}


def _bound(value: float) -> str:
    """An interval's end as text: ``-inf`` where the interval is open below (regression's R^2 <= 0)."""
    return f"{value:.3f}" if math.isfinite(value) else "-inf"
