"""The part of OpenSlide's slide interface medattn uses, for slide formats read by other libraries.

A subclass sets ``level_dimensions`` ((width, height) per level, level 0 the largest) and ``properties``
(``openslide.mpp-x`` / ``-y`` when the file states them) and implements :meth:`PyramidSlide._level_region`;
this class derives ``dimensions``, ``level_count`` and ``level_downsamples`` and serves ``read_region``,
``get_best_level_for_downsample`` and ``get_thumbnail`` with OpenSlide's conventions (locations in level-0
pixels, RGBA regions transparent outside the image, the best level the one with the largest downsample not
above the one asked for).
"""

from __future__ import annotations

import numpy as np
from PIL import Image


class PyramidSlide:
    """OpenSlide's ``dimensions``, ``level_dimensions``, ``level_downsamples``, ``level_count``, ``properties``,
    ``read_region``, ``get_best_level_for_downsample``, ``get_thumbnail`` and ``close`` over
    :meth:`_level_region`."""

    level_dimensions: tuple[tuple[int, int], ...]
    properties: dict[str, str]

    @property
    def dimensions(self) -> tuple[int, int]:
        return self.level_dimensions[0]

    @property
    def level_count(self) -> int:
        return len(self.level_dimensions)

    @property
    def level_downsamples(self) -> tuple[float, ...]:
        return tuple(self.dimensions[0] / width for width, _ in self.level_dimensions)

    def _level_region(self, level: int, x: int, y: int, width: int, height: int) -> np.ndarray:
        """RGB (height, width, 3) uint8 of ``level`` at level pixels (x, y); 255 outside the image."""
        raise NotImplementedError

    def get_best_level_for_downsample(self, downsample: float) -> int:
        """The level with the largest downsample at most ``downsample`` (OpenSlide's rule)."""
        fits = [i for i, d in enumerate(self.level_downsamples) if d <= downsample]
        return max(fits, key=lambda i: self.level_downsamples[i]) if fits else 0

    def read_region(self, location: tuple[int, int], level: int, size: tuple[int, int]) -> Image.Image:
        """RGBA region of ``size`` at ``level`` whose top-left is ``location`` in level-0 pixels (OpenSlide's
        convention); outside the image transparent."""
        scale = self.level_downsamples[level]
        x, y = round(location[0] / scale), round(location[1] / scale)
        rgb = self._level_region(level, x, y, *size)
        inside = np.zeros(rgb.shape[:2], dtype=np.uint8)
        width, height = self.level_dimensions[level]
        inside[max(-y, 0):max(min(height - y, size[1]), 0), max(-x, 0):max(min(width - x, size[0]), 0)] = 255
        return Image.fromarray(np.dstack([rgb, inside]), mode="RGBA")

    def get_thumbnail(self, size: tuple[int, int]) -> Image.Image:
        """The image fitted into ``size``, from the smallest level that serves it."""
        level = self.get_best_level_for_downsample(max(self.dimensions[0] / size[0], self.dimensions[1] / size[1]))
        image = Image.fromarray(self._level_region(level, 0, 0, *self.level_dimensions[level]))
        image.thumbnail(size, Image.Resampling.LANCZOS)
        return image

    def close(self) -> None:
        """Release the file handles (subclasses that hold any)."""


def clip(x: int, y: int, width: int, height: int, level_size: tuple[int, int]) -> tuple[int, int, int, int] | None:
    """The part (x0, y0, x1, y1) of the region at (x, y) of ``width`` x ``height`` inside a level of
    ``level_size``; None when they do not overlap."""
    x0, y0 = max(x, 0), max(y, 0)
    x1, y1 = min(x + width, level_size[0]), min(y + height, level_size[1])
    return None if x1 <= x0 or y1 <= y0 else (x0, y0, x1, y1)
