"""Macenko stain normalisation (Macenko et al., ISBI 2009), fitted per slide, applied per patch.

Fit, on a slide's tissue pixels (RGB I): optical density OD = -ln((I + 1) / Io); drop pixels with any
OD < ``beta`` (nearly transparent); the plane of the two largest eigenvectors of the OD covariance;
each OD vector's angle phi in that plane; the stain vectors are the plane directions at the
``alpha``-th and (100 - ``alpha``)-th percentiles of phi, haematoxylin the one with the larger red OD;
concentrations C solve OD = S C (least squares); their 99th percentiles are the maximal concentrations.
Apply: C = lstsq(S, OD), scaled by REFERENCE_MAX / max, rendered I = Io exp(-S_ref C).
"""

from __future__ import annotations

import numpy as np

from ..errors import UserError

IO = 240.0  # transmitted light intensity
REFERENCE_STAINS = np.array([[0.5626, 0.2159], [0.7201, 0.8012], [0.4062, 0.5581]])  # columns H, E (OD, RGB)
REFERENCE_MAX = np.array([1.9705, 1.0308])  # 99th-percentile H and E concentrations of the reference


def optical_density(rgb: np.ndarray) -> np.ndarray:
    """(..., 3) uint8 -> (..., 3) float64 OD = -ln((I + 1) / Io), clipped at 0."""
    return np.maximum(-np.log((rgb.astype(np.float64) + 1) / IO), 0.0)


def fit_stains(rgb: np.ndarray, alpha: float = 1.0, beta: float = 0.15) -> tuple[np.ndarray, np.ndarray]:
    """(N, 3) uint8 pixels -> (stain matrix (3, 2) columns H, E unit OD vectors, max concentrations (2,))."""
    od = optical_density(rgb.reshape(-1, 3))
    od = od[(od >= beta).all(axis=1)]
    if len(od) < 100:
        raise UserError(f"Macenko: only {len(od)} stained pixels to fit the stains on (need 100)")
    _, vectors = np.linalg.eigh(np.cov(od, rowvar=False))
    plane = vectors[:, [2, 1]]  # (3, 2) the two largest eigenvectors
    plane *= np.where(plane.sum(axis=0) < 0, -1, 1)  # OD vectors are positive: orient the axes alike
    t = od @ plane  # (N, 2)
    phi = np.arctan2(t[:, 1], t[:, 0])
    low, high = np.percentile(phi, [alpha, 100 - alpha])
    v_low = plane @ np.array([np.cos(low), np.sin(low)])
    v_high = plane @ np.array([np.cos(high), np.sin(high)])
    stains = np.stack([v_low, v_high] if v_low[0] > v_high[0] else [v_high, v_low], axis=1)  # H first
    stains /= np.linalg.norm(stains, axis=0, keepdims=True)
    concentrations = np.linalg.lstsq(stains, od.T, rcond=None)[0]  # (2, N)
    return stains, np.percentile(concentrations, 99, axis=1)


class MacenkoNormalizer:
    """``fit(pixels)`` then ``normalizer(patch)``: (H, W, 3) uint8 -> (H, W, 3) uint8 in the reference stains.
    Picklable (plain arrays), so DataLoader workers apply it."""

    def __init__(self, reference: np.ndarray = REFERENCE_STAINS, reference_max: np.ndarray = REFERENCE_MAX) -> None:
        self.reference, self.reference_max = np.asarray(reference), np.asarray(reference_max)
        self.stains: np.ndarray | None = None
        self.max: np.ndarray | None = None

    def fit(self, pixels: np.ndarray) -> MacenkoNormalizer:
        self.stains, self.max = fit_stains(pixels)
        return self

    def __call__(self, patch: np.ndarray) -> np.ndarray:
        if self.stains is None:
            raise RuntimeError("MacenkoNormalizer.fit must be called first")
        od = optical_density(patch.reshape(-1, 3))
        concentrations = np.linalg.lstsq(self.stains, od.T, rcond=None)[0]  # (2, N)
        concentrations *= (self.reference_max / np.maximum(self.max, 1e-6))[:, None]
        rgb = IO * np.exp(-self.reference @ concentrations)  # (3, N)
        return np.clip(rgb.T, 0, 255).reshape(patch.shape).astype(np.uint8)
