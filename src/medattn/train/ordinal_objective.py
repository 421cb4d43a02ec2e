"""The ordinal objective: one of K ordered grades (ISUP or Gleason grade groups, a tumour grade) from an image, a
volume or a bag, and the files of a scored split.

The head (:class:`medattn.vocabulary.task_types.Ordinal`): the model's K outputs are one score s and K-1 threshold
parameters, ordered by construction, giving the K-1 cumulative logits ``l_k = s - t_(k+1)`` of P(y > k), k = 0..K-2,
that fall in k for every input (rank-consistent, as CORAL, Cao, Mirjalili & Raschka 2020, without CORAL's one weight
vector shared by every threshold: the thresholds may move with the input). The loss is the sum over the K-1 splits of
the binary cross-entropy of ``l_k`` against ``y > k``, averaged over the batch::

    L = mean_i sum_k BCE(l_k(x_i), [y_i > k])

Scores (:mod:`medattn.metrics_ordinal`): the quadratic weighted kappa of the most probable grade (the validation
score that keeps the best checkpoint: it is the figure grading studies report, PANDA's, and it weighs a miss by the
square of its distance in grades, where accuracy or a one-vs-rest AUROC weigh every miss alike), with a bootstrap CI
over patients; the mean absolute error in grades of the most probable and of the expected grade; the AUROC of each
cumulative split y > k; the confusion counts.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from medattn import metrics_ordinal
from medattn.data.base import TaskInfo
from medattn.metrics import UndefinedMetricError
from medattn.outputs import OutputFolder
from medattn.runtime.predictor import probabilities
from medattn.vocabulary import task_types

from .predictions import Predictions, refuse_classification_options
from .verdict import constant_loss


class Ordinal:
    """K ordered classes: logits (B, K) (a score and K-1 threshold parameters); labels (B,) grades 0..K-1."""

    metric, metric_label = "qwk", "QWK"
    constant_name = "the grade prior's"
    files = "predictions_test.csv confusion_test.png"
    outputs_are_probabilities = True  # Predictions.outputs: (N, K) class probabilities

    def __init__(self, task: TaskInfo) -> None:
        self.task, self.kind = task, task_types.of(task.task_type)

    @classmethod
    def create(cls, task: TaskInfo, loss: str | None, label_smoothing: float, pos_weight) -> Ordinal:
        """The objective of ``objective_for``; ``train.loss``, ``label_smoothing`` and ``pos_weight`` refused."""
        refuse_classification_options(task, loss, label_smoothing, pos_weight)
        return cls(task)

    @staticmethod
    def metric_of(outputs, labels, task_type: str) -> float:
        """The validation metric of (N, K) class probabilities and (N,) grades: the quadratic weighted kappa."""
        return metrics_ordinal.qwk(outputs, labels)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, per_sample: bool = False) -> torch.Tensor:
        cumulative = self.kind.cumulative_logits(logits)
        above = (labels.long().reshape(-1, 1) > torch.arange(cumulative.shape[1], device=labels.device)).to(
            cumulative.dtype)
        loss = F.binary_cross_entropy_with_logits(cumulative, above, reduction="none").sum(1)
        return loss if per_sample else loss.mean()

    def outputs(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (class probabilities (B, K), grades (B,))."""
        return probabilities(logits, self.task.task_type), labels

    def val_score(self, pred: Predictions) -> float:
        return metrics_ordinal.qwk(pred.outputs, pred.labels)

    def score(self, pred: Predictions, split: str, eval_cfg: dict, seed: int) -> dict:
        """Kappa, MAE (of the most probable and the expected grade) with patient-level bootstrap CIs, the AUROC per
        cumulative split and the confusion counts; an undefined kappa becomes a note."""
        result: dict = {"n": len(pred.ids), "loss": pred.loss, "qwk": None, "ci_low": None, "ci_high": None}
        labels = np.asarray(pred.labels).reshape(-1)
        result["confusion"] = metrics_ordinal.confusion(labels, metrics_ordinal.predicted(pred.outputs),
                                                        pred.outputs.shape[1]).tolist()
        try:
            scores = metrics_ordinal.ordinal_metrics(pred.outputs, labels, eval_cfg["bootstrap"], eval_cfg["ci"], seed,
                                                     pred.patients)
        except UndefinedMetricError as error:
            result["note"] = f"{split}: {error}"
            return result
        result["metrics"] = {name: list(value) for name, value in scores.items()}
        result["qwk"], result["ci_low"], result["ci_high"] = scores["qwk"]
        return result

    def test_line(self, test: dict) -> str:
        if test["qwk"] is None:
            return f"test QWK       undefined: {test['note']}"

        def shown(name: str) -> str:
            value, low, high = test["metrics"][name]
            if value is None:
                return "-"
            return f"{value:.3f}" if low is None else f"{value:.3f} (95% CI {low:.3f}-{high:.3f})"
        splits = ", ".join(f">{name.rsplit('_', 1)[1]} {shown(name)}" for name in test["metrics"]
                           if name.startswith("auroc_gt_"))
        return (f"test QWK       {shown('qwk')}  n={test['n']}\n"
                f"MAE (grades)   {shown('mae')}; of the expected grade {shown('mae_expected')}\n"
                f"AUROC y > k    {splits}")

    def constant_loss(self, labels: torch.Tensor, weights: torch.Tensor | None = None, batch_size: int = 1) -> float:
        """The lowest mean loss of constant logits: the binary entropies of the grade prior's cumulative splits."""
        return constant_loss(self, labels, weights)

    def chance_interval(self, val_labels, ci: float) -> list[float]:
        """The kappa of a predictor unrelated to the labels (:func:`medattn.metrics_ordinal.chance_interval`)."""
        return metrics_ordinal.chance_interval(val_labels, self.task.num_outputs, ci)


def write_ordinal(pred: Predictions, task: TaskInfo, split: str, folder: OutputFolder, result: dict, heading: str,
                  time_label: str) -> None:
    """``predictions_<split>.csv`` (id, patient, label, a probability per class, the most probable and the expected
    grade) and, where the kappa is defined, ``confusion_<split>.png`` titled with the kappa and its CI."""
    k = pred.outputs.shape[1]
    names = task.class_names if len(task.class_names) == k else [str(i) for i in range(k)]
    labels = np.asarray(pred.labels).reshape(-1).astype(int)
    best, mean = metrics_ordinal.predicted(pred.outputs), metrics_ordinal.expected(pred.outputs)
    rows = [[sample_id, pred.patients[i], int(labels[i]), *[f"{p:.6f}" for p in pred.outputs[i]], names[best[i]],
             f"{mean[i]:.6f}"] for i, sample_id in enumerate(pred.ids)]
    folder.save_csv(f"predictions_{split}.csv",
                    ["id", "patient", "label", *[f"prob_{n}" for n in names], "pred_label", "expected_grade"], rows)
    if result.get("qwk") is None:
        return
    ci = "" if result["ci_low"] is None else f" (95% CI {result['ci_low']:.3f} to {result['ci_high']:.3f})"
    title = f"{heading}: QWK {result['qwk']:.3f}{ci}, n={result['n']}" + (" (SYNTHETIC data)" if task.synthetic else "")
    figure = metrics_ordinal.confusion_figure(labels, best, names, title)
    folder.save_figure(f"confusion_{split}.png", figure, dpi=100)
