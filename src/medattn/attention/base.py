"""The interface every attention mechanism implements.

A mechanism owns timm's parameter layout so that weights move between mechanisms and to and from
timm/MONAI-style models:

* ``qkv``: ``nn.Linear(dim, 2 * inner_dim + num_heads * value_dim)``; its output is ordered
  ``q | k | v`` and inside each part the heads are contiguous (channel ``h * head_dim + i`` belongs to
  head ``h``). With the default ``value_dim = head_dim`` this is timm's ``nn.Linear(dim, 3 * inner_dim)``.
* ``proj``: ``nn.Linear(num_heads * value_dim, dim)`` (timm's ``nn.Linear(inner_dim, dim)`` by default).

Subclasses implement :meth:`Attention.attend` on per-head tensors and may add their own
parameters; :meth:`Attention.forward`, the only forward, does the projections, the checks and the
masking contract for every mechanism, so the keyword contract (``mask=``, ``attn_mask=``) and the value
width cannot drift between mechanisms.
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
        value_dim: per-head value width D_v (default: ``head_dim``; BinaryFormer's Fig. 1 narrows it
            to 16). Queries and keys keep ``head_dim``.
        proj_bias, qk_norm, scale_norm, norm_layer, device, dtype: the keywords timm's blocks pass to their
            ``attn_layer`` (timm 1.0), so ``timm.models.vision_transformer.Block(dim, heads, attn_layer=cls)``
            builds any mechanism: ``proj_bias`` is the bias of ``proj``, ``device``/``dtype`` those of
            ``qkv`` and ``proj``; ``qk_norm``/``scale_norm`` must stay False (``norm_layer`` then has no use).

    Shapes: ``x`` is (B, N, dim); ``mask`` is (B, N) bool with True for real tokens, or None.
    :meth:`attend` sees q, k (B, H, N, head_dim) and v (B, H, N, value_dim) and returns
    (B, H, N, value_dim). The output is (B, N, dim); positions where ``mask`` is False are exactly zero.
    """

    #: Whether the mechanism forms attention weights that ``attn_drop`` can act on.
    supports_attn_drop = False
    #: True where backward uses a surrogate (e.g. straight-through) gradient, so gradcheck does not apply.
    surrogate_gradient = False
    #: Passes over a sequence that chunked streaming inference needs; 0 = the mechanism cannot stream
    #: (it needs all tokens at once). Mechanisms with passes > 0 implement ``stream_begin``,
    #: ``stream_update``, ``stream_end`` and ``stream_forward`` (see ``WSITransformer.forward_streaming``).
    stream_passes = 0

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        inner_dim: int | None = None,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        value_dim: int | None = None,
        *,
        proj_bias: bool = True,
        qk_norm: bool = False,
        scale_norm: bool = False,
        norm_layer: type[nn.Module] | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if qk_norm or scale_norm:
            raise ValueError(f"{type(self).__name__} takes no qk_norm/scale_norm (timm's extra LayerNorms): each "
                             f"mechanism normalises q and k its own way")
        factory = {"device": device, "dtype": dtype}
        inner_dim = dim if inner_dim is None else inner_dim
        if dim <= 0 or inner_dim <= 0 or num_heads <= 0:
            raise ValueError(f"dim, inner_dim and num_heads must be positive, got {dim}, {inner_dim}, {num_heads}")
        if value_dim is not None and value_dim <= 0:
            raise ValueError(f"value_dim must be positive, got {value_dim}")
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
        self.value_dim = self.head_dim if value_dim is None else value_dim
        self.attn_drop = attn_drop
        self.qkv = nn.Linear(dim, 2 * inner_dim + num_heads * self.value_dim, bias=qkv_bias, **factory)
        self.proj = nn.Linear(num_heads * self.value_dim, dim, bias=proj_bias, **factory)
        self.proj_drop = nn.Dropout(proj_drop) if proj_drop > 0 else nn.Identity()

    @staticmethod
    def core_forward_flops(batch: int, heads: int, seq_len: int, head_dim: int) -> float | None:
        """Matmul FLOPs of one forward of :meth:`attend` (the roofline of ``medattn bench``); None: no model."""
        return None

    def extra_repr(self) -> str:
        value = "" if self.value_dim == self.head_dim else f", value_dim={self.value_dim}"
        return f"dim={self.dim}, num_heads={self.num_heads}, inner_dim={self.inner_dim}{value}"

    def split_heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``qkv`` output (..., N, 2 inner_dim + H D_v) -> q, k (..., H, N, d) and v (..., H, N, D_v), views."""
        *lead, N, _ = qkv.shape
        H = self.num_heads
        q, k, v = qkv.split([self.inner_dim, self.inner_dim, H * self.value_dim], dim=-1)
        q = q.unflatten(-1, (H, self.head_dim)).transpose(-3, -2)  # (..., H, N, d)
        k = k.unflatten(-1, (H, self.head_dim)).transpose(-3, -2)  # (..., H, N, d)
        v = v.unflatten(-1, (H, self.value_dim)).transpose(-3, -2)  # (..., H, N, D_v)
        return q, k, v

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        """(B, N, dim), optional (B, N) bool mask -> (B, N, dim).

        ``attn_mask`` and ``is_causal`` are accepted so timm and MONAI transformer blocks, which pass those
        keywords, can hold this module: ``attn_mask`` must be None or the same (B, N) key-padding mask as
        ``mask``; ``is_causal`` must be False (image tokens have no order; no mechanism here is causal).
        """
        if is_causal:
            raise ValueError(f"{type(self).__name__} is not causal: is_causal must be False")
        if attn_mask is not None:
            if mask is not None:
                raise ValueError("give either mask or attn_mask, not both")
            mask = attn_mask
        check_input(x, mask, self.dim)
        B, N, _ = x.shape
        q, k, v = self.split_heads(self.qkv(x))  # (B, H, N, d), (B, H, N, d), (B, H, N, D_v)
        out = self.attend(q, k, v, mask)  # (B, H, N, D_v)
        out = out.transpose(1, 2).reshape(B, N, self.num_heads * self.value_dim)  # (B, N, H*D_v)
        out = self.proj(out)
        if mask is not None:
            out = out * mask.unsqueeze(-1).to(out.dtype)
        return self.proj_drop(out)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Per-head attention: q, k (B, H, N, d), v (B, H, N, D_v), mask (B, N) or None -> (B, H, N, D_v)."""
        raise NotImplementedError


class EpsAttention(Attention):
    """A softmax-free mechanism whose normaliser ``eps`` keeps away from zero (linear attention adds it, SimA clamps
    its norms at it): the base class's arguments and ``eps`` (keyword, default 1e-6), kept as ``self.eps``."""

    def __init__(self, *args, eps: float = 1e-6, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.eps = eps


def check_input(x: torch.Tensor, mask: torch.Tensor | None, dim: int) -> None:
    """Raise ValueError unless x is (B, N, dim) and mask is None or a (B, N) bool with a real token per row.

    The last condition depends on the mask's values, so compiled and exported graphs do not check it.
    """
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
    if not is_traced() and not bool(mask.any(dim=1).all()):  # a data-dependent check: eager mode only
        raise ValueError("mask has a sequence with no real token")


def is_traced() -> bool:
    """True while torch.compile, torch.export, ONNX export or the JIT tracer records the forward.

    Mechanisms whose fast path chooses its route from the data (or leaves PyTorch, like the bit kernel)
    take their plain PyTorch form then, so graphs have no break and export needs no data-dependent branch.
    """
    return (torch.compiler.is_compiling() or torch.compiler.is_exporting() or torch.onnx.is_in_onnx_export()
            or torch.jit.is_tracing())


def is_exporting() -> bool:
    """True while torch.export, ONNX export or the JIT tracer records the forward (not plain torch.compile):
    registered medattn operators are left out then, so an exported program runs without medattn."""
    return torch.compiler.is_exporting() or torch.onnx.is_in_onnx_export() or torch.jit.is_tracing()


def float32_or_wider(x: torch.Tensor) -> torch.dtype:
    """float32 for a lower-precision x (bf16/fp16), else x's own dtype (float64 stays)."""
    return torch.promote_types(x.dtype, torch.float32)


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 if it is in a lower precision (bf16/fp16), unchanged otherwise (float64 stays)."""
    return x.to(float32_or_wider(x))


def token_weights(mask: torch.Tensor | None, like: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | int]:
    """Mask as (B, 1, N, 1) weights in ``like``'s dtype and the count of real tokens, (B, 1, 1, 1) or N.

    ``like`` is a per-head tensor (B, H, N, d). Without a mask the weights are None and the count is N.
    """
    if mask is None:
        return None, like.shape[-2]
    weights = mask[:, None, :, None].to(like.dtype)  # (B, 1, N, 1)
    return weights, weights.sum(dim=2, keepdim=True)  # (B, 1, 1, 1)
