"""Survival losses: the negative Cox partial log-likelihood (Breslow's ties) and the discrete-time logistic-hazard
negative log-likelihood (Gensheimer & Narasimhan 2019), with the choice of the discrete-time intervals.

Shapes: ``risk`` (B,) the model's log hazard ratio (higher = earlier event); ``time`` (B,) follow-up times;
``event`` (B,) 1/True for an observed event, 0/False for a censoring; ``logits`` (B, T) one hazard logit per time
interval; ``time_bin`` (B,) int64, the interval of each sample's time.

References: Cox, JRSS B 34:187 (1972); Breslow, Biometrics 30:89 (1974); Gensheimer & Narasimhan, PeerJ 7:e6257
(2019); Kvamme & Borgan, arXiv:1910.06724 (2019) (the logistic-hazard likelihood).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from medattn.errors import UserError


def cox_partial_likelihood(risk: torch.Tensor, time: torch.Tensor, event: torch.Tensor) -> torch.Tensor:
    """Negative Cox partial log-likelihood with Breslow's ties, divided by the number of events -> scalar.

    Over the D samples with an event, R(i) = {j : time_j >= time_i} (Breslow: the events tied at time_i share
    one risk set, which holds all of them and every sample censored at time_i)::

        loss = -(1 / D) sum_{i : event_i} [ risk_i - log sum_{j in R(i)} exp(risk_j) ]

    The log-sums are one ``logcumsumexp`` over the risks sorted by descending time, read at the last sample of
    each tied time: stable for any scale of ``risk``, O(B log B). A batch without an event has no term: the loss
    is ``risk.sum() * 0``, a zero that keeps the graph, so ``backward`` runs (and gives zero gradients).
    Times are compared exactly (ties are equal values). The partial likelihood couples the samples of one
    batch: the risk sets are the batch's, so the loss depends on the batch size and composition.
    """
    if risk.ndim != 1 or time.shape != risk.shape or event.shape != risk.shape:
        raise ValueError(f"risk, time and event must be (B,) of one shape, got {tuple(risk.shape)}, "
                         f"{tuple(time.shape)} and {tuple(event.shape)}")
    observed = event.bool()
    if not observed.any():
        return risk.sum() * 0
    order = torch.argsort(time, descending=True, stable=True)
    descending = time[order]
    log_risk_set = torch.logcumsumexp(risk[order], dim=0)
    # the last sorted position with a time >= each one's: its risk set ends there, after every tie
    last = torch.searchsorted(-descending, -descending, right=True) - 1
    terms = risk[order] - log_risk_set[last]
    events = observed[order]
    return -terms[events].sum() / events.sum()


def discrete_time_nll(logits: torch.Tensor, time_bin: torch.Tensor, event: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood of logistic hazards per time interval, the mean over the batch -> scalar.

    ``h_k = sigmoid(logits[:, k])`` is the probability of the event in interval k given survival to its start.
    A sample with its event in interval j = ``time_bin`` survived intervals 0..j-1 and had the event in j; a
    sample censored in interval j survived 0..j-1 (it is not credited with surviving interval j, which it left
    part-way)::

        loss = -(1 / B) sum_b [ sum_{k < j_b} log(1 - h_bk) + event_b log h_bj_b ]

    with ``log h = logsigmoid(logit)`` and ``log(1 - h) = logsigmoid(-logit)`` (stable). Survival to the end of
    interval k is ``prod_{l <= k} (1 - h_l)``.
    """
    if logits.ndim != 2 or time_bin.shape != logits.shape[:1] or event.shape != logits.shape[:1]:
        raise ValueError(f"logits must be (B, T) and time_bin, event (B,), got {tuple(logits.shape)}, "
                         f"{tuple(time_bin.shape)} and {tuple(event.shape)}")
    intervals = logits.shape[1]
    if time_bin.dtype.is_floating_point or ((time_bin < 0) | (time_bin >= intervals)).any():
        raise ValueError(f"time_bin must hold interval indices in 0..{intervals - 1}")
    survived = torch.arange(intervals, device=logits.device) < time_bin[:, None]
    survival = (F.logsigmoid(-logits) * survived).sum(1)
    hazard = F.logsigmoid(logits).gather(1, time_bin[:, None].long())[:, 0]
    return -(survival + event.to(logits.dtype) * hazard).mean()


def time_bins(time, event, n_bins: int) -> np.ndarray:
    """Edges of ``n_bins`` intervals for :func:`discrete_time_nll` -> (n_bins + 1,), ascending.

    ``edges[0] = 0``, the inner edges at the quantiles k / n_bins (k = 1 .. n_bins - 1) of the event times (so
    each interval holds about as many events; ``numpy.quantile``, linear interpolation), ``edges[-1]`` the
    largest time. Interval k is ``[edges[k], edges[k+1])``; :func:`time_bin_index` assigns times to them.
    Raises :class:`~medattn.errors.UserError` when the event times give fewer distinct inner edges than asked.
    """
    time = np.asarray(time, dtype=np.float64)
    event = np.asarray(event).astype(bool)
    if time.ndim != 1 or event.shape != time.shape or (time < 0).any():
        raise ValueError(f"time (>= 0) and event must be (N,) of one shape, got {time.shape} and {event.shape}")
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    if not event.any():
        raise UserError("time_bins: no event to place the interval edges at")
    inner = np.quantile(time[event], np.arange(1, n_bins) / n_bins)
    edges = np.concatenate([[0.0], inner, [time.max()]])
    if (np.diff(edges[:-1]) <= 0).any():
        raise UserError(f"time_bins: {n_bins} intervals need {n_bins - 1} distinct positive quantiles of the "
                        f"{int(event.sum())} event times ({len(np.unique(time[event]))} distinct); use fewer bins")
    return edges


def time_bin_index(time, edges: np.ndarray) -> np.ndarray:
    """The interval of each time -> (N,) int64: k with ``edges[k] <= time < edges[k+1]``; times at or past the
    last inner edge (a test time beyond the training times included) fall in the last interval."""
    edges = np.asarray(edges, dtype=np.float64)
    return np.searchsorted(edges[1:-1], np.asarray(time, dtype=np.float64), side="right").astype(np.int64)


def baseline_logits(time_bin: torch.Tensor, event: torch.Tensor, n_bins: int) -> torch.Tensor:
    """The per-interval hazard logits that minimise :func:`discrete_time_nll` for a constant risk -> (n_bins,).

    With the loss's convention (a sample censored in interval j was at risk in 0..j-1 only), the maximum
    likelihood hazard of interval k is ``d_k / n_k``: ``d_k`` the events in k, ``n_k`` the samples whose interval
    is past k plus those with their event in k (the discrete Kaplan-Meier hazard). Returned as logits, the
    hazards clipped to [1e-4, 1 - 1e-4] so an interval without events (or with only events) stays finite.
    """
    time_bin, observed = time_bin.long(), event.bool()
    events = torch.bincount(time_bin[observed], minlength=n_bins).double()
    past = torch.tensor([(time_bin > k).sum().item() for k in range(n_bins)], dtype=torch.float64)
    hazard = (events / (past + events).clamp(min=1)).clamp(1e-4, 1 - 1e-4)
    return torch.logit(hazard).float()


def logistic_hazard_loss(risk: torch.Tensor, time_bin: torch.Tensor, event: torch.Tensor,
                         baseline: torch.Tensor) -> torch.Tensor:
    """:func:`discrete_time_nll` of a proportional-odds head: one risk per sample shifts every interval's logit.

    ``risk`` (B,) the model's one output, ``baseline`` (T,) the training split's constant-risk logits
    (:func:`baseline_logits`)::

        logit h_bk = baseline_k + risk_b,      loss = discrete_time_nll(logits (B, T), time_bin, event)

    Cox's discrete-time (proportional odds) model (JRSS B 34:187, 1972, section 6). Each hazard rises with the
    risk, so the survival curve (:func:`survival_curves`) falls and the expected survival shortens monotonically
    in it: the risk itself ranks patients (the C-index of ``risk`` is that of minus the expected survival). The
    loss splits into per-sample terms, so it is defined for a batch of one bag.
    """
    logits = baseline.to(risk)[None, :] + risk[:, None]
    return discrete_time_nll(logits, time_bin, event)


def survival_curves(risk: torch.Tensor, baseline: torch.Tensor) -> torch.Tensor:
    """Per-patient survival at the end of each interval -> (B, T): ``S_bk = prod_{l <= k} (1 - sigmoid(baseline_l +
    risk_b))`` (:func:`logistic_hazard_loss`'s model); ``risk`` (B,), ``baseline`` (T,)."""
    logits = baseline.to(risk)[None, :] + risk[:, None]
    return torch.exp(torch.cumsum(F.logsigmoid(-logits), dim=1))
