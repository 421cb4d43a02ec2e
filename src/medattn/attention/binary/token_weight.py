"""Per-token weights of binary-hamming (Heinrich, MIDL 2025, §2.1): ``w = softplus(theta(sigma(x) || sgn(x)))``.

``theta`` is a small MLP shared by the heads; its input, the features ``[sigma(x) || sgn(x)]`` (eq. 4's modified
tanh beside eq. 1's sign), is built two ways:

* in PyTorch (:func:`~.sign.modified_tanh`, :func:`~.sign.sign`, ``cat``) whenever a gradient must reach x, the
  forward is traced, or ``x`` is not float32 on the CPU;
* otherwise by one Numba pass (:func:`token_features`) over ``x`` where it lies, in memory order. At N = 4,096,
  8 heads of 64 the PyTorch form took 9-10 ms per operand (sign, sigmoid, scale, cat: four passes), the kernel
  1.7-2 ms. Its modified tanh is ``scale (1 - e) / (1 + e)`` with ``e = 2^(-2 beta |x| log2 e)`` from the bit
  kernel's float-only ``exp2`` (relative error below 3e-7): within 1.2e-6 of ``scale tanh(beta x)`` (tested).

The MLP's modules (``fc1``, ``act``, ``fc2``) are called as modules on both paths, so hooks and quantisation
(``torch.ao.quantization.quantize_dynamic``) act on them either way.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit, prange
from torch import nn

from ..base import is_traced
from .bits import _LOG2E, _exp2
from .packing import storage_rows
from .sign import modified_tanh, modified_tanh_scale, sign

_ONE = np.float32(1.0)


@njit(parallel=True, fastmath=True, cache=True)
def _feature_kernel(flat, starts, c, beta_log2e, scale, out):  # pragma: no cover - compiled
    """Row ``r`` = ``flat[starts[r] : starts[r] + c]`` -> ``out[r] = [scale tanh(beta x) || sgn(x)]`` (2c floats).

    ``tanh(beta |x|) = (1 - e) / (1 + e)`` with ``e = 2^(-2 beta |x| log2 e)`` in (0, 1], the sign put back by a
    select: branch-free, so the loop vectorises. ``beta_log2e`` is ``2 beta log2 e``."""
    for r in prange(starts.size):
        row = flat[starts[r] : starts[r] + c]
        o = out[r]
        for j in range(c):
            v = row[j]
            e = _exp2(-abs(v) * beta_log2e)
            t = scale * (_ONE - e) / (_ONE + e)
            o[j] = t if v >= 0 else -t
            o[c + j] = _ONE if v >= 0 else -_ONE


def token_features(x: torch.Tensor, beta: float) -> tuple[torch.Tensor, list[int]]:
    """The features ``[modified_tanh(x, beta) || sign(x)]`` of a float32 CPU tensor by one Numba pass.

    x (..., d), any strides -> ``(features, order)``: features (..., 2d) contiguous, with x's leading axes
    permuted by ``order`` (the order x lies in memory, see :func:`~.packing.storage_rows`); no gradient.
    """
    rows, flat, starts, order = storage_rows(x.detach())
    d = x.shape[-1]
    features = torch.empty(*rows.shape[:-1], 2 * d)
    _feature_kernel(flat, starts, d, np.float32(2 * beta * float(_LOG2E)), np.float32(modified_tanh_scale(beta)),
                    features.view(-1, 2 * d).numpy())
    return features, order


class TokenWeight(nn.Module):
    """Per-token scalar ``w = softplus(theta(sigma(x) || sgn(x)))``: (..., d) -> (...,), positive.

    theta is Linear(2d, hidden) -> GELU -> Linear(hidden, 1) with default initialisation except the last
    layer: weight scaled by 0.1 and bias ``log(e - 1)``, so the weights start near 1 (near binary-sg)
    while gradients still flow from the first step.
    """

    def __init__(self, head_dim: int, hidden: int, beta: float) -> None:
        super().__init__()
        if hidden <= 0:
            raise ValueError(f"weight_hidden must be positive, got {hidden}")
        self.beta = beta
        self.fc1 = nn.Linear(2 * head_dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, 1)
        nn.init.constant_(self.fc2.bias, math.log(math.e - 1))
        with torch.no_grad():
            self.fc2.weight.mul_(0.1)

    def forward(self, x: torch.Tensor, signs: torch.Tensor | None = None) -> torch.Tensor:
        """x (..., d) and, when already computed, ``sign(x)`` -> (...,)."""
        if self._fused_features(x):
            features, order = token_features(x, self.beta)  # leading axes in memory order
            return self._theta(features).permute(*np.argsort(order).tolist())
        signs = sign(x) if signs is None else signs
        return self._theta(torch.cat([modified_tanh(x, self.beta), signs], dim=-1))

    def _theta(self, features: torch.Tensor) -> torch.Tensor:
        """(..., 2d) -> (...,): ``softplus(fc2(act(fc1(features))))``."""
        return nn.functional.softplus(self.fc2(self.act(self.fc1(features)))).squeeze(-1)

    def _fused_features(self, x: torch.Tensor) -> bool:
        """Whether :func:`token_features` builds the features: float32 on the CPU, no gradient into x, not traced."""
        grad = torch.is_grad_enabled() and x.requires_grad  # theta's own gradient needs none through the features
        return x.device.type == "cpu" and x.dtype == torch.float32 and not grad and not is_traced()
