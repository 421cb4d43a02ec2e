"""The interface every attention mechanism implements.

A mechanism owns timm's parameter layout so that weights move between mechanisms and to and from
timm/MONAI-style models:

* ``qkv``: ``nn.Linear(dim, 3 * inner_dim)``; its output is ordered ``q | k | v`` and inside each
  part the heads are contiguous (channel ``h * head_dim + i`` belongs to head ``h``).
* ``proj``: ``nn.Linear(inner_dim, dim)``.

Subclasses implement :meth:`Attention.attend` on per-head tensors and may add their own
parameters; :meth:`Attention.forward` does the projections, the checks and the masking contract.
"""

from __future__ import annotations

import torch
from torch import nn


class Attention(nn.Module):
    """Multi-head attention skeleton: ``y = proj(attend(split_heads(qkv(x))))``.

    Args:
        dim: token dimension D' of the input and output.
        num_heads: number of heads J.
        inner_dim: attention dimension D (q, k and v each have D channels, D/J per head).
            Defaults to ``dim``.
        qkv_bias: whether ``qkv`` has a bias.
        attn_drop: dropout on the attention weights (only mechanisms that form them accept > 0).
        proj_drop: dropout after the output projection.

    Shapes: ``x`` is (B, N, dim); ``mask`` is (B, N) bool with True for real tokens, or None.
    The output is (B, N, dim); positions where ``mask`` is False are exactly zero.
    """

    #: Whether the mechanism forms attention weights that ``attn_drop`` can act on.
    supports_attn_drop = False
    #: True where backward uses a surrogate (e.g. straight-through) gradient, so gradcheck does not apply.
    surrogate_gradient = False
    #: Passes over a sequence that chunked streaming inference needs; 0 = the mechanism cannot stream
    #: (it needs all tokens at once). Mechanisms with passes > 0 implement ``stream_begin``,
    #: ``stream_update``, ``stream_end`` and ``stream_forward`` (see :mod:`medattn.models.streaming`).
    stream_passes = 0

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        inner_dim: int | None = None,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ) -> None:
        super().__init__()
        inner_dim = dim if inner_dim is None else inner_dim
        if dim <= 0 or inner_dim <= 0 or num_heads <= 0:
            raise ValueError(f"dim, inner_dim and num_heads must be positive, got {dim}, {inner_dim}, {num_heads}")
        if inner_dim % num_heads:
            raise ValueError(f"inner_dim {inner_dim} is not divisible by num_heads {num_heads}")
        if not 0.0 <= attn_drop < 1.0 or not 0.0 <= proj_drop < 1.0:
            raise ValueError(f"dropout rates must lie in [0, 1), got attn_drop={attn_drop}, proj_drop={proj_drop}")
        if attn_drop > 0 and not self.supports_attn_drop:
            raise ValueError(f"{type(self).__name__} forms no attention matrix, so attn_drop must be 0")
        self.dim = dim
        self.num_heads = num_heads
        self.inner_dim = inner_dim
        self.head_dim = inner_dim // num_heads
        self.attn_drop = attn_drop
        self.qkv = nn.Linear(dim, 3 * inner_dim, bias=qkv_bias)
        self.proj = nn.Linear(inner_dim, dim)
        self.proj_drop = nn.Dropout(proj_drop) if proj_drop > 0 else nn.Identity()

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, inner_dim={self.inner_dim}"

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, N, dim), optional (B, N) bool mask -> (B, N, dim).

        ``attn_mask`` is accepted so timm and MONAI transformer blocks, which pass that keyword, can
        hold this module; it must be None or the same (B, N) key-padding mask as ``mask``.
        """
        if attn_mask is not None:
            if mask is not None:
                raise ValueError("give either mask or attn_mask, not both")
            mask = attn_mask
        check_input(x, mask, self.dim)
        B, N, _ = x.shape
        qkv = self.qkv(x).view(B, N, 3, self.num_heads, self.head_dim)  # (B, N, 3, H, d)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, N, d)
        out = self.attend(q, k, v, mask)  # (B, H, N, d)
        out = out.transpose(1, 2).reshape(B, N, self.inner_dim)  # (B, N, H*d)
        out = self.proj(out)
        if mask is not None:
            out = out * mask.unsqueeze(-1).to(out.dtype)
        return self.proj_drop(out)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Per-head attention: q, k, v are (B, H, N, d); returns (B, H, N, d)."""
        raise NotImplementedError


def check_input(x: torch.Tensor, mask: torch.Tensor | None, dim: int) -> None:
    """Raise ValueError unless x is (B, N, dim) and mask is None or a (B, N) bool with a real token per row."""
    if x.ndim != 3 or x.shape[-1] != dim:
        raise ValueError(f"expected input of shape (B, N, {dim}), got {tuple(x.shape)}")
    if x.shape[1] == 0:
        raise ValueError("the input sequence is empty (N = 0)")
    if mask is None:
        return
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor (True = real token), got {mask.dtype}")
    if mask.shape != x.shape[:2]:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match input (B, N) = {tuple(x.shape[:2])}")
    if not bool(mask.any(dim=1).all()):
        raise ValueError("mask has a sequence with no real token")


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 if it is in a lower precision (bf16/fp16), unchanged otherwise (float64 stays)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def token_weights(mask: torch.Tensor | None, like: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | int]:
    """Mask as (B, 1, N, 1) weights in ``like``'s dtype and the count of real tokens, (B, 1, 1, 1) or N.

    ``like`` is a per-head tensor (B, H, N, d). Without a mask the weights are None and the count is N.
    """
    if mask is None:
        return None, like.shape[-2]
    weights = mask[:, None, :, None].to(like.dtype)  # (B, 1, N, 1)
    return weights, weights.sum(dim=2, keepdim=True)  # (B, 1, 1, 1)
