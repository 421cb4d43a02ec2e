"""Softmax-free attention with sequence normalization.

Khader et al., "Compute-Efficient Medical Image Classification with Softmax-Free Transformers and
Sequence Normalization" (§2.1, eqs. 2-7).

For each batch element and channel f, Q, K and V are normalized over the token axis and given a
separate learnable affine (``q_norm``, ``k_norm``, ``v_norm``)::

    Q' = gamma_q * (Q - mean_N Q) / sqrt(var_N Q + eps) + beta_q       (same for K, V)
    out_j = Q'_j (K'_j^T V'_j) / N                                       per head j

``K'^T V'`` is (d, d) per head, so time and memory are linear in N; no N x N matrix is formed.

Choices the paper leaves open (docs/decisions.md):

* eps = 1e-5 inside the square root, biased variance (divide by N), as in instance norm.
* The class token is an ordinary token: it enters the statistics and the K^T V sum.
* With a mask, the mean, the variance, the K^T V sum and N count only real tokens; padded
  positions of Q', K', V' are zero, so they contribute nothing and produce zero output.
* Statistics and the normalization run in float32 even under autocast. Under bf16 autocast q, k and
  v arrive in bf16 and the fused core keeps them so: its two products run in bf16 (accumulated in
  float32), its statistics in float32 (the bf16 core, :mod:`medattn.attention.seqnorm_fused`);
  float16 is upcast to float32, and export takes the float32 explicit form.
* A sequence of one token (or of identical tokens) has zero variance: Q' = beta_q etc., finite.
* The fused core is a registered operator (``medattn::seqnorm_core``), so ``torch.compile(fullgraph=True)`` keeps
  it; under ``torch.export`` and ONNX export the explicit centred form runs (the same numbers, written without the
  fused path's data-dependent choice), so an exported program needs no medattn.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import triton_support
from .base import Attention, at_least_float32, is_exporting, token_weights
from .rows import FactorisedRows, masked, row_weights
from .seqnorm_fused import keeps_dtype, seqnorm_core
from .seqnorm_maths import affine_views, centred_seqnorm, scale_shift, sequence_normalize

if triton_support.available():  # CUDA tensors run the core's Triton kernels (imports triton)
    from .triton_seqnorm import register

    register()


class SequenceNorm(nn.Module):
    """Per-channel normalization over the token axis with a learnable affine.

    Input (B, H, N, d) with channel ``h * d + i``; ``weight`` (gamma) and ``bias`` (beta) have shape
    (H * d,), initialised to 1 and 0. ``weights`` (B, 1, N, 1) selects real tokens, ``count`` is their
    number; padded positions of the output are zero. Statistics run in float32.
    """

    def __init__(self, num_channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(num_channels))
        self.bias = nn.Parameter(torch.zeros(num_channels))

    def forward(self, x: torch.Tensor, weights: torch.Tensor | None, count) -> torch.Tensor:
        B, H, N, d = x.shape
        x = at_least_float32(x)
        gamma = self.weight.to(x.dtype).view(1, H, 1, d)
        beta = self.bias.to(x.dtype).view(1, H, 1, d)
        return sequence_normalize(x, gamma, beta, None if weights is None else weights.to(x.dtype), count, self.eps)


class SeqNormRows(FactorisedRows):
    """SeqNorm: ``A_h = Q'_h K'_h^T / N`` (normalized q, k with the module's own affine and eps)."""

    def statistics(self, module, q, k, weights):
        q, k = q.double(), k.double()
        count = torch.full_like(q[:, :1, :1, :1], q.shape[2]) if weights is None else weights.sum(2, keepdim=True)
        return {"count": count,
                **{f"{name}{power}": masked(x, weights).mul(x if power == 2 else 1).sum(2, keepdim=True)
                   for name, x in (("q", q), ("k", k)) for power in (1, 2)}}

    def maps(self, module, q, k, weights, stats):
        count, H = stats["count"], module.num_heads
        out = []
        for name, x, norm in (("q", q, module.q_norm), ("k", k, module.k_norm)):
            gamma, beta = (p.detach().double().view(1, H, 1, -1) for p in (norm.weight, norm.bias))
            scale, shift, _, _ = scale_shift(stats[f"{name}1"], stats[f"{name}2"], count, gamma, beta, norm.eps)
            out.append(masked(x.double() * scale + shift, weights))
        return out[0], out[1], 1.0 / count[:, 0]

    def values(self, module, v, mask):
        v = v.double()
        weights = row_weights(mask, v)
        count = v.shape[2] if weights is None else weights.sum(2, keepdim=True)
        norm, H = module.v_norm, module.num_heads
        gamma, beta = (p.detach().double().view(1, H, 1, -1) for p in (norm.weight, norm.bias))
        return sequence_normalize(v, gamma, beta, weights, count, norm.eps)


class SeqNormAttention(Attention):
    """Softmax-free attention with sequence-normalized Q, K, V (see the module docstring).

    Extra args: ``eps`` (1e-5), the initial ``eps`` of all three norms; each norm's own ``.eps`` is used
    (they may be set apart). Parameters beyond timm's layout: ``q_norm``, ``k_norm`` with ``.weight``
    and ``.bias`` of shape (inner_dim,), and ``v_norm`` with shape (num_heads * value_dim,).
    Shapes: q, k (B, H, N, d), v (B, H, N, D_v) -> (B, H, N, D_v).

    :meth:`attend` runs the fused raw-moment path, or the explicit centred form where the raw moments
    are ill-conditioned (:mod:`medattn.attention.seqnorm_fused`); tests prove both equal to an
    independent explicit reference, in value, gradient and second derivative.
    """

    #: Its attention weights acting on a relevance row (:mod:`medattn.attention.rows`): explanations by rollout.
    rollout_rule = SeqNormRows()

    def __init__(self, dim: int, num_heads: int = 8, inner_dim: int | None = None, qkv_bias: bool = True,
                 attn_drop: float = 0.0, proj_drop: float = 0.0, value_dim: int | None = None,
                 eps: float = 1e-5, **timm_kwargs) -> None:
        super().__init__(dim, num_heads, inner_dim, qkv_bias, attn_drop, proj_drop, value_dim, **timm_kwargs)
        self.q_norm = SequenceNorm(self.inner_dim, eps)
        self.k_norm = SequenceNorm(self.inner_dim, eps)
        self.v_norm = SequenceNorm(num_heads * self.value_dim, eps)

    @property
    def norms(self) -> tuple[SequenceNorm, SequenceNorm, SequenceNorm]:
        return self.q_norm, self.k_norm, self.v_norm

    @staticmethod
    def core_forward_flops(batch: int, heads: int, seq_len: int, head_dim: int) -> float:
        """``K'^T V'`` and ``Q' C``: ``4 B H N d^2``."""
        b, h, n, d = batch, heads, seq_len, head_dim
        return 4 * b * h * n * d * d

    def attend(self, q, k, v, mask):
        dtype, exporting = q.dtype, is_exporting()
        if exporting or not keeps_dtype(q):  # bf16 stays bf16 in the fused core (its statistics in float32)
            q, k, v = at_least_float32(q), at_least_float32(k), at_least_float32(v)
        weights, count = token_weights(mask, q)
        params = [p for norm in self.norms for p in (norm.weight, norm.bias)]
        eps = tuple(norm.eps for norm in self.norms)
        with torch.autocast(q.device.type, enabled=False):
            if exporting:  # branch-free explicit form: no medattn operator in an exported program
                out = centred_seqnorm(q, k, v, affine_views(params, q), weights, count, eps)
            else:
                out = seqnorm_core(q, k, v, params, weights, eps)
        return out.to(dtype)

    # Streaming inference over one very long sequence (B = 1), in chunks of tokens (n_c, dim), in one
    # pass: each chunk's mean, centred sums of squares and centred K^T V are merged into the running
    # ones with Chan et al.'s pairwise update, in float64, so no moment about zero is ever formed.
    stream_passes = 1

    def stream_begin(self) -> dict:
        return {"count": 0}

    def stream_update(self, state: dict, x: torch.Tensor, pass_index: int) -> None:
        """Merge the statistics of a chunk x (1, n_c, dim) into ``state``.

        ``state`` holds the token count, per tensor t in (q, k, v) the mean and centred sum of squares
        (H, 1, d_t), and the centred ``K^T V`` (H, d, D_v), all float64.
        """
        n_b = x.shape[-2]
        qkv = self.split_heads(self.qkv(x.reshape(n_b, self.dim)))  # (H, n_c, d), (H, n_c, d), (H, n_c, D_v)
        qkv = [at_least_float32(t) for t in qkv]
        mean_b = [t.mean(dim=1, keepdim=True) for t in qkv]  # each (H, 1, d_t)
        centred = [t - m for t, m in zip(qkv, mean_b)]
        m2_b = [c.square().sum(dim=1, keepdim=True).double() for c in centred]
        ckv_b = (centred[1].transpose(-2, -1) @ centred[2]).double()  # (H, d, D_v)
        mean_b, n_a = [m.double() for m in mean_b], state["count"]
        if n_a == 0:
            state.update(count=n_b, mean=mean_b, m2=m2_b, ckv=ckv_b)
            return
        n = n_a + n_b
        delta = [mb - ma for mb, ma in zip(mean_b, state["mean"])]
        state["count"] = n
        state["mean"] = [ma + dt * (n_b / n) for ma, dt in zip(state["mean"], delta)]
        state["m2"] = [ma + mb + dt.square() * (n_a * n_b / n) for ma, mb, dt in zip(state["m2"], m2_b, delta)]
        state["ckv"] = state["ckv"] + ckv_b + delta[1].transpose(-2, -1) * delta[2] * (n_a * n_b / n)

    def stream_end(self, state: dict, pass_index: int) -> None:
        """Turn the merged statistics into ``out = q a_q + b`` for :meth:`stream_forward`."""
        n, H = state["count"], self.num_heads
        scale, beta = [], []
        for norm, m2 in zip(self.norms, state.pop("m2")):
            gamma = norm.weight.double().view(H, 1, -1)
            scale.append(gamma * torch.rsqrt(m2 / n + norm.eps))  # (H, 1, d_t)
            beta.append(norm.bias.double().view(H, 1, -1))
        # K'^T V' = s_k^T s_v * (centred K^T V) + n beta_k^T beta_v; the centred sums vanish.
        a = (scale[1].transpose(-2, -1) * state.pop("ckv") * scale[2]) / n + beta[1].transpose(-2, -1) * beta[2]
        state["a_q"] = (scale[0].transpose(-2, -1) * a).float()  # (H, d, D_v)
        state["b"] = ((beta[0] - state["mean"][0] * scale[0]) @ a).float()  # (H, 1, D_v)

    def stream_forward(self, state: dict, x: torch.Tensor) -> torch.Tensor:
        """Output (1, n_c, dim) for a chunk x (1, n_c, dim) once both passes have ended."""
        n, inner = x.shape[-2], self.inner_dim
        q = F.linear(x.reshape(n, self.dim), self.qkv.weight[:inner],
                     None if self.qkv.bias is None else self.qkv.bias[:inner])
        q = q.view(n, self.num_heads, self.head_dim).transpose(0, 1)  # (H, n_c, d)
        out = torch.baddbmm(state["b"], q, state["a_q"])  # (H, n_c, D_v)
        return self.proj(out.transpose(0, 1).reshape(1, n, self.num_heads * self.value_dim))
