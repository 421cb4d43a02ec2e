"""The cause-specific Cox loss for competing risks: one log-hazard head per cause, each trained by the Cox partial
likelihood of :func:`medattn.train.survival_loss.cox_partial_likelihood` with the events of its cause as events and
every other sample (censored, or ended by another cause) censored at its time.

Shapes: ``logits`` (B, K) one log cause-specific hazard ratio per cause (column k - 1 for cause k, higher = earlier
event of that cause); ``time`` (B,) follow-up times; ``cause`` (B,) integers, 0 censored, 1..K the cause of the
event that ended follow-up (the convention of :mod:`medattn.metrics_competing`).

References: Prentice, Kalbfleisch, Peterson, Flournoy, Farewell & Breslow, Biometrics 34:541 (1978) (the
cause-specific hazards and their partial likelihood); Putter, Fiocco & Geskus, Stat Med 26:2389 (2007).
"""

from __future__ import annotations

import torch

from medattn.errors import UserError
from medattn.train.survival_loss import cox_partial_likelihood


def _checked_cause(logits: torch.Tensor, time: torch.Tensor, cause: torch.Tensor) -> torch.Tensor:
    """``cause`` as int64 (B,), or a one-line error: shapes (``ValueError``), values outside 0..K (``UserError``)."""
    if logits.ndim != 2 or time.shape != logits.shape[:1] or cause.shape != logits.shape[:1]:
        raise ValueError(f"logits must be (B, K) and time, cause (B,), got {tuple(logits.shape)}, "
                         f"{tuple(time.shape)} and {tuple(cause.shape)}")
    causes = logits.shape[1]
    if cause.dtype.is_floating_point and not torch.equal(cause, cause.round()):
        raise UserError("cause must hold integers (0 censored, 1..K the cause)")
    cause = cause.long()
    if ((cause < 0) | (cause > causes)).any():
        raise UserError(f"cause must be 0 (censored) or a cause 1..{causes} (one logit per cause), got "
                        f"{int(cause.min())}..{int(cause.max())}")
    return cause


def cause_specific_cox(logits: torch.Tensor, time: torch.Tensor, cause: torch.Tensor) -> torch.Tensor:
    """Negative log of the cause-specific Cox partial likelihoods, Breslow's ties, per event of any cause -> scalar.

    With D_k the events of cause k, D = sum_k D_k, and R(i) = {j : time_j >= time_i} (one risk set for every
    cause: a patient stays at risk of each cause until the first event or censoring)::

        loss = -(1 / D) sum_k sum_{i : cause_i = k} [ logits_ik - log sum_{j in R(i)} exp(logits_jk) ]
             = sum_k (D_k / D) cox_partial_likelihood(logits[:, k - 1], time, cause == k)

    The cause-specific likelihood factorises over causes (Prentice et al. 1978), so with a separate head per cause
    each head's minimiser is the Cox fit of its cause with the other causes censored; dividing by the events of
    all causes (not per cause) makes it the joint likelihood per event, equal to the Cox loss for K = 1, and
    weights a rare cause by its share of the events. A batch without an event is ``logits.sum() * 0`` (a zero
    that keeps the graph); a cause without an event in the batch adds nothing.
    """
    cause = _checked_cause(logits, time, cause)
    events = int((cause > 0).sum())
    if events == 0:
        return logits.sum() * 0
    total = logits.sum() * 0
    for k in range(1, logits.shape[1] + 1):
        observed = cause == k
        count = int(observed.sum())
        if count:
            total = total + cox_partial_likelihood(logits[:, k - 1], time, observed) * count
    return total / events
