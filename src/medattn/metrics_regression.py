"""Regression metrics: MAE, RMSE, R^2 and Pearson's r, per output and their mean, with patient-level bootstrap
intervals.

Shapes: ``pred`` and ``true`` are (N,) for one target or (N, K) for K targets (one column per output). For
(N, K) each function returns the mean of its K per-output values (scikit-learn's
``multioutput="uniform_average"``); :func:`regression_metrics` gives the per-output values too. Over the N
samples of one output, with residuals e_i = pred_i - true_i::

    MAE  = mean |e_i|
    RMSE = sqrt(mean e_i^2)
    R^2  = 1 - sum e_i^2 / sum (true_i - mean(true))^2
    r    = sum (p_i - mean p)(t_i - mean t) / sqrt(sum (p_i - mean p)^2 sum (t_i - mean t)^2)

R^2 is undefined for a constant target, r for a constant target or prediction (and both for N < 2):
:class:`~medattn.metrics.UndefinedMetricError` says so instead of returning scikit-learn's 0 or 1 or scipy's NaN.
Intervals are percentile bootstraps over patients given ``groups``, as in :mod:`medattn.metrics`.
"""

from __future__ import annotations

import numpy as np

from medattn.metrics import UndefinedMetricError, _percentile_bootstrap, _units

METRICS = ("mae", "rmse", "r2", "pearson_r")


def _check(pred, true) -> tuple[np.ndarray, np.ndarray]:
    """``pred`` and ``true`` as float64 (N, K) arrays of one shape, N > 0."""
    pred = np.asarray(pred, dtype=np.float64)
    true = np.asarray(true, dtype=np.float64)
    if pred.shape != true.shape or pred.ndim not in (1, 2) or len(pred) == 0:
        raise ValueError(f"pred and true must have one shape (N,) or (N, K) with N > 0, got {pred.shape} "
                         f"and {true.shape}")
    if not (np.isfinite(pred).all() and np.isfinite(true).all()):
        raise ValueError("pred and true must be finite")
    return (pred[:, None], true[:, None]) if pred.ndim == 1 else (pred, true)


def _spread(values: np.ndarray) -> np.ndarray:
    """(K,) sum of squared deviations from the mean of each column of (N, K) ``values``."""
    return ((values - values.mean(0)) ** 2).sum(0)


def _undefined(pred: np.ndarray, true: np.ndarray, metric: str) -> str | None:
    """Why ``metric`` is undefined on (N, K) ``pred``, ``true`` (the first output that fails), or None."""
    if metric in ("mae", "rmse"):
        return None
    if len(true) < 2:
        return f"{len(true)} sample"
    constant = [k for k in range(true.shape[1]) if np.ptp(true[:, k]) == 0]
    if metric == "pearson_r":
        constant += [k for k in range(pred.shape[1]) if np.ptp(pred[:, k]) == 0 and k not in constant]
    if constant:
        which = "target or prediction" if metric == "pearson_r" else "target"
        return f"constant {which} for output {constant[0]} among {len(true)} samples"
    return None


def _per_output(pred: np.ndarray, true: np.ndarray, metric: str) -> np.ndarray:
    """(K,) values of ``metric`` on (N, K) arrays known to define it."""
    error = pred - true
    if metric == "mae":
        return np.abs(error).mean(0)
    if metric == "rmse":
        return np.sqrt((error**2).mean(0))
    if metric == "r2":
        return 1 - (error**2).sum(0) / _spread(true)
    centred_pred, centred_true = pred - pred.mean(0), true - true.mean(0)
    return (centred_pred * centred_true).sum(0) / np.sqrt(_spread(pred) * _spread(true))


def _require(pred: np.ndarray, true: np.ndarray, metric: str) -> np.ndarray:
    """(K,) values of ``metric``, or :class:`UndefinedMetricError`."""
    problem = _undefined(pred, true, metric)
    if problem:
        raise UndefinedMetricError(f"{metric} is undefined: {problem}")
    return _per_output(pred, true, metric)


def _metric(pred, true, metric: str) -> float:
    return float(_require(*_check(pred, true), metric).mean())


def mae(pred, true) -> float:
    """Mean absolute error (mean over outputs for (N, K)); = ``sklearn.metrics.mean_absolute_error``."""
    return _metric(pred, true, "mae")


def rmse(pred, true) -> float:
    """Root mean squared error (of each output, then the mean); = ``sklearn.metrics.root_mean_squared_error``."""
    return _metric(pred, true, "rmse")


def r2(pred, true) -> float:
    """Coefficient of determination (mean over outputs); = ``sklearn.metrics.r2_score`` where defined."""
    return _metric(pred, true, "r2")


def pearson_r(pred, true) -> float:
    """Pearson's correlation of prediction and target (mean over outputs); = ``scipy.stats.pearsonr``."""
    return _metric(pred, true, "pearson_r")


def regression_metrics(pred, true, n_boot: int = 1000, ci: float = 0.95, seed: int = 0, groups=None,
                       names: list[str] | None = None) -> dict[str, tuple[float, float | None, float | None]]:
    """Every metric of :data:`METRICS` with its percentile bootstrap interval: ``{metric: (value, low, high)}``.

    For (N, K) targets with K > 1 the keys ``"mae"``, ... hold the mean over outputs and ``"mae/NAME"``, ... each
    output (``names`` (K,), default ``"0"`` ... ``"K-1"``). ``n_boot`` resamples with replacement of the patients
    given ``groups`` (N,), else of the samples; ``n_boot=0``: no interval (low and high None). Every metric's
    interval comes from the same resamples (``numpy.random.default_rng(seed)``); a resample on which R^2 or r is
    undefined (a constant target or prediction) is drawn again for all of them. Raises
    :class:`UndefinedMetricError` when a metric is undefined on the full set.
    """
    pred, true = _check(pred, true)
    outputs = true.shape[1]
    names = list(names) if names is not None else [str(k) for k in range(outputs)]
    if len(names) != outputs:
        raise ValueError(f"names must name the {outputs} outputs, got {len(names)}")
    values = {metric: _require(pred, true, metric) for metric in METRICS}
    keys = [(metric, None) for metric in METRICS] + ([(m, k) for m in METRICS for k in range(outputs)]
                                                     if outputs > 1 else [])
    units = _units(groups, len(true))

    def defined(index: np.ndarray) -> bool:
        return not any(_undefined(pred[index], true[index], metric) for metric in METRICS)

    result = {}
    for metric, k in keys:
        value = float(values[metric].mean() if k is None else values[metric][k])
        low = high = None
        if n_boot:
            def statistic(index: np.ndarray, metric=metric, k=k) -> float:
                scores = _per_output(pred[index], true[index], metric)
                return float(scores.mean() if k is None else scores[k])

            low, high = _percentile_bootstrap(units, defined, statistic, n_boot, ci, seed,
                                              "with a non-constant target and prediction")
        result[metric if k is None else f"{metric}/{names[k]}"] = (value, low, high)
    return result
