"""Survival metrics: Harrell's concordance index with its patient-level bootstrap interval, the Kaplan-Meier
estimator, the two-group log-rank test, the median split into risk groups and the cumulative/dynamic
time-dependent AUC (Uno et al.).

Shapes: ``risk`` (N,) is the model's risk score, higher = earlier event (a Cox log hazard ratio; the negative of
a predicted survival time); ``time`` (N,) the follow-up time (the event's time when ``event`` is 1, the
censoring time when it is 0), >= 0; ``event`` (N,) 0/1 or bool. ``groups`` (N,): the patient of each sample, as
in :mod:`medattn.metrics`: a bootstrap draws patients, not samples.

A metric with nothing to compare (no comparable pair, no case or no control at a time, no event for a log-rank
test) raises :class:`~medattn.metrics.UndefinedMetricError` instead of returning NaN.

References: Harrell, Lee & Mark, Stat Med 15:361 (1996) (C-index); Kaplan & Meier, JASA 53:457 (1958);
Mantel, Cancer Chemother Rep 50:163 (1966) (log-rank); Uno, Cai, Tian & Wei, JASA 102:527 (2007) and Hung &
Chiang, Can J Stat 38:8 (2010) (time-dependent AUC with inverse probability of censoring weights).
"""

from __future__ import annotations

import numpy as np
from scipy.stats import chi2

from medattn.metrics import UndefinedMetricError, _percentile_bootstrap, _units

#: Elements of one block of the O(N^2) pair comparison of :func:`concordance_index` (bounds its memory).
_BLOCK = 1 << 22


def _arrays(time, event, risk=None) -> tuple[np.ndarray, ...]:
    """``time`` and ``event`` (and ``risk``) as float64, bool (and float64) arrays of one length N > 0."""
    time = np.asarray(time, dtype=np.float64)
    event = np.asarray(event)
    arrays = [time, event] + ([np.asarray(risk, dtype=np.float64)] if risk is not None else [])
    if any(a.ndim != 1 or len(a) != len(time) for a in arrays) or len(time) == 0:
        raise ValueError(f"time, event{' and risk' if risk is not None else ''} must be (N,) arrays of one "
                         f"length N > 0, got shapes {[a.shape for a in arrays]}")
    if not np.isin(event, (0, 1)).all():
        raise ValueError("event must hold 0/1 (or bool) values")
    if not np.isfinite(time).all() or (time < 0).any():
        raise ValueError("time must be finite and >= 0")
    if risk is not None and not np.isfinite(arrays[2]).all():
        raise ValueError("risk must be finite")
    arrays[1] = event.astype(bool)
    return tuple(arrays)


def _pair_counts(risk: np.ndarray, time: np.ndarray, event: np.ndarray) -> tuple[int, int, int]:
    """(concordant, tied-risk, comparable) pair counts of :func:`concordance_index`; O(N * events) in blocks."""
    first_time, first_risk = time[event], risk[event]
    rows = max(1, _BLOCK // max(len(first_time), 1))
    concordant = tied = pairs = 0
    for start in range(0, len(time), rows):
        t, r, e = time[start:start + rows, None], risk[start:start + rows, None], event[start:start + rows, None]
        comparable = (first_time < t) | ((first_time == t) & ~e)
        pairs += int(comparable.sum())
        concordant += int((comparable & (first_risk > r)).sum())
        tied += int((comparable & (first_risk == r)).sum())
    return concordant, tied, pairs


def concordance_index(risk, time, event) -> float:
    """Harrell's C: the fraction of comparable pairs that the risk orders correctly.

    A pair (i, j) is comparable when i's event is observed first: ``event_i = 1`` and ``time_i < time_j``, or
    ``time_i == time_j`` with j censored (j is known to outlive i's event time); two events at the same time and
    pairs of censored samples are not comparable (lifelines' convention). It is concordant when
    ``risk_i > risk_j``; tied risks count one half::

        C = (#concordant + #tied / 2) / #comparable

    Equal to ``lifelines.utils.concordance_index(time, -risk, event)`` (lifelines takes predicted survival
    times). Raises :class:`UndefinedMetricError` without a comparable pair (no event, or no sample that outlives
    the first event).
    """
    time, event, risk = _arrays(time, event, risk)
    concordant, tied, pairs = _pair_counts(risk, time, event)
    if pairs == 0:
        raise UndefinedMetricError(f"the C-index is undefined: no comparable pair among {len(time)} samples "
                                   f"({int(event.sum())} events)")
    return (concordant + tied / 2) / pairs


def comparable_pairs(time, event) -> int:
    """The number of comparable pairs of :func:`concordance_index` (i's event observed before j's time, or at it
    with j censored): the C-index is the share of them ranked correctly, so it moves in steps of 1 / (2 pairs)."""
    time, event = _arrays(time, event)
    return _pair_counts(np.zeros(len(time)), time, event)[2]


def _has_pair(time: np.ndarray, event: np.ndarray) -> bool:
    """Whether a comparable pair exists: the earliest event is comparable with every sample it precedes."""
    if not event.any():
        return False
    first = time[event].min()
    return bool((time > first).any() or ((time == first) & ~event).any())


def concordance_bootstrap_ci(risk, time, event, n_boot: int = 1000, ci: float = 0.95, seed: int = 0,
                             groups=None) -> tuple[float, float]:
    """Percentile bootstrap CI of :func:`concordance_index` over ``n_boot`` resamples with replacement: of the
    patients given ``groups`` (N,) (all samples of a drawn patient enter the resample), else of the samples.
    Resamples without a comparable pair are drawn again; ``numpy.random.default_rng(seed)``, as
    :func:`medattn.metrics.bootstrap_ci`."""
    time, event, risk = _arrays(time, event, risk)
    concordance_index(risk, time, event)  # defined on the full set, or raise
    return _percentile_bootstrap(
        _units(groups, len(time)), lambda i: _has_pair(time[i], event[i]),
        lambda i: concordance_index(risk[i], time[i], event[i]), n_boot, ci, seed, "with a comparable pair")


def _counts(time: np.ndarray, event: np.ndarray, members: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """(distinct times u (M,) of all samples, ascending; then, counting only ``members`` ((N,) bool, default all):
    at risk n_u = #{time >= u}, events d_u and censorings c_u at u)."""
    unique, inverse = np.unique(time, return_inverse=True)
    if members is not None:
        inverse, event = inverse[members], event[members]
    total = np.bincount(inverse, minlength=len(unique))
    deaths = np.bincount(inverse, weights=event, minlength=len(unique)).astype(np.int64)
    at_risk = total.sum() - np.concatenate([[0], np.cumsum(total)[:-1]])
    return unique, at_risk, deaths, total - deaths


def kaplan_meier(time, event) -> tuple[np.ndarray, np.ndarray]:
    """Kaplan-Meier estimate of the survival function, ``S(t) = prod_{t_m <= t} (1 - d_m / n_m)``.

    -> ``times`` (M,), the distinct times at which an event occurs, ascending, and ``survival`` (M,), S just after
    each (right-continuous steps); S(t) = 1 before ``times[0]`` and ``survival[m]`` on ``[times[m], times[m+1])``.
    d_m: the events at t_m; n_m: the samples at risk, ``#{time >= t_m}`` (a sample censored at t_m is still at
    risk there). Without events both arrays are empty (S = 1 throughout the follow-up).
    """
    time, event = _arrays(time, event)
    unique, at_risk, deaths, _ = _counts(time, event)
    steps = deaths > 0
    return unique[steps], np.cumprod(1 - deaths[steps] / at_risk[steps])


def logrank_test(time, event, group) -> tuple[float, float]:
    """Two-group log-rank test -> (chi-square statistic, p-value with 1 degree of freedom).

    ``group`` (N,): two distinct values (bool, 0/1, labels); the first group is the smaller value. Over the
    distinct event times t with d events among n at risk, of which n_1 in group 1 with d_1 events::

        U = sum_t (d_1 - n_1 d / n),  V = sum_t n_1 (n - n_1) d (n - d) / (n^2 (n - 1)),  chi2 = U^2 / V

    (the hypergeometric variance; a term with n = 1 has n_1 (n - n_1) = 0). Equal to lifelines'
    ``logrank_test``. Raises :class:`UndefinedMetricError` when V = 0 (no event, or one group at risk alone
    at every event time).
    """
    time, event = _arrays(time, event)
    group = np.asarray(group)
    if group.shape != time.shape:
        raise ValueError(f"group must be (N,) like time {time.shape}, got {group.shape}")
    labels = np.unique(group)
    if len(labels) != 2:
        raise UndefinedMetricError(f"the log-rank test needs two groups, got {len(labels)} ({labels.tolist()})")
    first = group == labels[0]
    _, at_risk, deaths, _ = _counts(time, event)
    _, at_risk_1, deaths_1, _ = _counts(time, event, first)
    steps = deaths > 0
    n, d, n1, d1 = at_risk[steps], deaths[steps], at_risk_1[steps], deaths_1[steps]
    observed_minus_expected = float(np.sum(d1 - n1 * d / n))
    variance = float(np.sum(n1 * (n - n1) * d * (n - d) / (n**2 * np.maximum(n - 1, 1))))
    if variance <= 0:
        raise UndefinedMetricError(f"the log-rank test is undefined: {int(event.sum())} events, none at a time with "
                                   "both groups at risk and a survivor (variance 0)")
    statistic = observed_minus_expected**2 / variance
    return statistic, float(chi2.sf(statistic, 1))


def risk_groups(risk, cutoff: float | None = None) -> np.ndarray:
    """The high-risk group, (N,) bool: ``risk > cutoff``, by default the median of ``risk`` itself.

    Ties go to the low-risk group (a risk equal to the cutoff is low), so with an odd N, or risks tied at the
    median, the high-risk group holds fewer than half. Pass the training set's median as ``cutoff`` to split a
    test set at a threshold fixed before it was seen.
    """
    risk = np.asarray(risk, dtype=np.float64)
    if risk.ndim != 1 or len(risk) == 0:
        raise ValueError(f"risk must be (N,) with N > 0, got shape {risk.shape}")
    return risk > (np.median(risk) if cutoff is None else cutoff)


def censoring_steps(time: np.ndarray, event: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Kaplan-Meier estimate of the censoring distribution G(t) = P(C > t) as steps: (distinct times u (M,),
    G just after each (M,)); G = 1 before ``u[0]``.

    ``G(t) = prod_{u <= t} (1 - c_u / (n_u - d_u))``: censorings c_u are the "events", and the d_u events at u
    leave the risk set first (an event tied with a censoring happened before it). Beyond the last time G keeps
    its last value. As scikit-survival's ``CensoringDistributionEstimator``.
    """
    unique, at_risk, deaths, censored = _counts(time, event)
    remaining = at_risk - deaths
    factor = 1 - np.divide(censored, remaining, out=np.zeros(len(unique)), where=censored > 0)
    return unique, np.cumprod(factor)


def _censoring_survival(time: np.ndarray, event: np.ndarray):
    """G(t) of :func:`censoring_steps` as a function of t."""
    unique, steps = censoring_steps(time, event)
    survival = np.concatenate([[1.0], steps])
    return lambda t: survival[np.searchsorted(unique, t, side="right")]


def time_dependent_auc(risk, time, event, times, train_time=None, train_event=None) -> np.ndarray:
    """Cumulative/dynamic AUC at each of ``times`` (M,) -> (M,), with Uno's inverse probability of censoring
    weights.

    At t, the cases are the samples with an event by t (``time_i <= t``, ``event_i = 1``), the controls those
    still event-free after t (``time_j > t``); each case is weighted by ``w_i = 1 / G(time_i)``, G the
    Kaplan-Meier estimate of the censoring survival (censorings tied with an event count after it)::

        AUC(t) = sum_{i case} sum_{j control} w_i (1[r_i > r_j] + 1[r_i == r_j] / 2) / (sum_{i case} w_i * #controls)

    G is estimated on the training set when ``train_time`` and ``train_event`` are given (evaluated as a step
    function, constant after the last training time), else on this set. ``risk`` is (N,), or (N, M) with one
    column per time. Equal to scikit-survival's ``cumulative_dynamic_auc`` (which sorts and de-duplicates
    ``times``; here they stay in the order given) when no two risks differ by 1e-8 or less without being equal
    (sksurv's ``tied_tol``; here only equal risks are tied). Raises :class:`UndefinedMetricError` at a time
    without a case or a control, or where a case has G = 0.

    Exact at event times: an event at exactly t is a case. Times given in a narrower float (the float32 label
    tensors of a run's predictions) are compared with each t rounded to that float, so t = 12.3 meets the event
    stored as float32(12.3), which is above 12.3 in float64 (and would otherwise be a control).
    """
    given = np.asarray(time).dtype
    time, event = _arrays(time, event)
    risk = np.asarray(risk, dtype=np.float64)
    shown = np.atleast_1d(np.asarray(times, dtype=np.float64))
    if shown.ndim != 1 or len(shown) == 0:
        raise ValueError(f"times must be (M,) with M > 0, got shape {shown.shape}")
    narrow = np.issubdtype(given, np.floating) and given.itemsize < 8
    times = shown.astype(given).astype(np.float64) if narrow else shown  # t at the times' own precision
    if risk.shape not in ((len(time),), (len(time), len(times))) or not np.isfinite(risk).all():
        raise ValueError(f"risk must be finite, (N,) or (N, M) = {(len(time), len(times))}, got {risk.shape}")
    if (train_time is None) != (train_event is None):
        raise ValueError("give both train_time and train_event, or neither")
    censoring = _censoring_survival(*(_arrays(train_time, train_event) if train_time is not None
                                      else (time, event)))
    survival = censoring(time)
    scores = np.empty(len(times))
    for m, (t, written) in enumerate(zip(times, shown)):
        r = risk if risk.ndim == 1 else risk[:, m]
        case, control = event & (time <= t), time > t
        if not case.any() or not control.any():
            raise UndefinedMetricError(f"the time-dependent AUC is undefined at t={written:g}: {int(case.sum())} cases "
                                       f"(events by t), {int(control.sum())} controls (event-free after t)")
        if (survival[case] == 0).any():
            raise UndefinedMetricError(f"the time-dependent AUC is undefined at t={written:g}: the censoring "
                                       "survival is 0 at a case's time")
        weight = 1 / survival[case]
        controls = np.sort(r[control])
        below = np.searchsorted(controls, r[case], side="left")  # controls with a lower risk than each case
        equal = np.searchsorted(controls, r[case], side="right") - below
        scores[m] = np.sum(weight * (below + equal / 2)) / (weight.sum() * len(controls))
    return scores
