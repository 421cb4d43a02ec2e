"""Competing-risks metrics: the Aalen-Johansen cumulative incidence of a cause, the cause-specific C-index
(Harrell's, the other causes censored) and Wolbers' competing-risks C-index (a patient who died of another cause
stays comparable).

Shapes and conventions: ``time`` (N,) the follow-up time, >= 0 (the time of the first event of any cause, or of
the censoring); ``cause`` (N,) integers: 0 censored, 1..K the cause of the event that ended follow-up (one event per
patient: the first; what would have happened later is never seen). ``k`` the cause of interest, an int >= 1 (a
cause without an event in the data has cumulative incidence 0). ``risk`` (N,) the model's risk score for cause k,
higher = earlier event of cause k (the log cause-specific hazard ratio of a one-head-per-cause Cox model for the
cause-specific C-index; a score ordering the cause-k cumulative incidence for Wolbers' C-index).

Bad inputs (lengths that differ, negative or non-integer causes, a cause of interest < 1, negative or non-finite
times) raise a one-line :class:`~medattn.errors.UserError`; a C-index with no comparable pair raises
:class:`~medattn.metrics.UndefinedMetricError`.

References: Aalen & Johansen, Scand J Stat 5:141 (1978); Kalbfleisch & Prentice, The Statistical Analysis of
Failure Time Data, 2nd ed. (2002), sect. 8.2 (cumulative incidence); Putter, Fiocco & Geskus, Stat Med 26:2389
(2007) (cause-specific hazards); Wolbers, Koller, Witteman & Steyerberg, Epidemiology 20:555 (2009) and Wolbers,
Blanche, Koller, Witteman & Gerds, Biostatistics 15:526 (2014) (the C-index for competing risks).
"""

from __future__ import annotations

import numpy as np

from medattn.errors import UserError
from medattn.metrics import UndefinedMetricError
from medattn.metrics_survival import concordance_bootstrap_ci, concordance_index

#: Elements of one block of the O(N * events) pair comparison of :func:`competing_c_index` (bounds its memory).
_BLOCK = 1 << 22


def competing_arrays(time, cause, risk=None) -> tuple[np.ndarray, ...]:
    """``time`` float64 (N,), ``cause`` int64 (N,) (and ``risk`` float64 (N,)), checked; a bad input raises a
    one-line :class:`UserError`."""
    named = {"time": np.asarray(time), "cause": np.asarray(cause)}
    if risk is not None:
        named["risk"] = np.asarray(risk)
    shapes = {name: a.shape for name, a in named.items()}
    if any(a.ndim != 1 for a in named.values()) or len({a.shape for a in named.values()}) != 1 or \
            len(named["time"]) == 0:
        raise UserError(f"{', '.join(named)} must be (N,) arrays of one length N > 0, got shapes {shapes}")
    for name in ("time",) + (("risk",) if risk is not None else ()):
        if not np.issubdtype(named[name].dtype, np.number) or not np.isfinite(named[name].astype(float)).all():
            raise UserError(f"{name} must hold finite numbers")
    time = named["time"].astype(np.float64)
    if (time < 0).any():
        raise UserError(f"time must be >= 0, got {time.min():g}")
    cause = named["cause"]
    if cause.dtype != bool and not np.issubdtype(cause.dtype, np.number):
        raise UserError(f"cause must hold integers (0 censored, 1..K the cause), got dtype {cause.dtype}")
    wrong = ~np.isfinite(cause.astype(np.float64)) | (cause != np.round(cause.astype(np.float64)))
    if wrong.any():
        raise UserError(f"cause must hold integers (0 censored, 1..K the cause), got {cause[wrong][0].item():g}")
    if (cause < 0).any():
        raise UserError(f"cause must be 0 (censored) or a cause 1..K, got {cause.min().item():g}")
    cause = cause.astype(np.int64)
    risk = () if risk is None else (named["risk"].astype(np.float64),)
    return (time, cause) + risk


def _cause_of_interest(k) -> int:
    """``k`` as an int >= 1, or a one-line :class:`UserError`."""
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k < 1:
        raise UserError(f"the cause of interest k must be an int >= 1 (0 is censoring), got {k!r}")
    return int(k)


def aalen_johansen(time, cause, k) -> tuple[np.ndarray, np.ndarray]:
    """The Aalen-Johansen estimate of the cumulative incidence of cause k, ``F_k(t) = P(T <= t, cause = k)``.

    Over the distinct times u with n_u at risk (``#{time >= u}``: a sample censored at u is still at risk there),
    d_u events of any cause and d_ku of cause k::

        F_k(t) = sum_{u <= t} S(u-) d_ku / n_u,    S(u-) = prod_{v < u} (1 - d_v / n_v)

    S the all-cause Kaplan-Meier survival just before u. Tied events (of one cause or several) share the risk set
    n_u; as breaking the tie in any order would give the same F_k after the tied time, no jitter is needed.
    The cause-k increments add up with those of the other causes to ``sum_k F_k(t) = 1 - S(t)``.

    -> ``times`` (M,), the distinct times with an event of any cause, ascending, and ``incidence`` (M,), F_k just
    after each (right-continuous steps): F_k = 0 before ``times[0]`` and ``incidence[m]`` on
    ``[times[m], times[m+1])``. Without events both arrays are empty (F_k = 0 throughout the follow-up).
    """
    time, cause = competing_arrays(time, cause)
    k = _cause_of_interest(k)
    unique, inverse = np.unique(time, return_inverse=True)
    total = np.bincount(inverse, minlength=len(unique))
    deaths = np.bincount(inverse, weights=cause > 0, minlength=len(unique))
    deaths_k = np.bincount(inverse, weights=cause == k, minlength=len(unique))
    at_risk = total.sum() - np.concatenate([[0], np.cumsum(total)[:-1]])
    survival = np.cumprod(1 - deaths / at_risk)
    before = np.concatenate([[1.0], survival[:-1]])
    incidence = np.cumsum(before * deaths_k / at_risk)
    steps = deaths > 0
    return unique[steps], incidence[steps]


def cumulative_incidence(time, cause, k, at) -> np.ndarray:
    """The Aalen-Johansen cumulative incidence of cause k (:func:`aalen_johansen`) at each of the times ``at``
    (M,) -> (M,): the events at exactly t count (F_k is right-continuous); 0 before the first event, the last value
    after the last time (an estimate past the follow-up is not one: choose ``at`` within it)."""
    at = np.asarray(at, dtype=np.float64)
    if at.ndim > 1 or not np.isfinite(at).all():
        raise UserError(f"at must be finite times, a number or (M,), got shape {at.shape}")
    times, incidence = aalen_johansen(time, cause, k)
    values = np.concatenate([[0.0], incidence])
    return values[np.searchsorted(times, np.atleast_1d(at), side="right")]


def cause_specific_c_index(risk_k, time, cause, k) -> float:
    """Harrell's C for cause k, the events of the other causes censored at their time::

        C_k = (#concordant + #tied / 2) / #comparable,  comparable: cause_i = k and (time_i < time_j, or
              time_i == time_j with cause_j != k);  concordant: risk_i > risk_j

    (:func:`medattn.metrics_survival.concordance_index` with ``event = (cause == k)``): how well ``risk_k`` orders
    the cause-specific hazard. A patient who died of another cause leaves the comparison at that time, as if
    censored. Equal to scikit-survival's ``concordance_index_censored(cause == k, time, risk_k)``. Raises
    :class:`UndefinedMetricError` without a comparable pair.
    """
    time, cause, risk = competing_arrays(time, cause, risk_k)
    return concordance_index(risk, time, cause == _cause_of_interest(k))


def cause_specific_bootstrap_ci(risk_k, time, cause, k, n_boot: int = 1000, ci: float = 0.95, seed: int = 0,
                                groups=None) -> tuple[float, float]:
    """Percentile bootstrap CI of :func:`cause_specific_c_index` (resampling patients ``groups`` where given, as
    :func:`medattn.metrics_survival.concordance_bootstrap_ci`, which it is with ``event = (cause == k)``)."""
    time, cause, risk = competing_arrays(time, cause, risk_k)
    return concordance_bootstrap_ci(risk, time, cause == _cause_of_interest(k), n_boot, ci, seed, groups)


def _competing_pair_counts(risk, time, cause, k) -> tuple[int, int, int]:
    """(concordant, tied-risk, comparable) pair counts of :func:`competing_c_index`; O(N * events) in blocks."""
    first = cause == k
    first_time, first_risk = time[first], risk[first]
    rows = max(1, _BLOCK // max(len(first_time), 1))
    concordant = tied = pairs = 0
    for start in range(0, len(time), rows):
        t, r, c = time[start:start + rows, None], risk[start:start + rows, None], cause[start:start + rows, None]
        competing = (c > 0) & (c != k)
        comparable = (first_time < t) | competing | ((first_time == t) & (c == 0))
        pairs += int(comparable.sum())
        concordant += int((comparable & (first_risk > r)).sum())
        tied += int((comparable & (first_risk == r)).sum())
    return concordant, tied, pairs


def competing_c_index(risk_k, time, cause, k) -> float:
    """Wolbers' C-index for competing risks (the unweighted, Harrell-type estimate of Wolbers et al. 2009).

    As the cause-specific C, but a patient j with an event of another cause stays comparable at any time: with
    the competing event j will never have event k, so i with event k at any time precedes j on the cause-k scale::

        comparable (i, j): cause_i = k and (time_i < time_j, or cause_j not in {0, k} (at any time_j),
                           or time_i == time_j with cause_j = 0)
        C_k = (#concordant + #tied / 2) / #comparable,  concordant: risk_i > risk_j

    Two events of cause k at one time and pairs with i not of cause k are not comparable. ``risk_k`` should
    order the cause-k cumulative incidence (for example the predicted F_k at a horizon), which depends on every
    cause's hazard; the cause-specific C scores the cause-k hazard alone. Without competing events the two are
    equal. No censoring weights (Wolbers et al. 2014's IPCW form): under heavy censoring it leans, like Harrell's
    C, towards the early pairs. Raises :class:`UndefinedMetricError` without a comparable pair.
    """
    time, cause, risk = competing_arrays(time, cause, risk_k)
    k = _cause_of_interest(k)
    concordant, tied, pairs = _competing_pair_counts(risk, time, cause, k)
    if pairs == 0:
        raise UndefinedMetricError(f"the competing-risks C-index of cause {k} is undefined: no comparable pair "
                                   f"among {len(time)} samples ({int((cause == k).sum())} events of cause {k})")
    return (concordant + tied / 2) / pairs
