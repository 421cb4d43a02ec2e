"""The survival objective: a Cox model's risk score from an image, a volume or a bag.

The model's one output is the log relative risk ``r`` (higher = earlier event). Training minimises the negative
Cox partial log-likelihood with Breslow's handling of tied times, per batch (Cox 1972; Breslow 1974):

    L = -(1 / E) sum_{i: event_i = 1} [ r_i - log sum_{j: t_j >= t_i} exp(r_j) ]         (E events in the batch)

(:func:`medattn.train.survival_loss.cox_partial_likelihood`). The risk sets are those of the batch, so a batch
needs at least two samples (:attr:`Survival.min_batch_size`); the loss of a batch without an event is 0. Bags of a
batch run through the model one at a time (:func:`medattn.train.survival_bags.forward_each`), so the risk set spans
bags of different sizes without padding.

``train.loss: discrete_time`` trains instead with the logistic-hazard likelihood of a proportional-odds head
(:func:`medattn.train.survival_loss.logistic_hazard_loss`): ``train.time_bins`` intervals with edges at the training
event-time quantiles, their constant-risk logits fitted on the training split, the model's one output ``r`` added
to every interval's logit. It splits into per-sample terms, so it trains at batch 1 (whole bags, one per step).
The risk ``r`` is still the score (the hazards, hence minus the expected survival, rise monotonically with it);
per-patient survival curves are :func:`medattn.train.survival_loss.survival_curves` of ``r`` and the fitted
``baseline``. Validation and test losses are the training likelihood: the Cox loss over each evaluation batch, or
the logistic-hazard loss per sample (the intervals of the training split), so a discrete-time run scored one bag
at a time has a real validation loss. ``medattn eval`` has no training labels to fit intervals on and reports the
Cox loss of its batches.

Scores (:mod:`medattn.metrics_survival`): Harrell's C-index with a percentile bootstrap CI over patients (the
validation score that keeps the best checkpoint), the log-rank test between the predicted high- and low-risk
halves (split at the median risk), and the time-dependent (cumulative/dynamic) AUC at ``eval.times``.
"""

from __future__ import annotations

import numpy as np
import torch

from medattn import metrics_survival
from medattn.data.base import TaskInfo
from medattn.metrics import UndefinedMetricError

from .predictions import Predictions, refuse_classification_options
from .survival_loss import baseline_logits, cox_partial_likelihood, logistic_hazard_loss, time_bin_index, time_bins

#: Random batches whose mean Cox loss at a constant risk is the learning verdict's floor.
CONSTANT_DRAWS = 200
#: Permutations of the validation risks whose C-index spread is the chance interval.
CHANCE_PERMUTATIONS = 500
#: Percentiles of a split's event times at which the time-dependent AUC is reported when ``eval.times`` is null.
DEFAULT_TIME_PERCENTILES = (25, 50, 75)
#: ``train.loss`` values of a survival task; the first is what null means.
SURVIVAL_LOSSES = ("cox", "discrete_time")


class Survival:
    """Time-to-event tasks: logits (B, 1) = log relative risk; labels (B, 2) = ``[time, event]``."""

    metric, metric_label = "c_index", "C-index"
    constant_name = "a constant risk's"
    files = "predictions_test.csv km_test.png"
    outputs_are_probabilities = False  # Predictions.outputs: (N, 1) risk scores

    def __init__(self, task: TaskInfo, loss: str | None = None) -> None:
        self.task, self.loss_name = task, loss or SURVIVAL_LOSSES[0]
        self.batch_coupled = self.loss_name == "cox"  # the loss compares the samples of a batch
        self.min_batch_size = 2 if self.batch_coupled else 1
        self.edges: np.ndarray | None = None  # discrete_time, once fitted: interval edges (T + 1,)
        self.baseline: torch.Tensor | None = None  # and the constant-risk logits (T,)

    def fit(self, labels: torch.Tensor, n_bins: int = 4) -> None:
        """``discrete_time``: the ``n_bins`` intervals (edges at the event-time quantiles of the training labels
        (N, 2)) and their constant-risk logits; from here on :meth:`loss` is the logistic-hazard likelihood."""
        if self.loss_name != "discrete_time":
            return
        time, event = labels[:, 0].double().numpy(), labels[:, 1].bool().numpy()
        self.edges = time_bins(time, event, n_bins)
        self.baseline = baseline_logits(torch.from_numpy(time_bin_index(time, self.edges)),
                                        torch.from_numpy(event), n_bins)

    @classmethod
    def create(cls, task: TaskInfo, loss: str | None, label_smoothing: float, pos_weight) -> Survival:
        """The objective of ``objective_for``; classification options refused."""
        refuse_classification_options(task, loss, label_smoothing, pos_weight)
        return cls(task, loss)

    @staticmethod
    def metric_of(outputs, labels, task_type: str) -> float:
        """The validation metric of the outputs and labels as :class:`Predictions` holds them."""
        return float(metrics_survival.concordance_index(outputs[:, 0], labels[:, 0], labels[:, 1].astype(bool)))

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, per_sample: bool = False) -> torch.Tensor:
        """The batch's Cox loss (a fitted ``discrete_time`` objective: the logistic-hazard loss, the batch mean);
        ``per_sample``: (B,) the logistic-hazard loss of each sample (it splits into per-sample terms), or the Cox
        loss repeated (the partial likelihood does not split), so a split's loss is the mean of its batches' losses
        weighted by their sizes (a validation split scored one bag at a time has a Cox loss of 0 in every batch)."""
        labels, risk = labels.float(), logits[:, 0].float()
        if self.baseline is not None:
            bins = torch.from_numpy(time_bin_index(labels[:, 0].cpu().double().numpy(), self.edges)).to(risk.device)
            if not per_sample:
                return logistic_hazard_loss(risk, bins, labels[:, 1], self.baseline)
            return torch.stack([logistic_hazard_loss(risk[i:i + 1], bins[i:i + 1], labels[i:i + 1, 1], self.baseline)
                                for i in range(len(risk))])
        loss = cox_partial_likelihood(risk, labels[:, 0], labels[:, 1])
        return loss.expand(len(logits)) if per_sample else loss

    def outputs(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (risk scores (B, 1), labels (B, 2))."""
        return logits.float(), labels

    def val_score(self, pred: Predictions) -> float:
        return _c_index(pred, "validation")

    def score(self, pred: Predictions, split: str, eval_cfg: dict, seed: int) -> dict:
        """C-index with its patient-level bootstrap CI, the log-rank test of the risk halves and the
        time-dependent AUC; an undefined C-index (no comparable pair) becomes a note."""
        risk, time, event = pred.outputs[:, 0], pred.labels[:, 0], pred.labels[:, 1].astype(bool)
        result: dict = {"n": len(pred.ids), "events": int(event.sum()), "loss": pred.loss, "c_index": None,
                        "ci_low": None, "ci_high": None, "logrank": None, "time_auc": {}}
        try:
            result["c_index"] = _c_index(pred, split)
            if eval_cfg["bootstrap"]:
                result["ci_low"], result["ci_high"] = metrics_survival.concordance_bootstrap_ci(
                    risk, time, event, eval_cfg["bootstrap"], eval_cfg["ci"], seed, pred.patients)
        except UndefinedMetricError as error:
            result["note"] = str(error)
            return result
        high = metrics_survival.risk_groups(risk)
        if high.any() and not high.all():
            statistic, p_value = metrics_survival.logrank_test(time, event, high)
            result["logrank"] = {"statistic": float(statistic), "p": float(p_value)}
        times = eval_cfg.get("times") or _default_times(time, event)
        for t in times:
            try:
                result["time_auc"][f"{t:g}"] = float(metrics_survival.time_dependent_auc(risk, time, event, [t])[0])
            except (UndefinedMetricError, ValueError) as error:  # no case or no control at t
                result["time_auc"][f"{t:g}"] = None
                result.setdefault("time_auc_notes", []).append(f"t={t:g}: {error}")
        return result

    def test_line(self, test: dict) -> str:
        if test["c_index"] is None:
            return f"test C-index   undefined: {test['note']}"
        ci = "" if test["ci_low"] is None else f"  (95% CI {test['ci_low']:.3f}-{test['ci_high']:.3f})"
        line = f"test C-index   {test['c_index']:.4f}{ci}  n={test['n']}, {test['events']} events"
        if test["logrank"] is not None:
            line += f"\nlog-rank       high vs low risk half: chi2 {test['logrank']['statistic']:.2f}, " \
                    f"p {test['logrank']['p']:.3g}"
        shown = [f"t={t} {'-' if v is None else f'{v:.3f}'}" for t, v in test["time_auc"].items()]
        return line + (f"\ntime AUC       {', '.join(shown)}" if shown else "")

    def constant_loss(self, labels: torch.Tensor, weights: torch.Tensor | None = None, batch_size: int = 1) -> float:
        """The mean Cox loss of a constant risk over :data:`CONSTANT_DRAWS` random training batches of
        ``batch_size`` (the loss depends on the risk-set sizes, so on the batch: this is the floor the training
        loss is compared with); ``discrete_time``: the logistic-hazard loss of risk 0 over all training labels,
        the intervals fitted on them. ``weights`` (class balance) do not apply to survival."""
        if self.loss_name == "discrete_time":
            fitted = Survival(self.task, self.loss_name)
            fitted.fit(labels, len(self.baseline) if self.baseline is not None else 4)
            return float(fitted.loss(torch.zeros(len(labels), 1), labels))
        generator = torch.Generator().manual_seed(0)
        n, size = len(labels), min(max(batch_size, 1), len(labels))
        total = 0.0
        for _ in range(CONSTANT_DRAWS if size < n else 1):
            index = torch.randperm(n, generator=generator)[:size]
            total += float(self.loss(torch.zeros(size, 1), labels[index]))
        return total / (CONSTANT_DRAWS if size < n else 1)

    def chance_interval(self, val_labels: np.ndarray, ci: float) -> list[float] | None:
        """The central ``ci`` interval of the C-index of :data:`CHANCE_PERMUTATIONS` random rankings of the
        validation cases (a permutation null; seeded); None when the validation split has no comparable pair."""
        time, event = np.asarray(val_labels)[:, 0], np.asarray(val_labels)[:, 1].astype(bool)
        rng = np.random.default_rng(0)
        try:
            draws = [metrics_survival.concordance_index(rng.permutation(len(time)).astype(float), time, event)
                     for _ in range(CHANCE_PERMUTATIONS)]
        except UndefinedMetricError:
            return None
        low, high = np.percentile(draws, [50 * (1 - ci), 50 * (1 + ci)])
        return [float(low), float(high)]


def _c_index(pred: Predictions, split: str) -> float:
    try:
        return float(metrics_survival.concordance_index(pred.outputs[:, 0], pred.labels[:, 0],
                                                        pred.labels[:, 1].astype(bool)))
    except UndefinedMetricError as error:
        raise UndefinedMetricError(f"C-index is undefined on the {split} split: {error}") from None


def _default_times(time: np.ndarray, event: np.ndarray) -> list[float]:
    """The :data:`DEFAULT_TIME_PERCENTILES` of the event times (rounded to 3 significant digits), or none."""
    if not event.any():
        return []
    return sorted({float(f"{t:.3g}") for t in np.percentile(time[event], DEFAULT_TIME_PERCENTILES)})
