"""A mechanism's attention weights applied to a relevance row vector, never as an N x N matrix.

Rollout (:mod:`medattn.explain.rollout`) needs, for a row vector r (B, N) over the tokens and every
head's attention weights A_h (N x N) with values V_h (the tensor A_h multiplies: ``out_h = A_h V_h``):

* ``row``: the head-mean ``mean_h r^T A_h`` (attention rollout);
* ``gradient_rows``: per head ``r^T (G_h ⊙ A_h)`` with ``G_h = dy/dA_h = g_h V_h^T`` (``g_h = dy/d out_h``,
  (N, D_v)), i.e. entry j is ``sum_i r_i (g_i . v_j) A_ij`` (gradient-weighted rollout).

How a mechanism forms A_h is mechanism-specific: each mechanism class carries its rule as its class attribute
``rollout_rule`` (an instance of a :class:`ClassRows` subclass defined beside it, in its own file), so a new
mechanism brings its rule in its one file; this module holds the shared machinery. No rule changes a model or
its forward.

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

from ..errors import UserError

#: Largest (queries x keys x heads) block of softmax weights formed at once.
SOFTMAX_BLOCK = 1 << 22


def row_weights(mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    """(B, N) bool mask -> (B, 1, N, 1) float64 weights, or None."""
    return None if mask is None else mask[:, None, :, None].to(torch.float64)


def masked(x: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    return x if weights is None else x * weights


class ClassRows:
    """How one mechanism's attention weights act on a relevance row."""

    def row(self, module, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None,
            r: torch.Tensor) -> torch.Tensor:
        """Head-mean of ``r^T A_h``: q, k (B, H, N, d), mask (B, N) or None, r (B, N) -> (B, N) float64."""
        raise NotImplementedError

    def values(self, module, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The values the weights multiply, (B, H, N, D_v) float64 (the projected v unless overridden)."""
        return v.double()

    def gradient_rows(self, module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      mask: torch.Tensor | None, r: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """Per head ``r^T (G_h ⊙ A_h)`` with ``G_h[i, j] = g_i . values_j``: q, k (B, H, N, d), v and g
        (B, H, N, D_v) (g = d y / d out_h), r (B, N) -> (B, H, N) float64."""
        raise UserError(f"the rollout rule of {type(module).__name__} has no gradient-weighted form; use --method "
                        f"rollout or gradxinput")


class FactorisedRows(ClassRows):
    """``A_h = s phi_q phi_k^T`` with per-token maps fixed by additive statistics (module docstring)."""

    def statistics(self, module, q: torch.Tensor, k: torch.Tensor,
                   weights: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """Sums over the tokens of q, k (B, H, n, d) (float64), to be added across chunks of one sequence."""
        raise NotImplementedError

    def maps(self, module, q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor | None,
             stats: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(phi_q, phi_k) (B, H, n, d) float64, zero at padded tokens, and s (B, 1, 1) for the whole sequence."""
        raise NotImplementedError

    def row(self, module, q, k, mask, r):
        q, k = q.double(), k.double()
        weights = row_weights(mask, q)
        phi_q, phi_k, scale = self.maps(module, q, k, weights, self.statistics(module, q, k, weights))
        u = torch.einsum("bn,bhnd->bhd", r.double(), phi_q)  # r^T phi_q per head
        return torch.einsum("bhd,bhnd->bn", u, phi_k) * scale[:, :, 0] / q.shape[1]

    def gradient_rows(self, module, q, k, v, mask, r, g):
        q, k = q.double(), k.double()
        weights = row_weights(mask, q)
        phi_q, phi_k, scale = self.maps(module, q, k, weights, self.statistics(module, q, k, weights))
        m = (phi_q * r.double()[:, None, :, None]).transpose(-2, -1) @ g.double()  # (B, H, d, D_v)
        return ((phi_k @ m) * self.values(module, v, mask)).sum(-1) * scale  # (B, H, N)
