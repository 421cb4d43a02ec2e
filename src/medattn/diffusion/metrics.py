"""Image quality of inpainted or synthesised volumes: PSNR and SSIM (3D).

``psnr = 10 log10(R^2 / mean((x - y)^2))`` with data range ``R`` (1 for volumes normalised to [0, 1]).

``ssim`` is Wang et al. (2004) in 3D: local statistics under a separable Gaussian window (size 11,
sigma 1.5, only positions where the window fits, i.e. "valid"), ``c1 = (0.01 R)^2``, ``c2 = (0.03 R)^2``::

    SSIM = mean over positions of (2 mu_x mu_y + c1)(2 s_xy + c2) / ((mu_x^2 + mu_y^2 + c1)(s_x^2 + s_y^2 + c2))

with ``s`` the window-weighted (biased) variances and covariance, as scikit-image's
``gaussian_weights=True, use_sample_covariance=False``. MONAI's ``SSIMMetric`` multiplies the
variances by ``w^3 / (w^3 - 1)`` (``sample_covariance=True`` here reproduces it). MONAI is only a
development dependency, hence this small implementation; the tests compare it with MONAI and with a
brute-force loop over windows.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def psnr(x: torch.Tensor, y: torch.Tensor, data_range: float = 1.0) -> float:
    """Peak signal-to-noise ratio in dB of two same-shaped tensors; ``inf`` when they are equal."""
    mse = float((x.double() - y.double()).pow(2).mean())
    return math.inf if mse == 0 else 10 * math.log10(data_range ** 2 / mse)


def gaussian_window(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    """Normalised 1D Gaussian weights (size,)."""
    coords = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    weights = torch.exp(-coords.pow(2) / (2 * sigma ** 2))
    return weights / weights.sum()


def _filter(volume: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """Separable valid filtering of (1, 1, H, W, D) along its three axes."""
    size = len(window)
    for axis in range(3):
        shape = [1, 1, 1, 1, 1]
        shape[2 + axis] = size
        volume = F.conv3d(volume, window.reshape(shape))
    return volume


def ssim(x: torch.Tensor, y: torch.Tensor, data_range: float = 1.0, win_size: int = 11, sigma: float = 1.5,
         sample_covariance: bool = False) -> float:
    """Mean 3D SSIM of two volumes (H, W, D) (extra leading singleton axes allowed); see the module docstring."""
    x, y = x.double().squeeze(), y.double().squeeze()
    if x.shape != y.shape or x.ndim != 3:
        raise ValueError(f"ssim needs two volumes (H, W, D) of one shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    if min(x.shape) < win_size:
        raise ValueError(f"ssim: volume {tuple(x.shape)} is smaller than the window ({win_size})")
    window = gaussian_window(win_size, sigma).to(x.device)
    x, y = x[None, None], y[None, None]
    mu_x, mu_y = _filter(x, window), _filter(y, window)
    var_x = _filter(x * x, window) - mu_x ** 2
    var_y = _filter(y * y, window) - mu_y ** 2
    cov = _filter(x * y, window) - mu_x * mu_y
    if sample_covariance:
        n = win_size ** 3
        var_x, var_y, cov = (v * n / (n - 1) for v in (var_x, var_y, cov))
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    value = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x ** 2 + mu_y ** 2 + c1) * (var_x + var_y + c2))
    return float(value.mean())
