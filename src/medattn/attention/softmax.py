"""Softmax attention (Vaswani et al. 2017; the ViT of Dosovitskiy et al. 2021).

``out_j = softmax(Q_j K_j^T / sqrt(d)) V_j`` per head j, computed by
:func:`torch.nn.functional.scaled_dot_product_attention` so PyTorch's fused (flash / memory
efficient) kernels run where they exist. Time is O(N^2 d); the fused kernels keep memory O(N).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import Attention


class SoftmaxAttention(Attention):
    """Multi-head softmax attention.

    Shapes: q, k (B, H, N, d), v (B, H, N, D_v) -> (B, H, N, D_v). A mask (B, N) removes padded keys from every
    query's softmax (key-padding mask); padded query rows are zeroed by :class:`Attention`.
    """

    supports_attn_drop = True

    def attend(self, q, k, v, mask):
        attn_mask = None if mask is None else mask[:, None, None, :]  # (B, 1, 1, N)
        dropout_p = self.attn_drop if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)


def softmax_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Explicit (B, H, N, N) form of softmax attention, for tests."""
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    return scores.softmax(dim=-1) @ v
