"""Linear attention with the elu(x) + 1 feature map (Katharopoulos et al., ICML 2020).

``phi(x) = elu(x) + 1`` (positive), and per head j::

    out_i = phi(q_i)^T (sum_n phi(k_n) v_n^T) / (phi(q_i)^T sum_n phi(k_n) + eps)

Time and memory are linear in N. With a mask, padded keys leave both sums. eps = 1e-6.
The feature maps and the normalizer run in float32 under autocast.
"""

from __future__ import annotations

import torch

from .base import EpsAttention, at_least_float32, token_weights
from .rows import FactorisedRows, masked


def elu_plus_one(x: torch.Tensor) -> torch.Tensor:
    """``elu(x) + 1`` written as ``x + 1`` (x > 0) or ``exp(min(x, 0))``: the same values (exp(x) is elu's
    expm1(x) + 1 without the rounding of the sum), and a backward that ``torch.compile``'s ``aot_eager`` backend
    can run on the strided per-head views (``F.elu``'s backward there asked for an impossible view)."""
    return torch.where(x > 0, x + 1.0, torch.exp(x.clamp(max=0.0)))


class EluLinearRows(FactorisedRows):
    """elu+1 linear attention: ``A_h[i, j] = phi(q_i) . phi(k_j) / (phi(q_i) . sum_n phi(k_n) + eps)``."""

    def statistics(self, module, q, k, weights):
        return {"k": masked(elu_plus_one(k.double()), weights).sum(2, keepdim=True)}  # (B, H, 1, d)

    def maps(self, module, q, k, weights, stats):
        phi_q = elu_plus_one(q.double())
        phi_q = masked(phi_q / (phi_q @ stats["k"].transpose(-2, -1) + module.eps), weights)
        return phi_q, masked(elu_plus_one(k.double()), weights), q.new_ones(q.shape[0], 1, 1, dtype=torch.float64)


class LinearAttention(EpsAttention):
    """elu+1 linear attention. Shapes: q, k (B, H, N, d), v (B, H, N, D_v) -> (B, H, N, D_v)."""

    #: Its attention weights acting on a relevance row (:mod:`medattn.attention.rows`): explanations by rollout.
    rollout_rule = EluLinearRows()

    @staticmethod
    def core_forward_flops(batch: int, heads: int, seq_len: int, head_dim: int) -> float:
        """As SeqNorm plus the normaliser ``phi(Q) sum_n phi(k_n)``: ``4 B H N d^2 + 2 B H N d``."""
        b, h, n, d = batch, heads, seq_len, head_dim
        return 4 * b * h * n * d * d + 2 * b * h * n * d

    def attend(self, q, k, v, mask):
        weights, _ = token_weights(mask, q)
        dtype = q.dtype
        q = elu_plus_one(at_least_float32(q))
        k = elu_plus_one(at_least_float32(k))
        if weights is not None:
            k = k * weights.to(k.dtype)
        context = k.transpose(-2, -1).to(dtype) @ v  # (B, H, d, d)
        normalizer = q @ k.sum(dim=2, keepdim=True).transpose(-2, -1)  # (B, H, N, 1)
        return (q.to(dtype) @ context) / (normalizer + self.eps).to(dtype)
