"""Survival probabilities from a Cox model's risk and the metrics that score them: the Breslow baseline hazard, the
Brier score at a time and the integrated Brier score with inverse probability of censoring weights (IPCW), and
calibration at a time (predicted survival against Kaplan-Meier observed survival per risk group).

Shapes as in :mod:`medattn.metrics_survival`: ``risk`` (N,) the log relative risk (higher = earlier event),
``time`` (N,) >= 0, ``event`` (N,) 0/1 or bool. ``survival`` (N, M): the predicted probability S(t_m | x_i) of
sample i to be event-free after time t_m. Every estimate that needs data of its own (the baseline hazard, the
censoring distribution, the cut into risk groups) is fitted on the *training* split and evaluated on the test
split, as scikit-survival does.

A metric with nothing to score (a time where the censoring survival is 0, fewer than two times for the integrated
score) raises :class:`~medattn.metrics.UndefinedMetricError`.

References: Breslow, Discussion of Cox (1972), JRSS B 34:216 (1972) (baseline hazard); Graf, Schmoor, Sauerbrei &
Schumacher, Stat Med 18:2529 (1999) (Brier score with IPCW); Gerds & Schumacher, Biom J 48:1029 (2006).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from medattn.metrics import UndefinedMetricError
from medattn.metrics_survival import _arrays, _counts, censoring_steps, kaplan_meier


@dataclass(frozen=True)
class Steps:
    """A right-continuous step function: ``before`` for t < ``x[0]``, ``y[k]`` on ``[x[k], x[k+1])``, ``y[-1]``
    from ``x[-1]`` on. ``x`` (M,) ascending, ``y`` (M,)."""

    x: np.ndarray
    y: np.ndarray
    before: float

    def __call__(self, t) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        values = np.concatenate([[self.before], np.asarray(self.y, dtype=np.float64)])
        return values[np.searchsorted(np.asarray(self.x, dtype=np.float64), t, side="right")]

    def to_dict(self) -> dict:
        return {"x": [float(v) for v in self.x], "y": [float(v) for v in self.y], "before": float(self.before)}

    @classmethod
    def from_dict(cls, data: dict) -> Steps:
        return cls(np.asarray(data["x"], dtype=np.float64), np.asarray(data["y"], dtype=np.float64),
                   float(data["before"]))


@dataclass(frozen=True)
class Baseline:
    """The Breslow estimate of a Cox model's baseline cumulative hazard, fitted on training risks.

    ``hazard``: H_0 as steps at the distinct training event times (0 before the first); ``offset``: the largest
    training risk, subtracted before ``exp`` (H_0 is estimated for ``r - offset``, so nothing overflows; the
    survival it gives is the same). Survival of a sample with risk r: ``S(t | r) = exp(-H_0(t) exp(r - offset))``.
    """

    hazard: Steps
    offset: float

    def survival(self, risk, times) -> np.ndarray:
        """S(t_m | r_i) -> (N, M) for ``risk`` (N,) and ``times`` (M,)."""
        risk = np.asarray(risk, dtype=np.float64)
        cumulative = self.hazard(np.atleast_1d(np.asarray(times, dtype=np.float64)))
        return np.exp(-np.outer(np.exp(risk - self.offset), cumulative))

    def to_dict(self) -> dict:
        return {"hazard": self.hazard.to_dict(), "offset": self.offset}

    @classmethod
    def from_dict(cls, data: dict) -> Baseline:
        return cls(Steps.from_dict(data["hazard"]), float(data["offset"]))


def breslow(risk, time, event) -> Baseline:
    """Breslow's estimator of the baseline cumulative hazard from the training split's risks::

        H_0(t) = sum_{u <= t, u an event time} d_u / sum_{j: time_j >= u} exp(r_j)

    (d_u: events at u; the risk set counts every sample still followed at u, censored at u included). Equal to
    scikit-survival's ``BreslowEstimator`` (``exp(-H_0(t) exp(r))`` its survival function)."""
    time, event, risk = _arrays(time, event, risk)
    offset = float(risk.max())
    order = np.argsort(time, kind="stable")
    weights = np.exp(risk[order] - offset)
    unique, at_risk, deaths, _ = _counts(time, event)
    # sum of exp(r) over {time >= u}: the suffix sums of the sorted weights, from each distinct time's first sample
    suffix = np.concatenate([np.cumsum(weights[::-1])[::-1], [0.0]])
    divisor = suffix[len(time) - at_risk]
    steps = deaths > 0
    return Baseline(Steps(unique[steps], np.cumsum(deaths[steps] / divisor[steps]), 0.0), offset)


def censoring(time, event) -> Steps:
    """The Kaplan-Meier estimate of the censoring survival G(t) = P(C > t) of a (training) split as :class:`Steps`
    (:func:`medattn.metrics_survival.censoring_steps`: an event tied with a censoring happened before it)."""
    time, event = _arrays(time, event)
    return Steps(*censoring_steps(time, event), 1.0)


def _times(time_dtype, times) -> tuple[np.ndarray, np.ndarray]:
    """(times as compared, times as written): times rounded to the follow-up times' own float precision (float32
    labels: t = 12.3 meets the event stored as float32(12.3)), as
    :func:`medattn.metrics_survival.time_dependent_auc`."""
    shown = np.atleast_1d(np.asarray(times, dtype=np.float64))
    if shown.ndim != 1 or len(shown) == 0 or not np.isfinite(shown).all():
        raise ValueError(f"times must be finite, (M,) with M > 0, got shape {shown.shape}")
    narrow = np.issubdtype(time_dtype, np.floating) and time_dtype.itemsize < 8
    return (shown.astype(time_dtype).astype(np.float64) if narrow else shown), shown


def brier_score(survival, time, event, times, censoring_survival: Steps) -> np.ndarray:
    """The IPCW Brier score at each of ``times`` (M,) -> (M,) (Graf et al. 1999)::

        BS(t) = (1/N) sum_i [ S(t|x_i)^2 1(time_i <= t, event_i) / G(time_i) + (1 - S(t|x_i))^2 1(time_i > t) / G(t) ]

    ``survival`` (N, M) or (N,) for one time: the predicted S(t_m | x_i) (:meth:`Baseline.survival`);
    ``censoring_survival``: G, the Kaplan-Meier censoring survival of the training split (:func:`censoring`).
    A sample censored by t counts only through the weights. Equal to ``sksurv.metrics.brier_score(train, test,
    survival, times)`` (which sorts and de-duplicates ``times`` and refuses times outside the test follow-up or
    test times beyond the last training time; here G keeps its last value there). Raises
    :class:`UndefinedMetricError` where G is 0 at t or at a case's time.
    """
    given = np.asarray(time).dtype
    time, event = _arrays(time, event)
    compared, shown = _times(given, times)
    survival = np.asarray(survival, dtype=np.float64).reshape(len(time), -1)
    if survival.shape != (len(time), len(compared)) or not np.isfinite(survival).all():
        raise ValueError(f"survival must be finite, (N, M) = {(len(time), len(compared))}, got {survival.shape}")
    at_case = censoring_survival(time)
    scores = np.empty(len(compared))
    for m, (t, written) in enumerate(zip(compared, shown)):
        case, control, g_t = event & (time <= t), time > t, float(censoring_survival(t))
        if g_t == 0 or (at_case[case] == 0).any():
            raise UndefinedMetricError(f"the Brier score is undefined at t={written:g}: the training split's "
                                       "censoring survival is 0 there (no one followed that long)")
        s = survival[:, m]
        scores[m] = (np.sum(s[case] ** 2 / at_case[case]) + np.sum((1 - s[control]) ** 2) / g_t) / len(time)
    return scores


def integrated_brier_score(survival, time, event, times, censoring_survival: Steps) -> float:
    """The integrated Brier score over ``times`` (M >= 2 distinct, sorted here; ``survival`` (N, M) in the order
    given), by the trapezoidal rule with weight w(t) = t / (t_max - t_1)::

        IBS = (1 / (t_M - t_1)) sum_{m=1}^{M-1} (t_{m+1} - t_m) (BS(t_m) + BS(t_{m+1})) / 2

    Equal to ``sksurv.metrics.integrated_brier_score``. Raises :class:`UndefinedMetricError` with fewer than two
    distinct times."""
    shown = np.atleast_1d(np.asarray(times, dtype=np.float64))
    unique, first = np.unique(shown, return_index=True)
    if len(unique) < 2:
        raise UndefinedMetricError(f"the integrated Brier score needs two distinct times, got {len(unique)}")
    survival = np.asarray(survival, dtype=np.float64).reshape(len(np.asarray(time)), -1)[:, first]
    scores = brier_score(survival, time, event, unique, censoring_survival)
    return float(np.sum(np.diff(unique) * (scores[1:] + scores[:-1]) / 2) / (unique[-1] - unique[0]))


def ibs_grid(test_time, train_time, points: int = 50) -> np.ndarray:
    """The times the integrated Brier score is reported over: ``points`` evenly spaced from the test split's
    earliest follow-up time to the smaller of its 90th percentile and the last training time (beyond, few test
    samples are followed and the censoring weights rest on few training samples). Empty when that span is 0."""
    low = float(np.min(test_time))
    high = min(float(np.percentile(test_time, 90)), float(np.max(train_time)))
    return np.linspace(low, high, points) if high > low else np.empty(0)


def survival_at(time, event, t: float) -> float | None:
    """The Kaplan-Meier survival at t, ``prod_{t_m <= t} (1 - d_m / n_m)``; None when no sample is followed until
    t (every time < t: the curve is not observed there)."""
    time, event = _arrays(time, event)
    if not (time >= t).any():
        return None
    times, survival = kaplan_meier(time, event)
    return float(np.concatenate([[1.0], survival])[np.searchsorted(times, t, side="right")])


def calibration_at(predicted, time, event, t: float, groups: int = 4) -> dict:
    """Calibration at time t: the samples cut into ``groups`` groups of equal size by predicted survival
    ``predicted`` (N,) = S(t | x_i) (lowest first; fewer groups when N < 2 * groups, at least 2 samples each), and
    in each the mean predicted survival against the Kaplan-Meier survival observed at t (:func:`survival_at`).

    -> ``{"time", "groups": [{"n", "events", "predicted", "observed"}], "error"}``, ``error`` the size-weighted mean
    ``sum_g n_g |predicted_g - observed_g| / sum_g n_g`` over the groups observed at t (None without one). A
    well-calibrated model's points lie on the identity line."""
    time, event, predicted = _arrays(time, event, predicted)
    count = max(1, min(groups, len(time) // 2))
    order = np.argsort(predicted, kind="stable")
    rows = []
    for members in np.array_split(order, count):
        rows.append({"n": int(len(members)), "events": int(event[members].sum()),
                     "predicted": float(predicted[members].mean()),
                     "observed": survival_at(time[members], event[members], t)})
    seen = [r for r in rows if r["observed"] is not None]
    error = (sum(r["n"] * abs(r["predicted"] - r["observed"]) for r in seen) / sum(r["n"] for r in seen)
             if seen else None)
    return {"time": float(t), "groups": rows, "error": error}


def training_cut(train_risk, quantile: float = 0.5) -> float:
    """The risk that separates the high-risk group, fixed on the training split: the ``quantile`` of the training
    risks (``numpy.quantile``, linear; 0.5 the median). :func:`medattn.metrics_survival.risk_groups` with this
    ``cutoff`` splits a test split by it (a risk equal to the cut is low)."""
    if not 0 < quantile < 1:
        raise ValueError(f"quantile must be in (0, 1), got {quantile}")
    risk = np.asarray(train_risk, dtype=np.float64)
    if risk.ndim != 1 or len(risk) == 0 or not np.isfinite(risk).all():
        raise ValueError(f"train_risk must be finite and (N,) with N > 0, got shape {risk.shape}")
    return float(np.quantile(risk, quantile))
