"""Ordinal metrics: the quadratic weighted kappa, the AUROC of each cumulative split, the mean absolute error in grades,
with patient-level bootstrap intervals, and the confusion matrix figure.

Shapes: ``probs`` (N, K) class probabilities of K ordered classes (rows summing to 1), ``labels`` (N,) class indices
0..K-1. The predicted grade is the most probable one, ``argmax_k probs``; the expected grade ``sum_k k p_k``.

Quadratic weighted kappa (Cohen 1968) of grades ``a`` (true) and ``b`` (predicted) over the K classes::

    O = the K x K confusion counts, E = outer(counts of a, counts of b) / N, W_ij = (i - j)^2 / (K - 1)^2
    kappa = 1 - sum(W O) / sum(W E)

over all K classes, present or not (scikit-learn's ``cohen_kappa_score(a, b, labels=range(K),
weights="quadratic")``; without ``labels`` scikit-learn weighs by the rank among the classes present). It is 1 for
perfect agreement, 0 for agreement at chance, and undefined when ``sum(W E) = 0`` (every case of both in one class).
The AUROC of split k (k = 0..K-2) scores ``P(y > k) = sum_(j > k) p_j`` against ``y > k``; a split with no case on one
side is undefined (None). :class:`~medattn.metrics.UndefinedMetricError` says why instead of returning NaN; bad input
(shapes, a class outside 0..K-1, probabilities outside [0, 1]) is a :class:`~medattn.errors.UserError`.
"""

from __future__ import annotations

import numpy as np

from medattn.errors import UserError
from medattn.metrics import UndefinedMetricError, _percentile_bootstrap, _units


def grades(true, pred, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """``true`` and ``pred`` as int64 (N,) grades in 0..K-1, N > 0; a UserError otherwise."""
    true, pred = np.asarray(true), np.asarray(pred)
    if true.shape != pred.shape or true.ndim != 1 or len(true) == 0 or num_classes < 2:
        raise UserError(f"grades must be two (N,) arrays with N > 0 and K >= 2 classes, got {true.shape} and "
                        f"{pred.shape}, K = {num_classes}")
    for values in (true, pred):
        if not np.isfinite(values.astype(np.float64)).all() or (values != np.round(values)).any() \
                or values.min() < 0 or values.max() >= num_classes:
            raise UserError(f"grades must be integers 0..{num_classes - 1}, got {np.unique(values)[:8].tolist()}")
    return true.astype(np.int64), pred.astype(np.int64)


def check(probs, labels) -> tuple[np.ndarray, np.ndarray]:
    """``probs`` (N, K) in [0, 1], rows summing to 1 (to 1e-3), and ``labels`` (N,) class indices as float64 and int64;
    a UserError otherwise."""
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2 or probs.shape[1] < 2 or not np.isfinite(probs).all() or (probs < 0).any() \
            or (probs > 1 + 1e-6).any() or np.abs(probs.sum(1) - 1).max(initial=0) > 1e-3:
        raise UserError(f"probs must be (N, K >= 2) class probabilities in [0, 1], each row summing to 1, got shape "
                        f"{probs.shape}")
    labels = np.asarray(labels).reshape(-1)
    if len(labels) != len(probs):
        raise UserError(f"labels must give one class per row of probs ({len(probs)}), got {len(labels)}")
    return probs, grades(labels, labels, probs.shape[1])[0]


def confusion(true, pred, num_classes: int) -> np.ndarray:
    """(K, K) counts: row = true grade, column = predicted grade."""
    true, pred = grades(true, pred, num_classes)
    return np.bincount(true * num_classes + pred, minlength=num_classes ** 2).reshape(num_classes, num_classes)


def quadratic_weighted_kappa(true, pred, num_classes: int) -> float:
    """Cohen's kappa with quadratic weights over the ``num_classes`` grades (see the module docstring)."""
    observed = confusion(true, pred, num_classes).astype(np.float64)
    expected = np.outer(observed.sum(1), observed.sum(0)) / observed.sum()
    index = np.arange(num_classes)
    weights = (index[:, None] - index[None, :]) ** 2 / (num_classes - 1) ** 2
    chance = float((weights * expected).sum())
    if chance == 0:
        raise UndefinedMetricError(f"quadratic weighted kappa: every case of both the labels and the predictions is "
                                   f"in one class ({len(np.asarray(true))} cases)")
    return 1.0 - float((weights * observed).sum()) / chance


def predicted(probs) -> np.ndarray:
    """(N,) the most probable grade of (N, K) class probabilities."""
    return np.asarray(probs).argmax(1)


def expected(probs) -> np.ndarray:
    """(N,) the expected grade ``sum_k k p_k`` (0 = the first class)."""
    probs = np.asarray(probs, dtype=np.float64)
    return probs @ np.arange(probs.shape[1])


def cumulative(probs) -> np.ndarray:
    """(N, K-1) ``P(y > k) = sum_(j > k) p_j``, k = 0..K-2."""
    probs = np.asarray(probs, dtype=np.float64)
    return np.cumsum(probs[:, ::-1], 1)[:, ::-1][:, 1:]


def qwk(probs, labels) -> float:
    """The quadratic weighted kappa of the most probable grade (the validation metric)."""
    probs, labels = check(probs, labels)
    return quadratic_weighted_kappa(labels, predicted(probs), probs.shape[1])


def mae(probs, labels) -> float:
    """Mean absolute error in grades of the most probable grade."""
    probs, labels = check(probs, labels)
    return float(np.abs(predicted(probs) - labels).mean())


def threshold_aurocs(probs, labels) -> list[float | None]:
    """The AUROC of each cumulative split ``y > k`` (k = 0..K-2) by ``P(y > k)``; None where a side is empty."""
    from sklearn.metrics import roc_auc_score

    probs, labels = check(probs, labels)
    above = cumulative(probs)
    found: list[float | None] = []
    for k in range(probs.shape[1] - 1):
        positive = labels > k
        found.append(float(roc_auc_score(positive, above[:, k])) if 0 < positive.sum() < len(labels) else None)
    return found


def ordinal_metrics(probs, labels, n_boot: int, ci: float, seed: int, groups=None) -> dict:
    """``{"qwk": (value, low, high), "mae": (...), "mae_expected": (...)}`` (no interval with ``n_boot`` 0) and
    ``"auroc_gt_<k>"`` per split (no interval); an undefined kappa is an UndefinedMetricError."""
    probs, labels = check(probs, labels)
    k = probs.shape[1]
    best = predicted(probs)
    statistics = {"qwk": lambda i: quadratic_weighted_kappa(labels[i], best[i], k),
                  "mae": lambda i: float(np.abs(best[i] - labels[i]).mean()),
                  "mae_expected": lambda i: float(np.abs(expected(probs[i]) - labels[i]).mean())}
    units = _units(groups, len(labels))

    def defined(index) -> bool:
        return len(set(labels[index]) | set(best[index])) > 1

    found: dict = {}
    for name, statistic in statistics.items():
        value = statistic(np.arange(len(labels)))
        low = high = None
        if n_boot:
            low, high = _percentile_bootstrap(units, defined, statistic, n_boot, ci, seed,
                                              "with more than one grade")
        found[name] = (value, low, high)
    for split, value in enumerate(threshold_aurocs(probs, labels)):
        found[f"auroc_gt_{split}"] = (value, None, None)
    return found


def chance_interval(labels, num_classes: int, ci: float, draws: int = 400, seed: int = 0) -> list[float]:
    """The kappa a predictor unrelated to the labels reaches at ``ci``: quantiles of the kappa of ``draws`` random
    permutations of ``labels`` (the labels' own grade distribution) against them."""
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(draws):
        try:
            values.append(quadratic_weighted_kappa(labels, rng.permutation(labels), num_classes))
        except UndefinedMetricError:
            return [0.0, 0.0]
    alpha = (1 - ci) / 2
    low, high = np.quantile(values, [alpha, 1 - alpha])
    return [float(low), float(high)]


def confusion_figure(true, pred, names: list[str], title: str):
    """A :class:`matplotlib.figure.Figure` (Agg canvas, outside pyplot) of the confusion counts, rows the true grade,
    columns the predicted grade, each cell its count."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from medattn.metrics import fit_title, wrap_title

    counts = confusion(true, pred, len(names))
    side = 2.2 + 0.55 * len(names)
    fig = Figure(figsize=(side + 0.8, side))
    FigureCanvasAgg(fig)
    axis = fig.add_subplot()
    axis.imshow(counts, cmap="Blues")
    for (i, j), count in np.ndenumerate(counts):
        axis.text(j, i, str(count), ha="center", va="center",
                  color="white" if count > counts.max() / 2 else "black", fontsize=9)
    axis.set_xticks(range(len(names)), names, fontsize=8)
    axis.set_yticks(range(len(names)), names, fontsize=8)
    axis.set_xlabel("predicted grade (most probable)")
    axis.set_ylabel("true grade")
    heading = axis.set_title(wrap_title(title, 48), fontsize=9)
    fig.tight_layout()
    fit_title(fig, heading)
    return fig
