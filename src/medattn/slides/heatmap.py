"""Per-tile scores drawn over the slide thumbnail (attention, attribution or class scores per patch)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from ..errors import UserError
from ..runtime.outputs import save_image
from .reader import open_slide, reading, thumbnail
from .tissue import window_fractions


def draw_heatmap(thumb: np.ndarray, downsample: tuple[float, float], coords: np.ndarray, scores: np.ndarray,
                 size0: int, alpha: float = 0.5, cmap: str = "inferno", vmin: float | None = None,
                 vmax: float | None = None, percentile: bool = False) -> Image.Image:
    """Blend a colour per tile over the thumbnail.

    thumb: (h, w, 3) uint8; downsample: level-0 px per thumbnail px along (x, y); coords: (N, 2) level-0
    top-left (x, y) of square tiles of ``size0`` level-0 px; scores: (N,) aligned with coords, mapped
    linearly from [vmin, vmax] (default: their min and max) to ``cmap``; ``percentile`` first replaces each
    score by its rank among the slide's scores in (0, 1] (as CLAM draws attention), so a few large scores
    do not leave the rest at one colour. Pixels no tile covers keep the thumbnail's colour; where tiles
    overlap the later one wins. -> RGB image of the thumbnail's size."""
    import matplotlib
    import scipy.stats

    coords, scores = np.asarray(coords), np.asarray(scores, dtype=np.float64).ravel()
    if coords.ndim != 2 or coords.shape[1] != 2 or len(scores) != len(coords):
        raise UserError(f"heatmap: scores ({len(scores)}) must align with coords (N, 2), got {coords.shape}")
    if not np.isfinite(scores).all():
        raise UserError("heatmap: scores hold NaN or Inf")
    if percentile and len(scores):
        scores = scipy.stats.rankdata(scores, method="average") / len(scores)
    low = (scores.min() if len(scores) else 0.0) if vmin is None else vmin
    high = (scores.max() if len(scores) else 1.0) if vmax is None else vmax
    values = np.clip((scores - low) / (high - low), 0, 1) if high > low else np.full(len(scores), 0.5)
    colours = matplotlib.colormaps[cmap](values)[:, :3] * 255  # (N, 3)
    layer = thumb.astype(np.float32).copy()
    covered = np.zeros(thumb.shape[:2], dtype=bool)
    h, w = thumb.shape[:2]
    for (x, y), colour in zip(coords, colours):
        x0, y0 = int(np.floor(x / downsample[0])), int(np.floor(y / downsample[1]))
        x1, y1 = int(np.ceil((x + size0) / downsample[0])), int(np.ceil((y + size0) / downsample[1]))
        layer[max(y0, 0):min(y1, h), max(x0, 0):min(x1, w)] = colour
        covered[max(y0, 0):min(y1, h), max(x0, 0):min(x1, w)] = True
    out = np.where(covered[..., None], (1 - alpha) * thumb + alpha * layer, thumb)
    return Image.fromarray(np.clip(out, 0, 255).round().astype(np.uint8))


def slide_overlay(slide_path: Path, coords: np.ndarray, scores: np.ndarray, size0: int, thumbnail_px: int = 2048,
                  **options) -> Image.Image:
    """:func:`draw_heatmap` on the slide's own thumbnail (longest side ``thumbnail_px``); ``options`` go to it."""
    with reading(slide_path):
        thumb, downsample = thumbnail(open_slide(slide_path), thumbnail_px)
    return draw_heatmap(thumb, downsample, coords, scores, size0, **options)


def slide_heatmap(slide_path: Path, coords: np.ndarray, scores: np.ndarray, size0: int, out_png: Path,
                  thumbnail_px: int = 2048, **options) -> Path:
    """:func:`slide_overlay` written to ``out_png``."""
    return save_image(out_png, slide_overlay(slide_path, coords, scores, size0, thumbnail_px, **options), format="PNG")


def tile_overlap(mask: np.ndarray, coords: np.ndarray, size0: int) -> np.ndarray:
    """Fraction t_k of each square tile (level-0 top-left ``coords`` (N, 2) (x, y), side ``size0``) that
    lies in a level-0 ``mask`` (H, W) bool, e.g. a ground-truth region. -> (N,) in [0, 1]."""
    coords = np.asarray(coords, dtype=np.int64).reshape(-1, 2)
    return window_fractions(mask, np.concatenate([coords, coords + size0], axis=1))


def heatmap_mass(scores: np.ndarray, overlap: np.ndarray) -> float:
    """Share of the heatmap's mass on a region: sum_k s_k t_k / sum_k s_k for scores s_k >= 0 and tile
    overlaps t_k (:func:`tile_overlap`). Uniform scores give mean_k t_k, the chance level."""
    scores, overlap = np.asarray(scores, dtype=np.float64).ravel(), np.asarray(overlap, dtype=np.float64).ravel()
    if len(scores) != len(overlap) or not np.isfinite(scores).all() or (scores < 0).any() or scores.sum() <= 0:
        raise UserError(f"heatmap mass: need {len(overlap)} finite scores >= 0 with a positive sum, "
                        f"got {len(scores)}")
    return float((scores * overlap).sum() / scores.sum())
