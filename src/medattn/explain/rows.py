"""The rollout rule of an attention module: what its weights do to a relevance row (:mod:`medattn.attention.rows`).

Each mechanism class carries its rule (``rollout_rule``, defined in the mechanism's own file); a mechanism
without one forms no attention weights rollout can read (the binary mechanisms), and explanations fall back
to gradient x input.
"""

from __future__ import annotations

from ..attention import Attention
from ..attention.rows import ClassRows
from ..errors import UserError


def rows_for(module: Attention) -> ClassRows:
    """The rule ``module``'s class carries (``rollout_rule``, inherited along the MRO); UserError if none."""
    rule = getattr(module, "rollout_rule", None)
    if isinstance(rule, ClassRows):
        return rule
    raise UserError(f"attention rollout has no rule for {type(module).__name__} (it forms no attention weights "
                    f"rollout can read); use --method gradxinput")
