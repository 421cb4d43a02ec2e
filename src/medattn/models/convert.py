"""Swap the attention mechanism of a built model in place, keeping every shared weight.

Paper §3.4: a softmax ViT checkpoint initialises a softmax-free one. Every mechanism shares timm's
``qkv`` and ``proj`` layout, so those tensors are copied bit for bit; parameters that only the new
mechanism has (e.g. seqnorm's ``q_norm``/``k_norm``/``v_norm``) keep their initial values.
"""

from __future__ import annotations

import torch
from torch import nn

from medattn.attention import Attention, build_attention


def convert_attention(model: nn.Module, attention: str, **attention_kwargs) -> list[str]:
    """Replace every :class:`Attention` in ``model`` by mechanism ``attention``; returns the new tensors' names.

    The new modules keep ``dim``, ``num_heads``, ``inner_dim``, the ``qkv`` bias setting, dropout
    rates, device and dtype. Tensors of the old module whose name and shape the new one shares are
    copied; the returned list names the model's tensors that were freshly initialised.
    """
    replaced = [(name, module) for name, module in model.named_modules() if isinstance(module, Attention)]
    if not replaced:
        raise ValueError("the model has no medattn attention module to convert")
    fresh: list[str] = []
    for name, old in replaced:
        new = build_attention(attention, old.dim, num_heads=old.num_heads, inner_dim=old.inner_dim,
                              qkv_bias=old.qkv.bias is not None, proj_drop=_dropout_rate(old.proj_drop),
                              **attention_kwargs)
        if new.supports_attn_drop:
            new.attn_drop = old.attn_drop
        parameter = next(old.parameters())
        new.to(device=parameter.device, dtype=parameter.dtype).train(old.training)
        old_state = old.state_dict()
        with torch.no_grad():
            for key, tensor in new.state_dict().items():
                if key in old_state and old_state[key].shape == tensor.shape:
                    tensor.copy_(old_state[key])
                else:
                    fresh.append(f"{name}.{key}")
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, new)
    return fresh


def _dropout_rate(module: nn.Module) -> float:
    return module.p if isinstance(module, nn.Dropout) else 0.0
