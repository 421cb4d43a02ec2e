"""Decision thresholds chosen on the validation split (Youden's J), stored in the checkpoint.

Binary and multi-label models output one probability per output; a predicted label needs a cut-off.
For each output the threshold maximises Youden's J = sensitivity + specificity - 1 = TPR(t) - FPR(t)
over the validation probabilities, a sample being called positive when ``p >= t``.

Decisions the statistics leave open:

* candidates are the distinct validation probabilities; among those with the largest J the highest
  (the most specific) is taken;
* the stored threshold is the midpoint between that probability and the next lower distinct one (or
  the probability itself when it is the lowest), so it sits in the gap between the validation samples
  it separates rather than on one of them;
* an output whose validation labels hold one class only has no J: its threshold is ``None`` and
  prediction falls back to 0.5, saying so;
* multi-class models predict the arg-max class and store no threshold.

Checkpoint form (``checkpoint.json`` key ``threshold``): ``{"values": [t or null per output], "rule":
"youden", "split": "val", "epoch": E}``.
"""

from __future__ import annotations

import numpy as np

from medattn.errors import UserError
from medattn.vocabulary import task_types

DEFAULT = 0.5


def youden_threshold(scores: np.ndarray, labels: np.ndarray) -> float | None:
    """scores (N,), labels (N,) 0/1 -> the threshold maximising TPR - FPR (see the module docstring), or None."""
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels) > 0.5
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if positives == 0 or negatives == 0:
        return None
    order = np.argsort(-scores, kind="stable")
    s, y = scores[order], labels[order]
    tp, fp = np.cumsum(y), np.cumsum(~y)
    last = np.r_[s[1:] != s[:-1], True]  # the last index of each run of equal scores: p >= s[i] takes 0..i
    candidates = np.flatnonzero(last)
    j = tp[candidates] / positives - fp[candidates] / negatives
    best = int(candidates[int(np.argmax(j))])  # argmax takes the first maximum: the highest threshold
    lower = s[best + 1] if best + 1 < len(s) else s[best]
    return float((s[best] + lower) / 2)


def choose_thresholds(probabilities: np.ndarray, labels: np.ndarray, task_type: str) -> list[float | None] | None:
    """Per-output thresholds of binary/multi-label validation predictions ((N, K) each); None for other tasks."""
    if not task_types.of(task_type).thresholds:
        return None
    probabilities, labels = np.asarray(probabilities), np.asarray(labels)
    return [youden_threshold(probabilities[:, k], labels[:, k]) for k in range(probabilities.shape[1])]


def threshold_meta(probabilities: np.ndarray, labels: np.ndarray, task_type: str, epoch: int) -> dict:
    """``{"threshold": ...}`` for checkpoint.json (empty for tasks without thresholds)."""
    values = choose_thresholds(probabilities, labels, task_type)
    if values is None:
        return {}
    return {"threshold": {"values": values, "rule": "youden", "split": "val", "epoch": epoch}}


def stored_thresholds(meta: dict, num_outputs: int, source: str) -> list[float | None] | None:
    """The checkpoint's thresholds (None when it stores none), checked: one number in [0, 1] or null per output."""
    stored = meta.get("threshold")
    if stored is None:
        return None
    return checked_thresholds(stored.get("values") if isinstance(stored, dict) else None, num_outputs,
                              f"{source}: threshold.values")


def checked_thresholds(values, num_outputs: int, where: str) -> list[float | None]:
    """``values`` (from a file: a checkpoint, an exported model's metadata) as one number in [0, 1] or null per
    output; a one-line UserError naming ``where`` otherwise."""
    if not isinstance(values, list) or len(values) != num_outputs or not all(
            v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1) for v in values):
        raise UserError(f"{where} must list {num_outputs} number(s) in [0, 1] or null, got {values!r}")
    return [None if v is None else float(v) for v in values]


def parse_thresholds(text: str, num_outputs: int) -> list[float]:
    """``--threshold`` text: one number for every output or one per output, comma-separated, each in [0, 1]."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        values = []
    if len(values) == 1:
        values *= num_outputs
    if len(values) != num_outputs or not all(0 <= v <= 1 for v in values):
        raise UserError(f"--threshold must be one number in [0, 1] or {num_outputs} comma-separated, got {text!r}")
    return values


def resolve_thresholds(stored: list[float | None] | None, override: str | None, num_outputs: int) -> \
        tuple[list[float], str]:
    """-> (threshold per output, where they come from) for a binary/multi-label model: the ``--threshold``
    text, else the stored validation thresholds (0.5 for outputs without one), else 0.5."""
    if override is not None:
        return parse_thresholds(override, num_outputs), "--threshold"
    if stored is None:
        return [DEFAULT] * num_outputs, "default 0.5 (the checkpoint stores no threshold)"
    missing = [k for k, v in enumerate(stored) if v is None]
    source = "validation Youden's J"
    if missing:
        source += f" (0.5 for output(s) {missing}: one class only in validation)"
    return [DEFAULT if v is None else v for v in stored], source
