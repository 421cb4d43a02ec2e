"""Shared machinery of the BinaryFormer mechanisms (Heinrich, MIDL 2025): value width, scores, paths.

Every binary mechanism writes its scores as a sum over (query term, key term) pairs::

    S = scale * sum_(a, b) (wq_a wk_b^T) * (yq_a yk_b^T),   P = softmax(S),   out = P V

with ``yq_a`` (B, H, N, d) tensors of exact +1/-1 values and ``wq_a`` (B, H, N) per-token weights (or
None for 1), likewise for keys; ``scale = 1 / sqrt(d)``. A subclass only implements
:meth:`BinaryAttention.binarise`. The sum is computed two ways that share every parameter:

* float emulation (:func:`emulated_attention`): differentiable, used whenever a gradient is needed;
* bit kernel (:func:`medattn.attention.binary.bits.binary_attention`): packed signs, popcount,
  key tiles with a softmax shift known in advance; used when no gradient is needed (inference, ``torch.no_grad``) on
  CPU tensors, except while the forward is compiled or exported (Numba code is not a PyTorch graph).
* Triton kernels (:func:`medattn.attention.triton_bits.triton_binary_attention`): packed signs, popcount, online
  softmax over key tiles, forward and backward; used on CUDA tensors where ``triton`` is installed, without dropout,
  untraced, with or without a gradient (the mechanism's own rule from :meth:`BinaryAttention.binarise`).

``value_dim`` (per head, the base class's option) narrows the values as in the paper's Fig. 1
(64 -> 16 per head).
"""

from __future__ import annotations

import torch
from torch import nn

from .. import triton_support
from ..base import Attention, is_traced
from .bits import Term, binary_attention


class BinaryAttention(Attention):
    """Base of the binary mechanisms: y = proj(softmax(S) V) with S from :meth:`binarise`.

    Args (besides :class:`~medattn.attention.base.Attention`'s, ``value_dim`` included; keywords):
        tile_size: key tile of the bit kernel (keys per probability tile and GEMM).
        bit_kernel: use the bit kernel when no gradient is needed on a CPU tensor (False: always the float
            emulation). On other devices the emulation runs (the kernel is CPU code and would round-trip
            through host memory), or on CUDA the Triton kernels where ``triton`` is installed.

    Shapes: x (B, N, dim), mask (B, N) bool (True = real token) -> (B, N, dim); padded rows are zero.
    """

    supports_attn_drop = True

    def __init__(self, *args, tile_size: int = 1024, bit_kernel: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if tile_size <= 0:
            raise ValueError(f"tile_size must be positive, got {tile_size}")
        self.tile_size = tile_size
        self.bit_kernel = bit_kernel

    def binarise(self, q: torch.Tensor, k: torch.Tensor) -> tuple[list[Term], list[Term]]:
        """Query and key terms ``[(signs (B, H, N, d), weights (B, H, N) or None), ...]``."""
        raise NotImplementedError

    def kernel_terms(self, q: torch.Tensor, k: torch.Tensor) -> tuple[list[Term], list[Term]]:
        """The terms for the bit kernel, which reads of each sign tensor only where it is ``>= 0``: a
        mechanism whose signs are ``sgn(q)`` may hand over ``q`` itself. Default: :meth:`binarise`'s."""
        return self.binarise(q, k)

    def attend(self, q, k, v, mask):
        """q, k (B, H, N, d), v (B, H, N, D_v), mask (B, N) or None -> (B, H, N, D_v)."""
        scale = self.head_dim**-0.5
        dropout = self.attn_drop if self.training else 0.0
        if self._runs_bit_kernel(q, k, v, dropout):
            q_terms, k_terms = self.kernel_terms(q, k)
            return binary_attention(q_terms, k_terms, v, scale, mask, self.tile_size)
        q_terms, k_terms = self.binarise(q, k)
        if dropout == 0.0 and not is_traced() and triton_support.runs_kernels(q, k, v):
            from ..triton_bits import triton_binary_attention  # imports triton: on this path only

            return triton_binary_attention(q_terms, k_terms, v, scale, mask)
        return emulated_attention(q_terms, k_terms, v, scale, mask, dropout)

    def _runs_bit_kernel(self, q, k, v, dropout: float) -> bool:
        """The bit kernel runs on CPU tensors when nothing needs a gradient, without dropout, untraced."""
        needs_grad = torch.is_grad_enabled() and (
            any(t.requires_grad for t in (q, k, v)) or any(p.requires_grad for p in self.parameters()))
        return self.bit_kernel and q.device.type == "cpu" and not needs_grad and dropout == 0.0 and not is_traced()


def emulated_scores(q_terms: list[Term], k_terms: list[Term], scale: float) -> torch.Tensor:
    """Float emulation of the binary scores: (B, H, N, N) ``scale * sum_(a,b) (wq_a wk_b^T) * (yq_a yk_b^T)``."""
    total = None
    for yq, wq in q_terms:
        for yk, wk in k_terms:
            s = yq @ yk.transpose(-2, -1)  # (B, H, N, N), exact integers
            if wq is not None:
                s = s * wq.unsqueeze(-1)
            if wk is not None:
                s = s * wk.unsqueeze(-2)
            total = s if total is None else total + s
    return total * scale


def emulated_attention(
    q_terms: list[Term], k_terms: list[Term], v: torch.Tensor, scale: float, mask: torch.Tensor | None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """softmax(emulated scores, padded keys removed) V with optional dropout on P: -> (B, H, N, D_v)."""
    s = emulated_scores(q_terms, k_terms, scale)
    if mask is not None:
        s = s.masked_fill(~mask[:, None, None, :], -torch.inf)
    p = s.softmax(dim=-1)
    if dropout > 0:
        p = nn.functional.dropout(p, dropout)
    return p @ v
