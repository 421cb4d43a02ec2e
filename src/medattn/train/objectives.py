"""What is optimised and scored per task type, chosen in one place (:func:`objective_for`).

* classification (binary, multi-class, multi-label; :class:`Classification`): cross-entropy; AUROC,
  with a bootstrap CI over patients;
* segmentation (:class:`Segmentation`): soft Dice over the foreground classes + voxel cross-entropy;
  mean foreground Dice, with a bootstrap CI over patients, and per-class Dice;
* survival (:class:`~medattn.train.survival_objective.Survival`): Cox partial likelihood (Breslow ties);
  Harrell's C-index, with a bootstrap CI over patients, the log-rank test of the risk halves, time-dependent AUC;
* regression (:class:`~medattn.train.regression_objective.Regression`): Huber loss on standardised targets;
  R^2 (mean over targets), MAE, RMSE and Pearson r with bootstrap CIs over patients.

Every objective also says what a constant predictor's training loss is (:meth:`constant_loss`, the learning
verdict's floor) and where its validation score lies by chance (:meth:`chance_interval`).

Objectives compute; they write nothing (the files of a scored split are :mod:`medattn.train.report`'s).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from medattn import metrics
from medattn.data.base import TaskInfo
from medattn.errors import UserError
from medattn.models.segmentation import dice_per_class, soft_dice_loss
from medattn.runtime.predictor import probabilities
from medattn.vocabulary import task_types

from .predictions import Predictions
from .regression_objective import Regression
from .survival_objective import Survival
from .verdict import DICE_FLOOR, chance_halfwidth, constant_loss


def loss_fn(logits: torch.Tensor, labels: torch.Tensor, task_type: str, per_sample: bool = False,
            label_smoothing: float = 0.0, pos_weight: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy (multi-class) or binary cross-entropy; the batch mean, or (B,) with ``per_sample``.

    ``label_smoothing`` e (Szegedy et al. 2016): multi-class targets ``(1 - e) one_hot + e / K``; binary and
    multi-label targets ``y (1 - e) + e / 2`` (each output a two-class problem). ``pos_weight`` (K,) weighs
    the positive term of the binary cross-entropy (``torch.nn.BCEWithLogitsLoss``'s ``pos_weight``)."""
    if task_types.of(task_type).class_index:
        loss = F.cross_entropy(logits.float(), labels.long(), reduction="none", label_smoothing=label_smoothing)
    else:
        targets = labels.float() * (1 - label_smoothing) + label_smoothing / 2
        weight = None if pos_weight is None else pos_weight.to(logits.device)
        loss = F.binary_cross_entropy_with_logits(logits.float(), targets, reduction="none",
                                                  pos_weight=weight).mean(-1)
    return loss if per_sample else loss.mean()


class Classification:
    """Binary, multi-class and multi-label tasks: logits (B, K); cross-entropy; AUROC."""

    metric, metric_label = "auroc", "AUROC"
    constant_name = "the label prior's"  # what the constant predictor is, for the learning verdict
    files = "predictions_test.csv roc_test.png"
    outputs_are_probabilities = True  # Predictions.outputs: (N, K) probabilities

    def __init__(self, task: TaskInfo, label_smoothing: float = 0.0, pos_weight: torch.Tensor | None = None) -> None:
        self.task, self.label_smoothing, self.pos_weight = task, label_smoothing, pos_weight

    @classmethod
    def create(cls, task: TaskInfo, loss: str | None, label_smoothing: float,
               pos_weight: torch.Tensor | None) -> Classification:
        """The objective of ``objective_for``; ``train.loss`` names no classification loss (null only)."""
        if loss is not None:
            raise UserError(f"train.loss={loss} is a segmentation or survival loss; this task is {task.task_type} "
                            f"(use null)")
        return cls(task, label_smoothing, pos_weight)

    @staticmethod
    def metric_of(outputs: np.ndarray, labels: np.ndarray, task_type: str) -> float:
        """The validation metric of (N, K) outputs and their labels (the AUROC)."""
        return metrics.auroc(outputs, labels, task_type)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, per_sample: bool = False) -> torch.Tensor:
        return loss_fn(logits, labels, self.task.task_type, per_sample, self.label_smoothing, self.pos_weight)

    def outputs(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (probabilities (B, K), labels): the per-sample rows gathered for scoring."""
        return probabilities(logits, self.task.task_type), labels

    def val_score(self, pred: Predictions) -> float:
        return metrics.auroc(pred.outputs, pred.labels, self.task.task_type, "validation", self.task.class_names)

    def score(self, pred: Predictions, split: str, eval_cfg: dict, seed: int) -> dict:
        """AUROC and its patient-level bootstrap CI of one split; an undefined AUROC becomes a note."""
        task = self.task
        result: dict = {"n": len(pred.ids), "loss": pred.loss, "auroc": None, "ci_low": None, "ci_high": None}
        try:
            result["auroc"] = metrics.auroc(pred.outputs, pred.labels, task.task_type, split, task.class_names)
            if eval_cfg["bootstrap"]:
                result["ci_low"], result["ci_high"] = metrics.bootstrap_ci(
                    pred.outputs, pred.labels, task.task_type, eval_cfg["bootstrap"], eval_cfg["ci"], seed,
                    groups=pred.patients)
        except metrics.UndefinedMetricError as error:
            result["note"] = str(error)
        return result

    def constant_loss(self, labels: torch.Tensor, weights: torch.Tensor | None = None, batch_size: int = 1) -> float:
        """The lowest mean training loss of constant logits (:func:`medattn.train.verdict.constant_loss`)."""
        return constant_loss(self, labels, weights)

    def chance_interval(self, val_labels: np.ndarray, ci: float) -> list[float] | None:
        """The validation AUROC a random scorer reaches (:func:`medattn.train.verdict.chance_halfwidth`)."""
        half = chance_halfwidth(val_labels, self.task.task_type, ci)
        centre = task_types.of(self.task.task_type).chance_score  # a random scorer's AUROC
        return None if half is None else [max(0.0, centre - half), min(1.0, centre + half)]

    def test_line(self, test: dict) -> str:
        if test["auroc"] is None:
            return f"test AUROC     undefined: {test['note']}"
        ci = "" if test["ci_low"] is None else f"  (95% CI {test['ci_low']:.3f}-{test['ci_high']:.3f})"
        return f"test AUROC     {test['auroc']:.4f}{ci}  n={test['n']}"


class Segmentation:
    """Voxel labelling: logits (B, K, H, W, D), labels (B, H, W, D) in [0, K) with 0 = background.

    Loss (``train.loss``): ``dice_ce`` (default): soft Dice over the foreground classes (batch Dice,
    :func:`soft_dice_loss` without background) plus the voxel-wise cross-entropy, which gives useful
    gradients while the Dice of small structures is still near 0; ``dice``: the soft Dice alone (the PAM
    paper's "Dice loss"; foreground classes, as the score). Score: mean foreground Dice of the hard
    (argmax) prediction (:func:`metrics.mean_dice`).
    """

    metric, metric_label = "dice", "Dice"
    constant_name = None  # no constant predictor: judged by its score's floor
    score_floor = DICE_FLOOR  # a best validation Dice below it: did not learn
    files = "predictions_test.csv"
    outputs_are_probabilities = False  # Predictions.outputs: (N, K) Dice per class

    def __init__(self, task: TaskInfo, loss: str | None = None) -> None:
        self.task, self.dice_only = task, loss == "dice"

    @classmethod
    def create(cls, task: TaskInfo, loss: str | None, label_smoothing: float,
               pos_weight: torch.Tensor | None) -> Segmentation:
        """The objective of ``objective_for``; ``train.loss``: null, ``dice_ce`` or ``dice``."""
        if label_smoothing or pos_weight is not None:
            raise UserError("train.label_smoothing and train.pos_weight apply to classification tasks; "
                            "this task is segmentation")
        if loss not in (None, *task_types.of(task.task_type).losses):
            raise UserError(f"train.loss={loss} is a survival loss; this task is segmentation (dice_ce or dice)")
        return cls(task, loss)

    @staticmethod
    def metric_of(outputs: np.ndarray, labels: np.ndarray | None, task_type: str) -> float:
        """The validation metric of (N, K) Dice per case and class (the mean foreground Dice)."""
        return metrics.mean_dice(outputs)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, per_sample: bool = False) -> torch.Tensor:
        if per_sample:
            return torch.stack([self.loss(x[None], y[None]) for x, y in zip(logits, labels)])
        dice = soft_dice_loss(logits, labels, include_background=False)
        return dice if self.dice_only else dice + F.cross_entropy(logits.float(), labels)

    def outputs(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (Dice per class (B, K), NaN where a class is in neither; label voxels per class (B, K))."""
        k = logits.shape[1]
        hard = logits.argmax(1)
        dice = torch.stack([dice_per_class(p, t, k) for p, t in zip(hard, labels)])
        voxels = torch.stack([torch.bincount(t.flatten(), minlength=k) for t in labels])
        return dice, voxels

    def val_score(self, pred: Predictions) -> float:
        return metrics.mean_dice(pred.outputs, "validation")

    def score(self, pred: Predictions, split: str, eval_cfg: dict, seed: int) -> dict:
        """Mean foreground Dice with a bootstrap CI over cases, and per-class Dice."""
        names = output_names(self.task, pred.outputs.shape[1])
        per_class = metrics.class_dice(pred.outputs)
        result: dict = {"n": len(pred.ids), "loss": pred.loss, "dice": None, "ci_low": None, "ci_high": None,
                        "dice_per_class": {n: None if np.isnan(v) else float(v) for n, v in zip(names, per_class)}}
        try:
            result["dice"] = metrics.mean_dice(pred.outputs, split)
            if eval_cfg["bootstrap"]:
                result["ci_low"], result["ci_high"] = metrics.dice_bootstrap_ci(
                    pred.outputs, eval_cfg["bootstrap"], eval_cfg["ci"], seed, groups=pred.patients)
        except metrics.UndefinedMetricError as error:
            result["note"] = str(error)
        return result

    def test_line(self, test: dict) -> str:
        if test["dice"] is None:
            return f"test Dice      undefined: {test['note']}"
        ci = "" if test["ci_low"] is None else f"  (95% CI {test['ci_low']:.3f}-{test['ci_high']:.3f})"
        classes = ", ".join(f"{n} {'-' if v is None else f'{v:.3f}'}"
                            for n, v in list(test["dice_per_class"].items())[1:])
        return f"test Dice      {test['dice']:.4f}{ci}  n={test['n']}\nper class      {classes}"


Objective = Classification | Segmentation | Survival | Regression


def objective_for(task: TaskInfo, loss: str | None = None, label_smoothing: float = 0.0,
                  pos_weight: torch.Tensor | None = None) -> Objective:
    """The loss, the validation score and the test report of a task type: the class its task type names
    (:attr:`~medattn.vocabulary.task_types.TaskType.objective`), made by its ``create``, which refuses the options
    that do not apply.
    ``loss``: ``train.loss`` (None: the task's default; ``dice_ce`` and ``dice`` are segmentation losses, ``cox`` and
    ``discrete_time`` survival losses).
    ``label_smoothing`` and ``pos_weight`` (classification; :func:`loss_fn`) shape the training loss only:
    the loop scores validation and test with the plain loss, so losses compare across settings. Unlabelled data
    (the diffusion stages' volumes) have no objective here: a UserError."""
    return task_types.of(task.task_type).objective_class().create(task, loss, label_smoothing, pos_weight)


def output_names(task: TaskInfo, k: int) -> list[str]:
    """The task's class names when there is one per output, else the output indices."""
    return task.class_names if len(task.class_names) == k else [str(i) for i in range(k)]


def metric_fields(objective: Objective) -> tuple[str, ...]:
    """The columns of metrics.csv."""
    return ("epoch", "lr", "train_loss", "val_loss", f"val_{objective.metric}", "seconds")
