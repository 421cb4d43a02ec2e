"""Binarisation functions of BinaryFormer (Heinrich, MIDL 2025, eqs. 1, 3 and 4).

* :func:`sign` is eq. (1): ``sgn(x) = +1 if x >= 0 else -1`` (so ``sgn(0) = +1``, matching the bit
  packing in :mod:`.bits`, where a set bit means ``x >= 0``). It has no gradient.
* :func:`sign_ste` is eq. (1) forward with the straight-through estimator of eq. (3) backward:
  ``d sgn / dx = 1 where |x| <= 1 else 0``.
* :func:`modified_tanh` is eq. (4): ``2 tanh(beta x) / min(beta, 0.75)``, computed through the sigmoid.
* :func:`bernoulli_sign` is the probabilistic sign of §2.2: ``+1`` with probability
  ``rho(x) = clamp((x + 1) / 2, 0, 1)``, else ``-1``. It has no gradient.
"""

from __future__ import annotations

import torch


def sign(x: torch.Tensor) -> torch.Tensor:
    """Eq. (1), no gradient: ``+1`` where ``x >= 0``, ``-1`` elsewhere, in ``x``'s dtype and shape."""
    return (x.detach() >= 0).to(x.dtype).mul_(2).sub_(1)  # one tensor written, not three (2-3x faster than where)


class _SignSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return sign(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad * (x.abs() <= 1).to(grad.dtype)


def sign_ste(x: torch.Tensor) -> torch.Tensor:
    """Eq. (1) forward, eq. (3) straight-through gradient ``1{|x| <= 1}`` backward. Same shape as ``x``."""
    return _SignSTE.apply(x)


def modified_tanh_scale(beta: float) -> float:
    """The factor of eq. (4), ``2 / min(beta, 0.75)``."""
    if beta <= 0:
        raise ValueError(f"beta must be positive, got {beta}")
    return 2.0 / min(beta, 0.75)


def modified_tanh(x: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    """Eq. (4): ``2 tanh(beta x) / min(beta, 0.75)``; with beta = 0.5 the range is (-4, 4)."""
    scale = modified_tanh_scale(beta)
    # tanh(y) = 2 sigmoid(2y) - 1: PyTorch's CPU sigmoid is 2-3x faster than its tanh (2.8 vs 5.9 ms on the
    # (8, 4096, 64) queries of a binary-hamming layer); absolute difference below 1e-6
    return torch.sigmoid(x * (2 * beta)).mul(2 * scale).sub_(scale)


def bernoulli_sign(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Probabilistic sign of §2.2, no gradient: ``+1`` with probability ``clamp((x + 1) / 2, 0, 1)``."""
    x = x.detach()
    p = ((x + 1) / 2).clamp(0, 1)
    u = torch.rand(x.shape, generator=generator, dtype=x.dtype, device=x.device)
    return torch.where(u < p, torch.ones_like(x), -torch.ones_like(x))
