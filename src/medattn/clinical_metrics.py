"""What an external validation reports beside the AUROC: the operating point at the stored threshold,
calibration, and per-patient aggregation.

Shapes as in :mod:`medattn.metrics`: ``probs`` (N, K); ``labels`` (N, K) 0/1 (binary, multi-label) or (N,)
class indices (multi-class).

* :func:`operating_point`: sensitivity and specificity per output at a threshold (``p >= t`` is positive;
  binary and multi-label), each with its Wilson score interval (``scipy.stats.binomtest``);
* :func:`expected_calibration_error`: ECE over ``bins`` equal-width probability bins,
  ``sum_b (n_b / N) |observed rate_b - mean predicted_b|``; binary and multi-label per output (the mean over
  outputs is reported), multi-class on the top-label confidence (Guo et al. 2017);
  :func:`reliability_figure` draws the reliability diagram (``sklearn.calibration.calibration_curve``);
* :func:`aggregate_patients`: one row per patient, the mean or the max of its samples' probabilities; the
  patient's label is the max of its samples' labels (positive if any sample is), multi-class labels must agree.
"""

from __future__ import annotations

import numpy as np

from medattn.errors import UserError
from medattn.vocabulary import task_types

AGGREGATIONS = ("mean", "max")


def operating_point(probs: np.ndarray, labels: np.ndarray, thresholds: list[float | None], ci: float = 0.95,
                    names: list[str] | None = None) -> list[dict]:
    """Per output: threshold, sensitivity, specificity with Wilson intervals, and the counts (binary/multi-label).
    An output without a threshold (None) is skipped; a rate without cases is None."""
    from scipy.stats import binomtest

    def rate(hits: int, total: int) -> dict:
        if total == 0:
            return {"value": None, "ci_low": None, "ci_high": None}
        interval = binomtest(hits, total).proportion_ci(confidence_level=ci, method="wilson")
        return {"value": hits / total, "ci_low": float(interval.low), "ci_high": float(interval.high)}

    rows = []
    for k, threshold in enumerate(thresholds):
        if threshold is None:
            continue
        called, truth = probs[:, k] >= threshold, labels[:, k] > 0.5
        tp, fn = int((called & truth).sum()), int((~called & truth).sum())
        tn, fp = int((~called & ~truth).sum()), int((called & ~truth).sum())
        rows.append({"output": names[k] if names and k < len(names) else str(k), "threshold": float(threshold),
                     "sensitivity": rate(tp, tp + fn), "specificity": rate(tn, tn + fp),
                     "tp": tp, "fn": fn, "tn": tn, "fp": fp})
    return rows


def _calibration_pairs(probs: np.ndarray, labels: np.ndarray, task_type: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """(predicted probability, observed 0/1) pairs: one per output, or the top label's for multi-class."""
    if task_types.of(task_type).class_index:
        top = probs.argmax(1)
        return [(probs[np.arange(len(top)), top], (top == labels).astype(float))]
    return [(probs[:, k], labels[:, k].astype(float)) for k in range(probs.shape[1])]


def expected_calibration_error(probs: np.ndarray, labels: np.ndarray, task_type: str, bins: int = 10) -> float:
    """ECE over ``bins`` equal-width bins (see the module docstring), the mean over outputs."""
    edges = np.linspace(0, 1, bins + 1)
    errors = []
    for predicted, observed in _calibration_pairs(probs, labels, task_type):
        which = np.clip(np.digitize(predicted, edges[1:-1]), 0, bins - 1)
        error = 0.0
        for b in range(bins):
            inside = which == b
            if inside.any():
                error += inside.mean() * abs(observed[inside].mean() - predicted[inside].mean())
        errors.append(error)
    return float(np.mean(errors))


def reliability_figure(probs: np.ndarray, labels: np.ndarray, task_type: str, title: str = "", bins: int = 10,
                       names: list[str] | None = None):
    """Reliability diagram -> a matplotlib Figure (the caller saves and closes it): observed rate against mean
    predicted probability per bin, the diagonal, and the histogram of the predictions below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.calibration import calibration_curve

    fig, (ax, hist) = plt.subplots(2, 1, figsize=(4.5, 5.5), height_ratios=[3, 1], sharex=True)
    pairs = _calibration_pairs(probs, labels, task_type)
    top = task_types.of(task_type).class_index
    for k, (predicted, observed) in enumerate(pairs):
        label = "top label" if top else names[k] if names and k < len(names) else f"output {k}"
        if len(np.unique(observed)) == 2:
            rate, mean = calibration_curve(observed, predicted, n_bins=bins, strategy="uniform")
            ax.plot(mean, rate, "o-", label=label)
        hist.hist(predicted, bins=bins, range=(0, 1), alpha=0.6)
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
    ax.set(ylabel="observed rate", xlim=(0, 1), ylim=(0, 1))
    ax.set_title(title, fontsize=9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", fontsize=8)
    hist.set(xlabel="predicted probability", ylabel="cases")
    fig.tight_layout()
    return fig


def aggregate_patients(probs: np.ndarray, labels: np.ndarray, patients: list[str], how: str,
                       task_type: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """-> (patients in order of first appearance, probabilities (P, K), labels) with one row per patient."""
    if how not in AGGREGATIONS:
        raise UserError(f"per-patient aggregation must be one of {', '.join(AGGREGATIONS)}, got {how!r}")
    index: dict[str, list[int]] = {}  # patient -> its samples, patients in order of first appearance
    for i, patient in enumerate(patients):
        index.setdefault(patient, []).append(i)
    order = list(index)
    reduce = np.mean if how == "mean" else np.max
    out_probs = np.stack([reduce(probs[index[p]], axis=0) for p in order])
    if task_types.of(task_type).class_index:
        out_labels = []
        for p in order:
            values = set(labels[index[p]].tolist())
            if len(values) > 1:
                raise UserError(f"patient {p!r} has samples of different classes {sorted(values)}: a multi-class "
                                f"label cannot be aggregated per patient")
            out_labels.append(values.pop())
        return order, out_probs, np.array(out_labels)
    return order, out_probs, np.stack([labels[index[p]].max(axis=0) for p in order])
