"""What makes a slide picture readable: tile outlines that survive downscaling, a legend, a scale bar.

Shared by the tiling grid (:func:`medattn.slides.tiling.draw_grid`) and the score overlays
(:func:`medattn.slides.heatmap.draw_heatmap`, :func:`medattn.slides.heatmap.slide_overlay`). A tile of ``size0``
level-0 px covers the thumbnail pixels ``round(x / d) .. round((x + size0) / d) - 1`` (``d`` level-0 px per
thumbnail px): neighbouring tiles never share a pixel, so an outline drawn inside its own tile is never painted
over by its neighbour's. The legend and the scale bar go in a white band below the thumbnail, never over tissue.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw, ImageFont

#: Colour of the outline of a scored tile (a neutral grey, in no colour map's range of the overlays).
TILE_OUTLINE = (110, 110, 110)
#: Tiles smaller than this on the thumbnail get no outline in an overlay (it would hide their colour).
MIN_OUTLINED_PX = 6
NO_SCALE = "no scale: mpp unknown"


@lru_cache(maxsize=8)
def font(size: int):
    """A TrueType font of ``size`` px with the micro sign: matplotlib's DejaVu Sans, else Pillow's own."""
    try:
        from matplotlib import font_manager

        return ImageFont.truetype(font_manager.findfont("DejaVu Sans", fallback_to_default=True), size)
    except (ImportError, OSError, ValueError):  # pragma: no cover - matplotlib ships DejaVu Sans
        return ImageFont.load_default(size=size)


def tile_boxes(coords: np.ndarray, size0: float, downsample: tuple[float, float]) -> np.ndarray:
    """(N, 4) int64 thumbnail boxes (x0, y0, x1, y1), corners inclusive, of square tiles of ``size0`` level-0 px at
    level-0 top-left ``coords`` (N, 2) (module docstring: neighbours never overlap)."""
    coords = np.asarray(coords, dtype=np.float64).reshape(-1, 2)
    dx, dy = downsample
    return np.stack([np.round(coords[:, 0] / dx), np.round(coords[:, 1] / dy),
                     np.round((coords[:, 0] + size0) / dx) - 1, np.round((coords[:, 1] + size0) / dy) - 1],
                    axis=1).astype(np.int64)


def side_px(size0: float, downsample: tuple[float, float]) -> float:
    """A tile's side on the thumbnail, in thumbnail px (the shorter of x and y)."""
    return size0 / max(downsample)


def outline_width(side: float, minimum: int = 2) -> int:
    """Outline width for a tile ``side`` thumbnail px wide: a twentieth of it, at least ``minimum`` px (a 2,048-px
    thumbnail is shown at about half its size: a 1-px line blends with its neighbours' and its colour is lost)."""
    return max(minimum, int(round(side / 20)))


def draw_outlines(image: Image.Image, boxes: np.ndarray, colours, width: int) -> None:
    """Outline each box (:func:`tile_boxes`) inside itself, ``width`` px wide, in its colour (one RGB for all or
    one per box)."""
    draw = ImageDraw.Draw(image)
    single = len(colours) == 3 and not hasattr(colours[0], "__len__")
    for i, (x0, y0, x1, y1) in enumerate(np.asarray(boxes).tolist()):
        if x1 < x0 or y1 < y0:
            continue
        draw.rectangle((x0, y0, x1, y1), outline=tuple(colours if single else colours[i]),
                       width=min(width, 1 + (min(x1 - x0, y1 - y0)) // 2))


def nice_length(limit: float) -> float:
    """The largest 1, 2 or 5 x 10^k not above ``limit`` (> 0)."""
    power = 10.0 ** math.floor(math.log10(limit))
    return max(step * power for step in (1, 2, 5) if step * power <= limit * (1 + 1e-9))


def length_text(microns: float) -> str:
    """``500 µm``, ``2 mm``."""
    return f"{microns / 1000:g} mm" if microns >= 1000 else f"{microns:g} µm"


def scale_bar(width_px: int, microns_per_px: float | None) -> tuple[int, str]:
    """(bar length in px, its label) for a picture ``width_px`` wide at ``microns_per_px`` (µm per picture px): a
    1-2-5 length of at most a fifth of the width; (0, :data:`NO_SCALE`) when the scale is unknown."""
    if microns_per_px is None or not math.isfinite(microns_per_px) or microns_per_px <= 0:
        return 0, NO_SCALE
    microns = nice_length(max(width_px, 5) / 5 * microns_per_px)
    return max(1, int(round(microns / microns_per_px))), length_text(microns)


def with_legend(image: Image.Image, entries: list[tuple[tuple[int, int, int] | None, str]],
                microns_per_px: float | None, line_width: int = 2) -> Image.Image:
    """``image`` above a white band holding the legend and the scale bar.

    ``entries``: (outline colour or None for text alone, text), drawn left to right as a swatch (a square
    outlined as the tiles are, ``line_width`` px) and its text, wrapping to the next line where the width ends;
    then the scale bar of :func:`scale_bar` (or its "no scale" text). Text size follows the picture's width (a
    2,048-px thumbnail: about 30 px). -> a new RGB image, as wide as ``image``."""
    width = image.width
    size = max(11, min(40, int(round(width / 68))))
    face = font(size)
    pad, gap = max(4, size // 2), max(6, size)
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    items = []  # (kind, colour, text, width in px)
    for colour, text in entries:
        items.append(("swatch" if colour is not None else "text", colour, text,
                      (size + pad if colour is not None else 0) + int(measure.textlength(text, font=face))))
    bar, label = scale_bar(width, microns_per_px)
    items.append(("bar", None, label, (bar + pad if bar else 0) + int(measure.textlength(label, font=face))))
    rows, row, used = [], [], pad
    for item in items:
        if row and used + item[3] > width - pad:
            rows.append(row)
            row, used = [], pad
        row.append(item)
        used += item[3] + gap
    rows.append(row)
    line = int(size * 1.5)
    band = Image.new("RGB", (width, pad * 2 + line * len(rows)), "white")
    draw = ImageDraw.Draw(band)
    for r, row in enumerate(rows):
        x, y = pad, pad + r * line
        middle = y + line // 2
        for kind, colour, text, extent in row:
            if kind == "swatch":
                draw.rectangle((x, middle - size // 2, x + size - 1, middle + size // 2 - 1), outline=tuple(colour),
                               width=max(2, min(line_width, size // 3)))
                draw.text((x + size + pad, middle), text, font=face, fill="black", anchor="lm")
            elif kind == "bar" and bar:
                thick = max(3, size // 4)
                draw.rectangle((x, middle - thick // 2, x + bar - 1, middle - thick // 2 + thick - 1), fill="black")
                draw.text((x + bar + pad, middle), text, font=face, fill="black", anchor="lm")
            else:
                draw.text((x, middle), text, font=face, fill="black", anchor="lm")
            x += extent + gap
    out = Image.new("RGB", (width, image.height + band.height), "white")
    out.paste(image.convert("RGB"), (0, 0))
    out.paste(band, (0, image.height))
    return out
