"""The four BinaryFormer mechanisms (Heinrich, MIDL 2025, §2.1-2.2); registry names in brackets.

All compute ``out = softmax(S) V`` with ``S = (1 / sqrt(d)) * sum_(a,b) (wq_a wk_b^T) * (yq_a yk_b^T)``
(see :mod:`.core`); they differ in the binary operands ``y`` and the weights ``w``:

* :class:`BinarySTEAttention` [binary-ste]: ``y = sgn(q)``, ``sgn(k)``, no weights; straight-through
  gradient ``1{|x| <= 1}`` (eq. 3) into the Q/K projections.
* :class:`BinarySGAttention` [binary-sg]: as above with the gradient stopped (the paper's baseline:
  the Q/K projections receive no gradient from attention).
* :class:`BinaryHammingAttention` [binary-hamming]: ``y = sgn(q)``, ``sgn(k)`` (no gradient) and
  learned per-token, per-head scalars ``w = theta(sigma(x) || sgn(x))`` from a small MLP shared by the
  heads, one for queries and one for keys, on the modified tanh ``sigma`` of eq. (4). Gradients reach
  the Q/K projections only through ``w``.
* :class:`BinaryBernoulliAttention` [binary-bernoulli]: two probabilistic signs ``y1, y2 = psgn(sigma(x))``
  per operand with bilinear weights ``w1 = d2 / (d1 + d2)``, ``w2 = d1 / (d1 + d2)`` from the mean
  binarisation distances ``d = mean_j |x_j - y_j|``: four binary dot products.
"""

from __future__ import annotations

import torch

from .bits import Term
from .core import BinaryAttention
from .sign import bernoulli_sign, modified_tanh, sign, sign_ste
from .token_weight import TokenWeight


class BinarySGAttention(BinaryAttention):
    """Sign of Q and K with the gradient stopped (attention gives Q/K projections no gradient)."""

    def binarise(self, q, k):
        return [(sign(q), None)], [(sign(k), None)]

    def kernel_terms(self, q, k):
        return [(q, None)], [(k, None)]  # the kernel packs q >= 0 itself: no +-1 tensors


class BinarySTEAttention(BinarySGAttention):
    """Sign of Q and K with the straight-through estimator; q, k (B, H, N, d) -> one +-1 term each."""

    surrogate_gradient = True

    def binarise(self, q, k):
        return [(sign_ste(q), None)], [(sign_ste(k), None)]


class BinaryHammingAttention(BinaryAttention):
    """Hamming attention with learned query/key weights: ``S = <sgn q, sgn k> w_q w_k / sqrt(d)``.

    Extra args: ``beta`` of the modified tanh (eq. 4, default 0.5); ``weight_hidden``: hidden width of
    the weight MLPs (default 16).
    """

    def __init__(self, *args, beta: float = 0.5, weight_hidden: int = 16, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if beta <= 0:
            raise ValueError(f"beta must be positive, got {beta}")
        self.q_weight = TokenWeight(self.head_dim, weight_hidden, beta)
        self.k_weight = TokenWeight(self.head_dim, weight_hidden, beta)

    def binarise(self, q, k):
        signs_q, signs_k = sign(q), sign(k)
        return [(signs_q, self.q_weight(q, signs_q))], [(signs_k, self.k_weight(k, signs_k))]

    def kernel_terms(self, q, k):
        return [(q, self.q_weight(q))], [(k, self.k_weight(k))]  # weights from one Numba pass each (no gradient)


class BinaryBernoulliAttention(BinaryAttention):
    """Bernoulli-sampled signs with bilinear weights (four binary dot products) in training.

    In eval mode the sample is replaced by its mode ``sgn(sigma(x))`` (then both samples agree, both
    weights are 1/2 and the four products collapse to one), so inference is deterministic.
    Extra args: ``beta`` of the modified tanh (default 0.5); ``eps`` guarding ``d1 + d2 = 0``.
    """

    def __init__(self, *args, beta: float = 0.5, eps: float = 1e-6, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if beta <= 0 or eps <= 0:
            raise ValueError(f"beta and eps must be positive, got beta={beta}, eps={eps}")
        self.beta = beta
        self.eps = eps

    def _terms(self, x0: torch.Tensor) -> list[Term]:
        x = modified_tanh(x0, self.beta)  # (B, H, N, d)
        if not self.training:
            return [(sign(x), None)]
        y1, y2 = bernoulli_sign(x), bernoulli_sign(x)
        d1 = (x - y1).abs().mean(dim=-1)  # (B, H, N)
        d2 = (x - y2).abs().mean(dim=-1)
        total = (d1 + d2).clamp_min(self.eps)
        return [(y1, d2 / total), (y2, d1 / total)]

    def binarise(self, q, k):
        return self._terms(q), self._terms(k)
