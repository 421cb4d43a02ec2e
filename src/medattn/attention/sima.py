"""SimA attention, as the baseline of the SeqNorm paper (Koohpayegani & Pirsavash, WACV 2024).

The plain-ViT form: Q and K are each divided, per channel, by their l1 norm over the tokens; V is
untouched; there is no softmax and no scaling::

    Q^ = Q / ||Q||_1,N      K^ = K / ||K||_1,N       (norm over tokens, per channel)
    out_j = (Q^_j K^_j^T) V_j    if N < d      else    Q^_j (K^_j^T V_j)

Both orders give the same result; the cheaper one is chosen (compiled and exported graphs always
take ``Q^ (K^T V)``, so one graph serves every N). The SimA repository's XCiT stem,
local patch interaction and class-attention layers are not part of this baseline.
With a mask, the norms and the sums count only real tokens. The norm is clamped at ``eps``
(1e-6) so an all-zero channel gives zeros instead of NaN. The norms run in float32 under autocast.
"""

from __future__ import annotations

import torch

from .base import EpsAttention, at_least_float32, is_traced, token_weights
from .rows import FactorisedRows, masked


def l1_normalize_over_tokens(x, weights, eps: float):
    """x (B, H, N, d) divided by its per-channel l1 norm over real tokens; padded rows zero."""
    x32 = at_least_float32(x)
    if weights is not None:
        x32 = x32 * weights.to(x32.dtype)
    norm = x32.abs().sum(dim=2, keepdim=True).clamp_min(eps)  # (B, H, 1, d)
    return (x32 / norm).to(x.dtype)


class SimARows(FactorisedRows):
    """SimA: ``A_h = (Q / ||Q||_1,N)_h (K / ||K||_1,N)_h^T`` (norms over real tokens, clamped at eps)."""

    def statistics(self, module, q, k, weights):
        return {name: masked(x.double().abs(), weights).sum(2, keepdim=True) for name, x in (("q", q), ("k", k))}

    def maps(self, module, q, k, weights, stats):
        phi = [masked(x.double(), weights) / stats[name].clamp_min(module.eps) for name, x in (("q", q), ("k", k))]
        return phi[0], phi[1], q.new_ones(q.shape[0], 1, 1, dtype=torch.float64)


class SimAAttention(EpsAttention):
    """SimA: l1-normalized Q and K, plain V. Shapes: q, k (B, H, N, d), v (B, H, N, D_v) -> (B, H, N, D_v)."""

    #: Its attention weights acting on a relevance row (:mod:`medattn.attention.rows`): explanations by rollout.
    rollout_rule = SimARows()

    @staticmethod
    def core_forward_flops(batch: int, heads: int, seq_len: int, head_dim: int) -> float:
        """The cheaper order of ``(Q K^T) V`` or ``Q (K^T V)``: ``4 B H N d min(N, d)``."""
        b, h, n, d = batch, heads, seq_len, head_dim
        return 4 * b * h * n * d * min(n, d)

    def attend(self, q, k, v, mask):
        weights, _ = token_weights(mask, q)
        q = l1_normalize_over_tokens(q, weights, self.eps)
        k = l1_normalize_over_tokens(k, weights, self.eps)  # padded keys are zero
        if not is_traced() and q.shape[-2] < q.shape[-1]:  # graphs take the order that suits every N
            return (q @ k.transpose(-2, -1)) @ v  # (B, H, N, N) @ (B, H, N, d)
        return q @ (k.transpose(-2, -1) @ v)  # (B, H, N, d) @ (B, H, d, d)
