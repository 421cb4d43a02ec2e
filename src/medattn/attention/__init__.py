"""Attention mechanisms behind one interface, chosen by name.

>>> from medattn.attention import build_attention, available_attentions
>>> attn = build_attention("seqnorm", dim=64, num_heads=4)

Every mechanism subclasses :class:`medattn.attention.base.Attention` (timm's ``qkv``/``proj``
layout, ``forward(x, mask=None)``). Registering a mechanism is one file and one line in
:data:`medattn.catalogue.ATTENTIONS`; :func:`register` adds one at run time.
"""

from __future__ import annotations

import importlib

from medattn.catalogue import ATTENTIONS

from .base import Attention

_REGISTRY: dict[str, type[Attention]] = {}


def register(name: str, cls: type[Attention]) -> type[Attention]:
    """Make ``cls`` buildable as ``name``; the name must be new and ``cls`` an Attention subclass."""
    if not (isinstance(cls, type) and issubclass(cls, Attention)):
        raise TypeError(f"{cls!r} is not a subclass of medattn.attention.base.Attention")
    if name in _REGISTRY:
        raise ValueError(f"attention {name!r} is already registered")
    _REGISTRY[name] = cls
    return cls


def available_attentions() -> list[str]:
    """Registered mechanism names, sorted."""
    return sorted(_REGISTRY)


def get_attention_class(name: str) -> type[Attention]:
    """The class registered as ``name``; ValueError listing the valid names otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown attention {name!r}; available: {', '.join(available_attentions())}") from None


def build_attention(name: str, dim: int, num_heads: int = 8, inner_dim: int | None = None,
                    qkv_bias: bool = True, **kwargs) -> Attention:
    """Build mechanism ``name`` as ``cls(dim, num_heads, inner_dim, qkv_bias, **kwargs)``."""
    return get_attention_class(name)(dim, num_heads=num_heads, inner_dim=inner_dim, qkv_bias=qkv_bias, **kwargs)


for _name, _where in ATTENTIONS.items():
    _module, _class = _where.split(":")
    register(_name, getattr(importlib.import_module(_module), _class))

__all__ = ["Attention", "available_attentions", "build_attention", "get_attention_class", "register"]
