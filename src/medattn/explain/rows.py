"""A mechanism's attention weights applied to a relevance row vector, never as an N x N matrix.

Rollout (:mod:`medattn.explain.rollout`) needs, for a row vector r (B, N) over the tokens and every
head's attention weights A_h (N x N) with values V_h (the tensor A_h multiplies: ``out_h = A_h V_h``):

* ``row``: the head-mean ``mean_h r^T A_h`` (attention rollout);
* ``gradient_rows``: per head ``r^T (G_h ⊙ A_h)`` with ``G_h = dy/dA_h = g_h V_h^T`` (``g_h = dy/d out_h``,
  (N, D_v)), i.e. entry j is ``sum_i r_i (g_i . v_j) A_ij`` (gradient-weighted rollout).

How a mechanism forms A_h is mechanism-specific; this module holds one rule per mechanism class, found
by :func:`rows_for` along the class's MRO (a new mechanism registers its own with :func:`register_rows`).
No rule changes a model or its forward.

Linear attention (:class:`FactorisedRows`): ``A_h = s * phi_q(Q)_h phi_k(K)_h^T`` with per-token feature
maps that depend on the sequence only through additive statistics (sums over tokens), so

    r^T A_h = s * (r^T phi_q(Q)_h) phi_k(K)_h^T            (a d-vector, then N dot products)

costs O(N d) time and memory, never an N x N matrix, and the same statistics can be summed chunk by chunk
(streaming). The gradient-weighted row factorises too:

    [r^T (G_h ⊙ A_h)]_j = s * sum_{a,b} phi_k[j,a] V[j,b] M[a,b],   M = sum_i r_i phi_q[i] g_i^T  (d x D_v)

in O(N d D_v) time and O(N (d + D_v)) memory. Rules: SeqNorm ``phi(Q) = Q'``, ``phi(K) = K'``, values ``V'``
(sequence-normalized, eqs. 2-7 of Khader et al.), ``s = 1/N``; SimA ``phi(Q) = Q / ||Q||_1,N``, ``phi(K) = K /
||K||_1,N``, ``s = 1``; elu+1 linear attention ``phi(q_i) = (elu(q_i)+1) / ((elu(q_i)+1) . sum_n (elu(k_n)+1)
+ eps)``, ``phi(k) = elu(k)+1``.

Softmax (:class:`SoftmaxRows`) forms the weights explicitly, ``softmax(q k^T / sqrt(d))`` over real keys,
a block of queries at a time (memory O(block N), time O(N^2 d)).

Statistics are float64 sums (SeqNorm: the count, sum x and sum x^2 of q and k, so the variance is
``E[x^2] - mean^2`` in float64: exact to about 1e-16 * mean^2/var, far below float32 rounding unless a
channel's mean exceeds its spread by 10^6). All rows are returned in float64.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..attention import Attention
from ..attention.linear import LinearAttention
from ..attention.seqnorm import SeqNormAttention
from ..attention.seqnorm_fused import scale_shift, sequence_normalize
from ..attention.sima import SimAAttention
from ..attention.softmax import SoftmaxAttention
from ..errors import UserError

#: Largest (queries x keys x heads) block of softmax weights formed at once.
SOFTMAX_BLOCK = 1 << 22


def _weights(mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    """(B, N) bool mask -> (B, 1, N, 1) float64 weights, or None."""
    return None if mask is None else mask[:, None, :, None].to(torch.float64)


def _masked(x: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    return x if weights is None else x * weights


class ClassRows:
    """How one mechanism's attention weights act on a relevance row."""

    def row(self, module: Attention, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None,
            r: torch.Tensor) -> torch.Tensor:
        """Head-mean of ``r^T A_h``: q, k (B, H, N, d), mask (B, N) or None, r (B, N) -> (B, N) float64."""
        raise NotImplementedError

    def values(self, module: Attention, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The values the weights multiply, (B, H, N, D_v) float64 (the projected v unless overridden)."""
        return v.double()

    def gradient_rows(self, module: Attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      mask: torch.Tensor | None, r: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """Per head ``r^T (G_h ⊙ A_h)`` with ``G_h[i, j] = g_i . values_j``: q, k (B, H, N, d), v and g
        (B, H, N, D_v) (g = d y / d out_h), r (B, N) -> (B, H, N) float64."""
        raise UserError(f"the rollout rule of {type(module).__name__} has no gradient-weighted form; use --method "
                        f"rollout or gradxinput")


class FactorisedRows(ClassRows):
    """``A_h = s phi_q phi_k^T`` with per-token maps fixed by additive statistics (module docstring)."""

    def statistics(self, module: Attention, q: torch.Tensor, k: torch.Tensor,
                   weights: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """Sums over the tokens of q, k (B, H, n, d) (float64), to be added across chunks of one sequence."""
        raise NotImplementedError

    def maps(self, module: Attention, q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor | None,
             stats: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(phi_q, phi_k) (B, H, n, d) float64, zero at padded tokens, and s (B, 1, 1) for the whole sequence."""
        raise NotImplementedError

    def row(self, module, q, k, mask, r):
        q, k = q.double(), k.double()
        weights = _weights(mask, q)
        phi_q, phi_k, scale = self.maps(module, q, k, weights, self.statistics(module, q, k, weights))
        u = torch.einsum("bn,bhnd->bhd", r.double(), phi_q)  # r^T phi_q per head
        return torch.einsum("bhd,bhnd->bn", u, phi_k) * scale[:, :, 0] / q.shape[1]

    def gradient_rows(self, module, q, k, v, mask, r, g):
        q, k = q.double(), k.double()
        weights = _weights(mask, q)
        phi_q, phi_k, scale = self.maps(module, q, k, weights, self.statistics(module, q, k, weights))
        m = (phi_q * r.double()[:, None, :, None]).transpose(-2, -1) @ g.double()  # (B, H, d, D_v)
        return ((phi_k @ m) * self.values(module, v, mask)).sum(-1) * scale  # (B, H, N)


class SeqNormRows(FactorisedRows):
    """SeqNorm: ``A_h = Q'_h K'_h^T / N`` (normalized q, k with the module's own affine and eps)."""

    def statistics(self, module, q, k, weights):
        q, k = q.double(), k.double()
        count = torch.full_like(q[:, :1, :1, :1], q.shape[2]) if weights is None else weights.sum(2, keepdim=True)
        return {"count": count,
                **{f"{name}{power}": _masked(x, weights).mul(x if power == 2 else 1).sum(2, keepdim=True)
                   for name, x in (("q", q), ("k", k)) for power in (1, 2)}}

    def maps(self, module, q, k, weights, stats):
        count, H = stats["count"], module.num_heads
        out = []
        for name, x, norm in (("q", q, module.q_norm), ("k", k, module.k_norm)):
            gamma, beta = (p.detach().double().view(1, H, 1, -1) for p in (norm.weight, norm.bias))
            scale, shift, _, _ = scale_shift(stats[f"{name}1"], stats[f"{name}2"], count, gamma, beta, norm.eps)
            out.append(_masked(x.double() * scale + shift, weights))
        return out[0], out[1], 1.0 / count[:, 0]

    def values(self, module, v, mask):
        v = v.double()
        weights = _weights(mask, v)
        count = v.shape[2] if weights is None else weights.sum(2, keepdim=True)
        norm, H = module.v_norm, module.num_heads
        gamma, beta = (p.detach().double().view(1, H, 1, -1) for p in (norm.weight, norm.bias))
        return sequence_normalize(v, gamma, beta, weights, count, norm.eps)


class SimARows(FactorisedRows):
    """SimA: ``A_h = (Q / ||Q||_1,N)_h (K / ||K||_1,N)_h^T`` (norms over real tokens, clamped at eps)."""

    def statistics(self, module, q, k, weights):
        return {name: _masked(x.double().abs(), weights).sum(2, keepdim=True) for name, x in (("q", q), ("k", k))}

    def maps(self, module, q, k, weights, stats):
        phi = [_masked(x.double(), weights) / stats[name].clamp_min(module.eps) for name, x in (("q", q), ("k", k))]
        return phi[0], phi[1], q.new_ones(q.shape[0], 1, 1, dtype=torch.float64)


class EluLinearRows(FactorisedRows):
    """elu+1 linear attention: ``A_h[i, j] = phi(q_i) . phi(k_j) / (phi(q_i) . sum_n phi(k_n) + eps)``."""

    def statistics(self, module, q, k, weights):
        return {"k": _masked(F.elu(k.double()) + 1.0, weights).sum(2, keepdim=True)}  # (B, H, 1, d)

    def maps(self, module, q, k, weights, stats):
        phi_q = F.elu(q.double()) + 1.0
        phi_q = _masked(phi_q / (phi_q @ stats["k"].transpose(-2, -1) + module.eps), weights)
        return phi_q, _masked(F.elu(k.double()) + 1.0, weights), q.new_ones(q.shape[0], 1, 1, dtype=torch.float64)


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


_ROWS: dict[type, ClassRows] = {
    SeqNormAttention: SeqNormRows(),
    SimAAttention: SimARows(),
    LinearAttention: EluLinearRows(),
    SoftmaxAttention: SoftmaxRows(),
}


def register_rows(cls: type, rows: ClassRows) -> None:
    """Give mechanism class ``cls`` (and its subclasses without a rule of their own) the rule ``rows``."""
    if not (isinstance(cls, type) and issubclass(cls, Attention)):
        raise TypeError(f"{cls!r} is not a subclass of medattn.attention.base.Attention")
    _ROWS[cls] = rows


def rows_for(module: Attention) -> ClassRows:
    """The rule of ``module``'s class (the nearest registered class along its MRO); UserError if none."""
    for cls in type(module).__mro__:
        if cls in _ROWS:
            return _ROWS[cls]
    raise UserError(f"attention rollout has no rule for {type(module).__name__} (it forms no attention weights "
                    f"rollout can read); use --method gradxinput")
