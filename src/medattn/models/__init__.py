"""Models that take their attention mechanism by name.

>>> from medattn.models import create_model
>>> model = create_model("vit2d", attention="seqnorm", num_classes=1, img_size=224)

Presets (:mod:`medattn.models.presets`) are the paper's Table 1 (``vit2d``, ``vit3d``, ``vitwsi``)
plus ``*_small`` and ``*_tiny`` ones for CPU demos and tests.
"""

from __future__ import annotations

from torch import nn

from .convert import convert_attention
from .presets import PRESETS
from .vit import VisionTransformer
from .wsi import WSITransformer


def available_models() -> list[str]:
    """Preset names, sorted."""
    return sorted(PRESETS)


def create_model(name: str, attention: str = "softmax", **kwargs) -> nn.Module:
    """Build preset ``name`` with mechanism ``attention``; keyword arguments override the preset."""
    if name not in PRESETS:
        raise ValueError(f"unknown model {name!r}; available: {', '.join(available_models())}")
    cls, preset = PRESETS[name]
    return cls(**{**preset, "attention": attention, **kwargs})


__all__ = ["VisionTransformer", "WSITransformer", "available_models", "convert_attention", "create_model"]
