"""Models that take their attention mechanism by name.

>>> from medattn.models import create_model
>>> model = create_model("vit2d", attention="seqnorm", num_classes=1, img_size=224)

Presets (:mod:`medattn.models.presets`) are the paper's Table 1 (``vit2d``, ``vit3d``, ``vitwsi``)
plus ``*_small`` and ``*_tiny`` ones for CPU demos and tests.
"""

from __future__ import annotations

import inspect

from torch import nn

from .convert import convert_attention
from .presets import PRESETS
from .vit import VisionTransformer
from .wsi import WSITransformer


def available_models() -> list[str]:
    """Preset names, sorted."""
    return sorted(PRESETS)


def takes_attention(name: str) -> bool:
    """Whether preset ``name``'s class takes an attention mechanism (an ``attention`` argument)."""
    if name not in PRESETS:
        raise ValueError(f"unknown model {name!r}; available: {', '.join(available_models())}")
    return "attention" in inspect.signature(PRESETS[name][0]).parameters


def create_model(name: str, attention: str | None = None, **kwargs) -> nn.Module:
    """Build preset ``name`` with mechanism ``attention``; keyword arguments override the preset.

    ``attention=None`` keeps the model's default mechanism (softmax). Models without attention (the 3D
    segmentation networks) take no mechanism: naming one for them is an error, not silently ignored.
    """
    accepts = takes_attention(name)
    if attention is not None and not accepts:
        raise ValueError(f"model {name!r} has no attention mechanism; got attention={attention!r} "
                         f"(set model.attention=null)")
    cls, preset = PRESETS[name]
    return cls(**{**preset, **({"attention": attention} if attention is not None else {}), **kwargs})


__all__ = ["VisionTransformer", "WSITransformer", "available_models", "convert_attention", "create_model",
           "takes_attention"]
