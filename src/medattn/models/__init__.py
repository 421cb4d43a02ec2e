"""Models that take their attention mechanism by name.

>>> from medattn.models import create_model
>>> model = create_model("vit2d", attention="seqnorm", num_classes=1, img_size=224)

Presets (:mod:`medattn.models.presets`) are the paper's Table 1 (``vit2d``, ``vit3d``, ``vitwsi``)
plus ``*_small`` and ``*_tiny`` ones for CPU demos and tests, and baselines without attention
(``resnet2d``/``resnet3d``, gated attention-MIL ``abmil``), and 2D segmentation with a ViT-S/8 encoder and a
convolutional decoder (``vit_s8_seg``, ``vit_s8_seg_tiny``).
"""

from __future__ import annotations

import inspect

from torch import nn

from .convert import convert_attention
from .mil import AttentionMIL
from .presets import PRESETS
from .resnet import ResNet
from .segmentation.vit_seg import SegmentationViT
from .vit import VisionTransformer
from .wsi import WSITransformer


def available_models() -> list[str]:
    """Preset names, sorted."""
    return sorted(PRESETS)


def _preset_class(name: str) -> type:
    if name not in PRESETS:
        raise ValueError(f"unknown model {name!r}; available: {', '.join(available_models())}")
    return PRESETS[name][0]


def takes_attention(name: str) -> bool:
    """Whether preset ``name``'s class takes an attention mechanism (an ``attention`` argument)."""
    return "attention" in inspect.signature(_preset_class(name)).parameters


def is_transformer(name: str) -> bool:
    """Whether preset ``name`` is a transformer: its class takes a mechanism (:func:`takes_attention`) or has an
    attention of its own and says so (``has_attention = True``: Swin's windowed attention, TransMIL's softmax)."""
    return takes_attention(name) or getattr(_preset_class(name), "has_attention", False)


def input_contract(name: str) -> str:
    """What preset ``name``'s forward takes: ``"bag"`` (features (B, N, F), mask, coords) or ``"image"``
    ((B, C, *spatial)); a model class declares it as its ``input_contract`` attribute (default "image")."""
    return getattr(_preset_class(name), "input_contract", "image")


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


__all__ = ["AttentionMIL", "ResNet", "SegmentationViT", "VisionTransformer", "WSITransformer", "available_models",
           "convert_attention", "create_model", "input_contract", "takes_attention"]
