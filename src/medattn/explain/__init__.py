"""Explanations: which pixels, voxels or tiles a prediction rests on (docs/explain.md).

>>> from medattn.explain import explain
>>> heat = explain(model, images).relevance     # (B, H, W) for images; method "auto": gradrollout where it applies

``gradrollout`` (the default for transformers) is gradient-weighted rollout (Chefer et al.'s attention-gradient
rule, positive part per head on the relevance row) and ``rollout`` class-token attention rollout, both linear-time
for linear attention (SeqNorm, SimA); ``gradxinput`` is gradient x input for any model; ``attention`` a bag
model's own attention weights per tile (attention-MIL, TransMIL: the model's ``tile_attention``). Whole-slide bags
too long for memory stream through :func:`streaming_rollout` (plain rollout);
:mod:`medattn.explain.outputs` draws PNG overlays and figures, :mod:`medattn.explain.tile_scores` a bag's tiles
(pictures, tables, GeoJSON).
"""

from .core import METHODS, Explanation, check_method, default_method, explain, gradient_x_input, tile_attention
from .rollout import attention_rollout, gradient_rollout, record_attention, streaming_rollout
from .rows import rows_for

__all__ = ["METHODS", "Explanation", "attention_rollout", "check_method", "default_method", "explain",
           "gradient_rollout", "gradient_x_input", "record_attention", "rows_for", "streaming_rollout",
           "tile_attention"]
