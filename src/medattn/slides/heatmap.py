"""Per-tile scores drawn over the slide thumbnail (attention, attribution or class scores per patch)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from ..errors import UserError
from ..outputs import OutputFolder
from ..vocabulary import task_types
from . import figures
from .reader import open_slide, reading, slide_mpp, thumbnail
from .tissue import window_fractions


def draw_heatmap(thumb: np.ndarray, downsample: tuple[float, float], coords: np.ndarray, scores: np.ndarray,
                 size0: int, alpha: float = 0.5, cmap: str = "inferno", vmin: float | None = None,
                 vmax: float | None = None, percentile: bool = False, outline: bool = True) -> Image.Image:
    """Blend a colour per tile over the thumbnail.

    thumb: (h, w, 3) uint8; downsample: level-0 px per thumbnail px along (x, y); coords: (N, 2) level-0
    top-left (x, y) of square tiles of ``size0`` level-0 px; scores: (N,) aligned with coords, mapped
    linearly from [vmin, vmax] (default: their min and max) to ``cmap``; ``percentile`` first replaces each
    score by its rank among the slide's scores in (0, 1] (as CLAM draws attention), so a few large scores
    do not leave the rest at one colour. Pixels no tile covers keep the thumbnail's colour; where tiles
    overlap the later one wins. ``outline``: each tile outlined in grey (:data:`~medattn.slides.figures.TILE_OUTLINE`)
    inside itself, a twentieth of its side and at least 1 px wide, so a tile whose score is near zero still reads as a
    scored tile, not as tissue that was not tiled; tiles under
    :data:`~medattn.slides.figures.MIN_OUTLINED_PX` px on the thumbnail get none (it would hide their colour).
    -> RGB image of the thumbnail's size."""
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
    image = Image.fromarray(np.clip(out, 0, 255).round().astype(np.uint8))
    side = figures.side_px(size0, downsample)
    if outline and len(coords) and side >= figures.MIN_OUTLINED_PX:
        figures.draw_outlines(image, figures.tile_boxes(coords, size0, downsample), figures.TILE_OUTLINE,
                              figures.outline_width(side, minimum=1))
    return image


def overlay_legend(image: Image.Image, tiles: int, microns_per_px: float | None) -> Image.Image:
    """``image`` (a score map over a thumbnail, tiles outlined by :func:`draw_heatmap`) above a band with the tile
    outline's meaning and a scale bar (``microns_per_px``: µm per picture px; None: "no scale: mpp unknown").
    For a map drawn elsewhere (e.g. on a blank canvas at the tiles' coordinates) that knows its scale."""
    return figures.with_legend(image, [(figures.TILE_OUTLINE, f"{tiles} scored tiles (outlined)")], microns_per_px,
                               line_width=3)


def slide_overlay(slide_path: Path, coords: np.ndarray, scores: np.ndarray, size0: int, thumbnail_px: int = 2048,
                  mpp: float | None = None, legend: bool = True, **options) -> Image.Image:
    """:func:`draw_heatmap` on the slide's own thumbnail (longest side ``thumbnail_px``), tiles outlined, above a
    band with a scale bar (:func:`overlay_legend`): from ``mpp`` (µm per level-0 px) when given, else the slide's
    own; a slide that states none says "no scale: mpp unknown". ``legend`` False: the thumbnail alone.
    ``options`` go to :func:`draw_heatmap`."""
    with reading(slide_path):
        slide = open_slide(slide_path)
        thumb, downsample = thumbnail(slide, thumbnail_px)
    picture = draw_heatmap(thumb, downsample, coords, scores, size0, **options)
    if not legend:
        return picture
    if mpp is None:
        try:
            mpp = slide_mpp(slide, Path(slide_path))
        except UserError:  # no scale stated: said in the picture, not an error (the bag's coords are enough)
            mpp = None
    return overlay_legend(picture, len(np.asarray(coords).reshape(-1, 2)), None if mpp is None else
                          mpp * max(downsample))


def slide_heatmap(slide_path: Path, coords: np.ndarray, scores: np.ndarray, size0: int, folder: OutputFolder,
                  name: str, thumbnail_px: int = 2048, **options) -> Path:
    """:func:`slide_overlay` written as the PNG ``name`` in ``folder`` (its policy decides whether ``name`` may be
    written) -> its path."""
    return folder.save_image(name, slide_overlay(slide_path, coords, scores, size0, thumbnail_px, **options),
                             format="PNG")


def prediction_text(probabilities, names: list[str], task_type: str = "binary") -> str:
    """The slide's prediction for a map's title: ``slide P(tumour) = 0.87`` (binary; multi-label: each output);
    multiclass: the predicted class and its probability, ``slide: LUSC (p = 0.91)``; survival: the risk, not a
    probability, ``slide risk = -0.02 (log relative risk, higher = earlier event)``; regression: each target in the
    table's units, ``slide predicted psa = 12.3``. ``probabilities``: the slide's (K,) outputs (probabilities, the
    risk or the predicted values), in the order of ``names``."""
    return task_types.of(task_type).summary(probabilities, names)


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
