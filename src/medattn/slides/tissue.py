"""Where the tissue is, and which patches are worth keeping.

Tissue mask (on a thumbnail): saturation S = (max - min) / max of RGB (glass, dust and pen-free
background are grey or white, so S is low; eosin and haematoxylin are saturated), median-filtered,
thresholded at max(Otsu(S), ``min_saturation``); holes filled (``scipy.ndimage.binary_fill_holes``);
connected pieces smaller than ``min_area`` thumbnail pixels removed. The floor on the threshold keeps
an empty slide empty: Otsu always splits, even pure background noise.

Patch quality (on the resized patch): the white fraction, pixels whose R, G and B are all >=
``white_level``; and sharpness, the variance of the Laplacian of the grey image (0-255 scale). Blurry
(out-of-focus) patches have little high-frequency energy, so a low variance.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage


def saturation(rgb: np.ndarray) -> np.ndarray:
    """(..., 3) uint8 RGB -> (...) float32 HSV saturation in [0, 1] (0 where the pixel is black)."""
    rgb = rgb.astype(np.float32)
    high, low = rgb.max(axis=-1), rgb.min(axis=-1)
    return np.where(high > 0, (high - low) / np.maximum(high, 1e-6), 0.0).astype(np.float32)


def otsu_threshold(values: np.ndarray, bins: int = 256) -> float:
    """Otsu's threshold of ``values`` in [0, 1]: the t maximising the between-class variance
    w0(t) w1(t) (mu0(t) - mu1(t))^2 over a ``bins``-bin histogram; values > t form the upper class."""
    counts, edges = np.histogram(np.clip(values, 0, 1), bins=bins, range=(0.0, 1.0))
    centres = (edges[:-1] + edges[1:]) / 2
    w0 = np.cumsum(counts)[:-1].astype(np.float64)
    w1 = w0[-1] + counts[-1] - w0
    m0 = np.cumsum(counts * centres)[:-1]
    total = (counts * centres).sum()
    with np.errstate(invalid="ignore", divide="ignore"):
        between = w0 * w1 * (m0 / w0 - (total - m0) / w1) ** 2
    if not np.isfinite(between).any():
        return float(centres[0])
    return float(edges[1:-1][np.nanargmax(between)])


def tissue_mask(rgb: np.ndarray, min_area: float, min_saturation: float = 0.08, median: int = 7) -> np.ndarray:
    """(h, w, 3) uint8 thumbnail -> (h, w) bool tissue mask (module docstring); ``min_area`` in thumbnail px."""
    sat = ndimage.median_filter(saturation(rgb), size=median) if median > 1 else saturation(rgb)
    mask = ndimage.binary_fill_holes(sat > max(otsu_threshold(sat), min_saturation))
    labels, count = ndimage.label(mask)
    if count == 0:
        return mask
    areas = np.bincount(labels.ravel())
    keep = areas >= min_area
    keep[0] = False
    return keep[labels]


def white_fraction(patch: np.ndarray, white_level: int = 220) -> float:
    """(H, W, 3) uint8 -> fraction of pixels with R, G and B all >= ``white_level``."""
    return float((patch >= white_level).all(axis=-1).mean())


def sharpness(patch: np.ndarray) -> float:
    """(H, W, 3) uint8 -> the largest variance of the Laplacian among the R, G and B channels (0-255).

    Texture in colour only (eosin-red beside haematoxylin-blue of one brightness) is flat in the grey image, so the
    grey image's Laplacian called such tissue blurry. The Laplacian is linear and grey a weighted mean of the
    channels, so the grey image's value never exceeds this one: a threshold keeps at least the patches it kept."""
    channels = patch.astype(np.float32).transpose(2, 0, 1)
    return float(max(ndimage.laplace(channel).var() for channel in channels))


def window_fractions(mask: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Fraction of True in ``mask`` (h, w) under each box (M, 4) = (x0, y0, x1, y1) in mask pixels
    (half-open, clipped to the mask; a box of no pixels counts as 0), by a summed-area table."""
    table = np.zeros((mask.shape[0] + 1, mask.shape[1] + 1), dtype=np.int64)
    table[1:, 1:] = mask.astype(np.int64).cumsum(0).cumsum(1)
    x0, x1 = (np.clip(boxes[:, i], 0, mask.shape[1]) for i in (0, 2))
    y0, y1 = (np.clip(boxes[:, i], 0, mask.shape[0]) for i in (1, 3))
    sums = table[y1, x1] - table[y0, x1] - table[y1, x0] + table[y0, x0]
    area = (x1 - x0) * (y1 - y0)
    return np.where(area > 0, sums / np.maximum(area, 1), 0.0)
