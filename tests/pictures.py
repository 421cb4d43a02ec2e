"""What a test can read off a rendered figure: a colour bar, the slide's glass."""

from __future__ import annotations

import matplotlib
import numpy as np
from PIL import Image


def colour_bar_span(path, cmap: str) -> float:
    """The largest share of ``cmap``'s 256 colours found exactly (within 3 levels) in one pixel column of the
    PNG at ``path``: about 1 where a colour bar of that map is drawn, small for a map's patches alone."""
    pixels = np.asarray(Image.open(path).convert("RGB")).astype(np.int16)
    table = (matplotlib.colormaps[cmap](np.linspace(0, 1, 256))[:, :3] * 255).round().astype(np.int16)
    best = 0.0
    for x in range(pixels.shape[1]):
        column = np.unique(pixels[:, x], axis=0)
        distance = np.abs(column[:, None, :] - table[None]).max(axis=2)  # (colours, 256)
        best = max(best, float((distance.min(axis=0) <= 3).mean()))
    return best


def glass_fraction(path) -> float:
    """Share of pixels that look like a slide's bare glass (light grey 225-250, nearly colourless): a map drawn
    on a white canvas has none, one drawn on a slide's thumbnail shows the glass around the tissue."""
    pixels = np.asarray(Image.open(path).convert("RGB")).astype(np.int16)
    low, high = pixels.min(axis=2), pixels.max(axis=2)
    return float(((low >= 225) & (high <= 250) & (high - low < 12)).mean())
