"""Softmax attention (Vaswani et al. 2017; the ViT of Dosovitskiy et al. 2021).

``out_j = softmax(Q_j K_j^T / sqrt(d)) V_j`` per head j, computed by
:func:`torch.nn.functional.scaled_dot_product_attention` so PyTorch's fused (flash / memory
efficient) kernels run where they exist. Time is O(N^2 d); the fused kernels keep memory O(N).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import Attention
from .rows import SOFTMAX_BLOCK, ClassRows


class SoftmaxRows(ClassRows):
    """Softmax: ``A_h = softmax(q k^T / sqrt(d))`` over real keys, formed a block of queries at a time."""

    def blocks(self, q, k, mask):
        """(start, weights (B, H, b, N) float64) for consecutive blocks of b queries."""
        B, H, N, d = q.shape
        q, k = q.double(), k.double()
        key_bias = None if mask is None else torch.zeros(B, 1, 1, N, dtype=q.dtype).masked_fill(
            ~mask[:, None, None, :], float("-inf"))
        block = max(1, SOFTMAX_BLOCK // (N * H))
        for start in range(0, N, block):
            scores = q[:, :, start:start + block] @ k.transpose(-2, -1) / d ** 0.5  # (B, H, b, N)
            yield start, (scores if key_bias is None else scores + key_bias).softmax(dim=-1)

    def row(self, module, q, k, mask, r):
        r, out = r.double(), q.new_zeros(q.shape[0], q.shape[2], dtype=torch.float64)
        for start, weights in self.blocks(q, k, mask):
            out += torch.einsum("bn,bhnm->bm", r[:, start:start + weights.shape[2]], weights)
        return out / q.shape[1]

    def gradient_rows(self, module, q, k, v, mask, r, g):
        r, g, v = r.double(), g.double(), self.values(module, v, mask)
        out = q.new_zeros(q.shape[0], q.shape[1], q.shape[2], dtype=torch.float64)
        for start, weights in self.blocks(q, k, mask):
            stop = start + weights.shape[2]
            grad = g[:, :, start:stop] @ v.transpose(-2, -1)  # (B, H, b, N): d y / d A for these queries
            out += torch.einsum("bn,bhnm->bhm", r[:, start:stop], grad * weights)
        return out


class SoftmaxAttention(Attention):
    """Multi-head softmax attention.

    Shapes: q, k (B, H, N, d), v (B, H, N, D_v) -> (B, H, N, D_v). A mask (B, N) removes padded keys from every
    query's softmax (key-padding mask); padded query rows are zeroed by :class:`Attention`.
    """

    #: Its attention weights acting on a relevance row (:mod:`medattn.attention.rows`): explanations by rollout.
    rollout_rule = SoftmaxRows()

    supports_attn_drop = True

    @staticmethod
    def core_forward_flops(batch: int, heads: int, seq_len: int, head_dim: int) -> float:
        """``Q K^T`` and ``P V``: ``4 B H N^2 d``."""
        b, h, n, d = batch, heads, seq_len, head_dim
        return 4 * b * h * n * n * d

    def attend(self, q, k, v, mask):
        attn_mask = None if mask is None else mask[:, None, None, :]  # (B, 1, 1, N)
        dropout_p = self.attn_drop if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)


def softmax_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Explicit (B, H, N, N) form of softmax attention, for tests."""
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    return scores.softmax(dim=-1) @ v
