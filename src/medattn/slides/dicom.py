"""DICOM whole-slide images (VL Whole Slide Microscopy Image Storage) through wsidicom, behind OpenSlide's interface.

A DICOM slide is a folder of instances, one per pyramid level (and label, overview and thumbnail images), as
scanners and PACS export them (``pip install 'medattn[slides]'`` brings wsidicom). :class:`DicomSlide` opens the
folder (given the folder or any ``.dcm`` file in it) with wsidicom, takes its first pyramid's levels in order of
size, and reads regions frame by frame, so a patch never reads a level whole. Microns per pixel come from the
base level's Pixel Spacing (millimetres in the file), as ``openslide.mpp-x`` / ``-y``. Folders of several slides
(different series) are refused by wsidicom's own check, with its reason.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import UserError
from ..extras import require
from .pyramid import PyramidSlide, clip

SUFFIX = ".dcm"


def is_dicom(path: Path) -> bool:
    """A ``.dcm`` file, or a folder holding ``.dcm`` files (one slide's instances)."""
    path = Path(path)
    if path.is_dir():
        return any(child.suffix.lower() == SUFFIX for child in path.iterdir())
    return path.suffix.lower() == SUFFIX


class DicomSlide(PyramidSlide):
    """A DICOM whole-slide image behind OpenSlide's interface (:class:`~medattn.slides.pyramid.PyramidSlide`)."""

    def __init__(self, path: Path) -> None:
        wsidicom = require("wsidicom", "reading DICOM whole-slide images")
        self.path = Path(path)
        folder = self.path if self.path.is_dir() else self.path.parent
        try:
            self._wsi = wsidicom.WsiDicom.open(folder)
            self._levels = sorted(self._wsi.levels.levels, key=lambda level: level.level)
        except Exception as error:  # wsidicom raises its own errors, and pydicom's, for files it cannot use
            raise UserError(f"{path}: not a DICOM whole-slide image wsidicom can read "
                            f"({type(error).__name__}: {error})") from None
        self.level_dimensions = tuple((level.size.width, level.size.height) for level in self._levels)
        mpp = self._levels[0].mpp  # micrometres per pixel (wsidicom converts the file's millimetres)
        self.properties = {} if mpp is None else {"openslide.mpp-x": str(mpp.width), "openslide.mpp-y": str(mpp.height)}

    def _level_region(self, level: int, x: int, y: int, width: int, height: int) -> np.ndarray:
        """RGB (height, width, 3) of ``level`` at level pixels (x, y); 255 outside the image."""
        out = np.full((height, width, 3), 255, dtype=np.uint8)
        inside = clip(x, y, width, height, self.level_dimensions[level])
        if inside is None:
            return out
        x0, y0, x1, y1 = inside
        try:
            region = self._wsi.read_region((x0, y0), self._levels[level].level, (x1 - x0, y1 - y0), as_array=True)
        except Exception as error:  # damaged or missing frames: wsidicom's and the codecs' own errors
            raise UserError(f"cannot read level {level} at ({x0}, {y0}) ({type(error).__name__}: {error})") from None
        out[y0 - y:y1 - y, x0 - x:x1 - x] = region[..., :3] if region.ndim == 3 else region[..., None]
        return out

    def close(self) -> None:
        self._wsi.close()
