"""The competing-risks objective: one log cause-specific hazard ratio per cause from an image, a volume or a bag.

The model's K outputs are ``r_k``, the log cause-specific hazard ratio of cause k (column k - 1; higher = earlier
event of cause k); labels are ``[time, cause]`` (cause 0 censored, 1..K the cause that ended follow-up). Training
minimises the cause-specific Cox loss (:func:`medattn.train.competing_loss.cause_specific_cox`: each cause's Cox
partial likelihood with the other causes censored, Breslow ties, per event of any cause). As for survival the risk
sets are those of the batch (at least two samples; ``train.batch_size`` > 1): bags of a batch run through the model
one at a time and ``train.event_balance`` fills every batch with events of any cause in the training split's
proportion (:mod:`medattn.train.survival_bags`).

Scores (:mod:`medattn.metrics_competing`), per cause: the cause-specific C-index (Harrell's, the other causes
censored) with a percentile bootstrap CI over patients, and Wolbers' competing-risks C-index of the same score (a
patient who died of another cause stays comparable). The cause-specific C-index of cause 1, the cause of interest
(``data.cause_names`` lists it first), keeps the best checkpoint: a mean over causes would let a checkpoint that ranks
the nuisance cause better win over one that ranks the cause the study is about. The figure is the Aalen-Johansen
cumulative incidence of cause 1 per risk group (cause-1 risk above or below the training split's median, the
training reference of :mod:`medattn.train.survival_report`; without one, this split's median).
"""

from __future__ import annotations

import numpy as np
import torch

from medattn import metrics_competing
from medattn.data.base import TaskInfo
from medattn.metrics import UndefinedMetricError
from medattn.outputs import OutputFolder

from .competing_loss import cause_specific_cox
from .predictions import Predictions, refuse_classification_options

#: Random batches whose mean loss at a constant risk is the learning verdict's floor.
CONSTANT_DRAWS = 200
#: Permutations of the validation risks whose cause-1 C-index spread is the chance interval.
CHANCE_PERMUTATIONS = 500


def cause_names(task: TaskInfo, count: int) -> list[str]:
    """The causes' names (``data.cause_names``), else ``1``..``K``."""
    return list(task.class_names) if len(task.class_names) == count else [str(k) for k in range(1, count + 1)]


def _columns(pred: Predictions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(risks (N, K), time (N,), cause (N,) int64) of a split's predictions."""
    return pred.outputs, pred.labels[:, 0].astype(np.float64), np.rint(pred.labels[:, 1]).astype(np.int64)


class CompetingRisks:
    """Competing-risks tasks: logits (B, K) = log cause-specific hazard ratios; labels (B, 2) = ``[time, cause]``."""

    metric, metric_label = "cause_c_index", "cause-1 C-index"
    constant_name = "a constant risk's"
    files = "predictions_test.csv cif_test.png"
    outputs_are_probabilities = False  # Predictions.outputs: (N, K) risk scores

    def __init__(self, task: TaskInfo, loss: str | None = None) -> None:
        self.task, self.loss_name = task, loss or "cox"
        self.batch_coupled, self.min_batch_size = True, 2  # the loss compares the samples of a batch

    @classmethod
    def create(cls, task: TaskInfo, loss: str | None, label_smoothing: float, pos_weight) -> CompetingRisks:
        """The objective of ``objective_for``; classification options refused."""
        refuse_classification_options(task, loss, label_smoothing, pos_weight)
        return cls(task, loss)

    def fit(self, labels: torch.Tensor, n_bins: int = 4) -> None:
        """Nothing to fit on the training labels (the Cox loss has no intervals)."""

    @staticmethod
    def metric_of(outputs, labels, task_type: str) -> float:
        """The validation metric of the outputs and labels as :class:`Predictions` holds them."""
        return float(metrics_competing.cause_specific_c_index(outputs[:, 0], labels[:, 0],
                                                              np.rint(labels[:, 1]).astype(np.int64), 1))

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, per_sample: bool = False) -> torch.Tensor:
        """The batch's cause-specific Cox loss; ``per_sample``: repeated (B,) (it does not split per sample)."""
        labels = labels.float()
        loss = cause_specific_cox(logits.float(), labels[:, 0], labels[:, 1])
        return loss.expand(len(logits)) if per_sample else loss

    def outputs(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (risk scores (B, K), labels (B, 2))."""
        return logits.float(), labels

    def val_score(self, pred: Predictions) -> float:
        try:
            return self.metric_of(pred.outputs, pred.labels, self.task.task_type)
        except UndefinedMetricError as error:
            raise UndefinedMetricError(f"the cause-1 C-index is undefined on the validation split: {error}") from None

    def score(self, pred: Predictions, split: str, eval_cfg: dict, seed: int) -> dict:
        """Per cause the cause-specific C-index with its patient-level bootstrap CI and Wolbers' C-index; the
        cause-1 C-index and CI at the top (``cause_c_index``, ``ci_low``, ``ci_high``); an undefined one a note."""
        risk, time, cause = _columns(pred)
        names = cause_names(self.task, risk.shape[1])
        result: dict = {"n": len(pred.ids), "events": int((cause > 0).sum()), "censored": int((cause == 0).sum()),
                        "loss": pred.loss, "cause_c_index": None, "ci_low": None, "ci_high": None, "causes": {}}
        for k, name in enumerate(names, 1):
            entry: dict = {"cause": k, "events": int((cause == k).sum()), "c_index": None, "ci_low": None,
                           "ci_high": None, "wolbers_c_index": None}
            try:
                entry["c_index"] = metrics_competing.cause_specific_c_index(risk[:, k - 1], time, cause, k)
                entry["wolbers_c_index"] = metrics_competing.competing_c_index(risk[:, k - 1], time, cause, k)
                if eval_cfg["bootstrap"]:
                    entry["ci_low"], entry["ci_high"] = metrics_competing.cause_specific_bootstrap_ci(
                        risk[:, k - 1], time, cause, k, eval_cfg["bootstrap"], eval_cfg["ci"], seed, pred.patients)
            except UndefinedMetricError as error:
                entry["note"] = str(error)
            result["causes"][name] = entry
        first = result["causes"][names[0]]
        result["cause_c_index"], result["ci_low"], result["ci_high"] = first["c_index"], first["ci_low"], \
            first["ci_high"]
        if "note" in first:
            result["note"] = first["note"]
        return result

    def test_line(self, test: dict) -> str:
        lines = []
        for name, entry in test["causes"].items():
            if entry["c_index"] is None:
                lines.append(f"cause {name:<8} C-index undefined: {entry.get('note', '')}")
                continue
            ci = "" if entry["ci_low"] is None else f" (95% CI {entry['ci_low']:.3f}-{entry['ci_high']:.3f})"
            lines.append(f"cause {name:<8} cause-specific C-index {entry['c_index']:.4f}{ci}, Wolbers' C-index "
                         f"{entry['wolbers_c_index']:.4f}, {entry['events']} events")
        return f"test           n={test['n']}, {test['events']} events, {test['censored']} censored\n" + \
            "\n".join(lines)

    def constant_loss(self, labels: torch.Tensor, weights: torch.Tensor | None = None, batch_size: int = 1) -> float:
        """The mean loss of constant risks over :data:`CONSTANT_DRAWS` random training batches of ``batch_size``
        (the loss depends on the risk-set sizes, so on the batch); ``weights`` (class balance) do not apply."""
        generator = torch.Generator().manual_seed(0)
        n, size, k = len(labels), min(max(batch_size, 1), len(labels)), self.task.num_outputs
        draws = CONSTANT_DRAWS if size < n else 1
        total = 0.0
        for _ in range(draws):
            index = torch.randperm(n, generator=generator)[:size]
            total += float(self.loss(torch.zeros(size, k), labels[index]))
        return total / draws

    def chance_interval(self, val_labels: np.ndarray, ci: float) -> list[float] | None:
        """The central ``ci`` interval of the cause-1 C-index of :data:`CHANCE_PERMUTATIONS` random rankings of the
        validation cases (seeded); None without a comparable pair."""
        labels = np.asarray(val_labels)
        time, cause = labels[:, 0], np.rint(labels[:, 1]).astype(np.int64)
        rng = np.random.default_rng(0)
        try:
            draws = [metrics_competing.cause_specific_c_index(rng.permutation(len(time)).astype(float), time, cause, 1)
                     for _ in range(CHANCE_PERMUTATIONS)]
        except UndefinedMetricError:
            return None
        low, high = np.percentile(draws, [50 * (1 - ci), 50 * (1 + ci)])
        return [float(low), float(high)]


def write_competing(pred: Predictions, task: TaskInfo, split: str, folder: OutputFolder, result: dict, heading: str,
                    time_label: str) -> None:
    """``predictions_<split>.csv`` (id, patient, time, event = the cause, ``risk_<cause>`` per cause, the cause-1
    risk group) and ``cif_<split>.png`` where the split has an event of cause 1."""
    from medattn.metrics_survival import risk_groups

    risk, time, cause = _columns(pred)
    names = cause_names(task, risk.shape[1])
    high = risk_groups(risk[:, 0], result.get("risk_groups", {}).get("cut"))
    rows = [[sample_id, pred.patients[i], f"{pred.labels[i, 0]:.9g}", int(cause[i]),
             *[f"{v:.6f}" for v in risk[i]], "high" if high[i] else "low"] for i, sample_id in enumerate(pred.ids)]
    folder.save_csv(f"predictions_{split}.csv",
                    ["id", "patient", "time", "event", *[f"risk_{n}" for n in names], "risk_group"], rows)
    if (cause == 1).any():
        first = result.get("causes", {}).get(names[0], {})
        value = "undefined" if first.get("c_index") is None else f"{first['c_index']:.3f}"
        if first.get("ci_low") is not None:
            value += f" (95% CI {first['ci_low']:.3f} to {first['ci_high']:.3f})"
        title = f"{heading}: cause-specific C-index of {names[0]} {value}, n={len(time)}"
        _plot_incidence(time, cause, high, names[0], folder, f"cif_{split}.png",
                        title + (" (SYNTHETIC data)" if task.synthetic else ""), time_label,
                        "training" if "cut" in result.get("risk_groups", {}) else "this split's")


def _plot_incidence(time: np.ndarray, cause: np.ndarray, high: np.ndarray, name: str, folder: OutputFolder,
                    file: str, title: str, time_label: str, cut_from: str) -> None:
    """``cif_<split>.png``: the Aalen-Johansen cumulative incidence of cause 1 in the high- and low-risk groups."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from medattn.metrics import wrap_title
    from medattn.survival_plots import events_text

    fig = Figure(figsize=(5.5, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for label, members, colour in (("low risk", ~high, "C0"), ("high risk", high, "C3")):
        if not members.any():
            continue
        times, incidence = metrics_competing.aalen_johansen(time[members], cause[members], 1)
        x = np.concatenate([[0.0], times, [time[members].max()]])
        y = np.concatenate([[0.0], incidence, [incidence[-1] if len(incidence) else 0.0]])
        ax.step(x, y, where="post", color=colour, label=f"{label} (n={int(members.sum())}, "
                                                        f"{events_text(int((cause[members] == 1).sum()))} of {name})")
    ax.set(xlabel=time_label, ylabel=f"cumulative incidence of {name}", ylim=(0, 1.02), xlim=(0, None))
    ax.legend(title=f"groups cut at the {cut_from} median risk of {name}", loc="lower right", fontsize=8,
              title_fontsize=8)
    ax.set_title(wrap_title(title, 60), fontsize=9)
    fig.tight_layout()
    folder.save_figure(file, fig, dpi=100)
