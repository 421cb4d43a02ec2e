"""Per-tile scores drawn over the slide thumbnail (attention, attribution or class scores per patch)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from ..errors import UserError
from .reader import open_slide, reading, thumbnail


def draw_heatmap(thumb: np.ndarray, downsample: tuple[float, float], coords: np.ndarray, scores: np.ndarray,
                 size0: int, alpha: float = 0.5, cmap: str = "inferno", vmin: float | None = None,
                 vmax: float | None = None) -> Image.Image:
    """Blend a colour per tile over the thumbnail.

    thumb: (h, w, 3) uint8; downsample: level-0 px per thumbnail px along (x, y); coords: (N, 2) level-0
    top-left (x, y) of square tiles of ``size0`` level-0 px; scores: (N,) aligned with coords, mapped
    linearly from [vmin, vmax] (default: their min and max) to ``cmap``. Pixels no tile covers keep the
    thumbnail's colour; where tiles overlap the later one wins. -> RGB image of the thumbnail's size."""
    import matplotlib

    coords, scores = np.asarray(coords), np.asarray(scores, dtype=np.float64).ravel()
    if coords.ndim != 2 or coords.shape[1] != 2 or len(scores) != len(coords):
        raise UserError(f"heatmap: scores ({len(scores)}) must align with coords (N, 2), got {coords.shape}")
    if not np.isfinite(scores).all():
        raise UserError("heatmap: scores hold NaN or Inf")
    low = scores.min(initial=0.0) if vmin is None else vmin
    high = scores.max(initial=1.0) if vmax is None else vmax
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


def slide_heatmap(slide_path: Path, coords: np.ndarray, scores: np.ndarray, size0: int, out_png: Path,
                  thumbnail_px: int = 2048, **options) -> Path:
    """:func:`draw_heatmap` on the slide's own thumbnail, written to ``out_png``; ``options`` go to it."""
    with reading(slide_path):
        thumb, downsample = thumbnail(open_slide(slide_path), thumbnail_px)
    draw_heatmap(thumb, downsample, coords, scores, size0, **options).save(out_png, format="PNG")
    return Path(out_png)
