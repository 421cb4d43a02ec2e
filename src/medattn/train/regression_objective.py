"""The regression objective: continuous targets (a biomarker level, an age, a score) from an image, a volume or a bag.

The model predicts standardised targets ``z = (y - mean) / std`` (mean and std of the training targets, stored
with the task: :class:`~medattn.data.base.TaskInfo`, so predict and export map outputs back to the targets' units).
Training minimises the Huber loss (``delta`` = 1 standard deviation; squared below, absolute above, so a few
outlying targets do not dominate), averaged over targets:

    L = mean_k huber(logit_k - z_k),  huber(e) = e^2 / 2 if |e| <= 1 else |e| - 1/2

Scores (:mod:`medattn.metrics_regression`) in the targets' units: R^2 (the validation score that keeps the best
checkpoint; mean over targets), MAE, RMSE and Pearson r, each with a percentile bootstrap CI over patients.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from medattn import metrics_regression
from medattn.data.base import TaskInfo
from medattn.metrics import UndefinedMetricError
from medattn.runtime.predictor import probabilities

from .predictions import Predictions, refuse_classification_options
from .verdict import constant_loss

#: The Huber loss's threshold, in standard deviations of the training targets.
HUBER_DELTA = 1.0


class Regression:
    """Continuous targets: logits (B, K) = standardised predictions; labels (B, K) = targets in their units."""

    metric, metric_label = "r2", "R^2"
    constant_name = "the best constant's"
    files = "predictions_test.csv predicted_test.png"
    outputs_are_probabilities = False  # Predictions.outputs: (N, K) predicted values

    def __init__(self, task: TaskInfo) -> None:
        self.task = task
        k = task.num_outputs
        self.mean = torch.tensor(task.target_mean or [0.0] * k)
        self.std = torch.tensor(task.target_std or [1.0] * k)

    @classmethod
    def create(cls, task: TaskInfo, loss: str | None, label_smoothing: float, pos_weight) -> Regression:
        """The objective of ``objective_for``; classification options refused."""
        refuse_classification_options(task, loss, label_smoothing, pos_weight)
        return cls(task)

    @staticmethod
    def metric_of(outputs, labels, task_type: str) -> float:
        """The validation metric of the outputs and labels as :class:`Predictions` holds them."""
        return metrics_regression.r2(outputs, labels)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, per_sample: bool = False) -> torch.Tensor:
        standardised = (labels.float() - self.mean.to(labels.device)) / self.std.to(labels.device)
        loss = F.huber_loss(logits.float(), standardised, reduction="none", delta=HUBER_DELTA).mean(-1)
        return loss if per_sample else loss.mean()

    def outputs(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (predictions in the targets' units (B, K), targets (B, K))."""
        return probabilities(logits, self.task.task_type, self.task.target_mean, self.task.target_std), labels.float()

    def val_score(self, pred: Predictions) -> float:
        return metrics_regression.r2(pred.outputs, pred.labels)

    def score(self, pred: Predictions, split: str, eval_cfg: dict, seed: int) -> dict:
        """R^2, MAE, RMSE and Pearson r (mean over targets) with patient-level bootstrap CIs, and per target."""
        result: dict = {"n": len(pred.ids), "loss": pred.loss, "r2": None, "ci_low": None, "ci_high": None}
        names = self.task.class_names if len(self.task.class_names) == self.task.num_outputs else None
        try:
            scores = metrics_regression.regression_metrics(pred.outputs, pred.labels, eval_cfg["bootstrap"],
                                                           eval_cfg["ci"], seed, pred.patients, names)
        except UndefinedMetricError as error:
            result["note"] = f"{split}: {error}"
            return result
        result["metrics"] = {name: list(value) for name, value in scores.items()}
        result["r2"], result["ci_low"], result["ci_high"] = scores["r2"]
        return result

    def test_line(self, test: dict) -> str:
        if test["r2"] is None:
            return f"test R^2       undefined: {test['note']}"

        def shown(name: str) -> str:
            value, low, high = test["metrics"][name]
            return f"{value:.4g}" if low is None else f"{value:.4g} (95% CI {low:.4g}-{high:.4g})"
        return (f"test R^2       {shown('r2')}  n={test['n']}\n"
                f"MAE, RMSE      {shown('mae')}, {shown('rmse')}; Pearson r {shown('pearson_r')}")

    def constant_loss(self, labels: torch.Tensor, weights: torch.Tensor | None = None, batch_size: int = 1) -> float:
        """The lowest mean Huber loss of constant predictions (:func:`medattn.train.verdict.constant_loss`)."""
        return constant_loss(self, labels, weights)

    def chance_interval(self, val_labels, ci: float) -> list[float]:
        """The R^2 a predictor unrelated to the targets reaches by chance on ``val_labels`` (n cases): at most
        ``r_c^2``, ``r_c = tanh(z / sqrt(n - 3))`` the largest Pearson correlation such a predictor reaches at
        ``ci`` (Fisher's z, two-sided; R^2 <= r^2 for the best rescaling of any prediction); below, everything
        down to -inf (no better than the training mean)."""
        from scipy.stats import norm

        n = len(val_labels)
        if n <= 3:
            return [-math.inf, 0.0]
        r_c = math.tanh(norm.ppf(0.5 + ci / 2) / math.sqrt(n - 3))
        return [-math.inf, r_c ** 2]
