"""Explanations: which pixels, voxels or tiles a prediction rests on (docs/explain.md).

>>> from medattn.explain import explain
>>> heat = explain(model, images, method="rollout").relevance     # (B, H, W) for images

``rollout`` is class-token attention rollout, exact and linear-time for linear attention (SeqNorm, SimA);
``gradxinput`` is gradient x input for any model. Whole-slide bags too long for memory stream through
:func:`streaming_rollout`; :mod:`medattn.explain.outputs` writes PNG overlays, NIfTI maps and tile tables.
"""

from .core import METHODS, Explanation, explain, gradient_x_input
from .rollout import attention_rollout, record_attention, streaming_rollout
from .rows import ClassRows, FactorisedRows, register_rows, rows_for

__all__ = ["METHODS", "ClassRows", "Explanation", "FactorisedRows", "attention_rollout", "explain",
           "gradient_x_input", "record_attention", "register_rows", "rows_for", "streaming_rollout"]
