"""OME-TIFF whole-slide images (``.ome.tif``, ``.ome.tiff``) through tifffile, behind the part of OpenSlide's
interface medattn uses.

OpenSlide reads no OME-TIFF: its pyramid lies in SubIFDs, which OpenSlide's generic TIFF reader does not follow,
so it would see one full-resolution level. :class:`OmeTiffSlide` reads the first image series of the file and its
pyramid levels with tifffile (``pip install 'medattn[slides]'``): RGB brightfield images (axes ``YXS``, 8 bits),
tiled or in strips. Regions are decoded tile by tile, so a patch never reads a level whole; a thumbnail reads the
smallest level that serves it. Microns per pixel come from the OME-XML ``Pixels`` element (``PhysicalSizeX`` and
``PhysicalSizeY`` with their units; micrometres when the unit is not stated), as ``openslide.mpp-x`` / ``-y``; the
Image's Description as ``ome.Description``. :func:`write_ome_tiff` writes a pyramid as an OME-TIFF (``medattn wsi
synthetic --format ome-tiff``).
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from pathlib import Path

import numpy as np

from ..errors import UserError
from ..extras import require
from .pyramid import PyramidSlide, clip

SUFFIXES = (".ome.tif", ".ome.tiff")
#: OME length units -> micrometres.
MICRONS = {"µm": 1.0, "um": 1.0, "nm": 1e-3, "mm": 1e3, "cm": 1e4, "m": 1e6}


def is_ome_tiff(path: Path) -> bool:
    return Path(path).name.lower().endswith(SUFFIXES)


def _description(ome_xml: str | None) -> dict[str, str]:
    """``ome.Description``: the first Description in the OME-XML (a SYNTHETIC slide's mark), where it has one."""
    try:
        root = ElementTree.fromstring(ome_xml or "")
    except ElementTree.ParseError:
        return {}
    text = next((element.text for element in root.iter() if element.tag.endswith("}Description")
                 or element.tag == "Description"), None)
    return {"ome.Description": text} if text else {}


def _mpp(ome_xml: str | None) -> dict[str, str]:
    """``openslide.mpp-x`` / ``-y`` from the OME-XML's first ``Pixels`` element (none when it states no size)."""
    if not ome_xml:
        return {}
    try:
        root = ElementTree.fromstring(ome_xml)
    except ElementTree.ParseError:
        return {}
    pixels = next((element for element in root.iter() if element.tag.endswith("Pixels")), None)
    found = {}
    for axis in ("X", "Y"):
        size = None if pixels is None else pixels.get(f"PhysicalSize{axis}")
        unit = MICRONS.get(pixels.get(f"PhysicalSize{axis}Unit", "µm") if pixels is not None else "µm")
        if size is not None and unit is not None:
            found[f"openslide.mpp-{axis.lower()}"] = str(float(size) * unit)
    return found


class OmeTiffSlide(PyramidSlide):
    """An OME-TIFF slide behind OpenSlide's interface (:class:`~medattn.slides.pyramid.PyramidSlide`)."""

    def __init__(self, path: Path) -> None:
        tifffile = require("tifffile", "reading OME-TIFF slides")
        self.path = Path(path)
        try:
            self._file = tifffile.TiffFile(self.path)
            series = self._file.series[0]
        except Exception as error:  # tifffile raises TiffFileError, ValueError and others for damaged files
            raise UserError(f"{path}: not a TIFF tifffile can read ({type(error).__name__}: {error})") from None
        if series.axes != "YXS" or series.shape[-1] != 3 or series.dtype != np.uint8:
            raise UserError(f"{path}: an OME-TIFF of axes {series.axes}, shape {series.shape}, {series.dtype}; "
                            f"slides are 8-bit RGB images (axes YXS)")
        self._pages = [level.keyframe for level in series.levels]
        self.level_dimensions = tuple((page.imagewidth, page.imagelength) for page in self._pages)
        self.properties = {**_mpp(self._file.ome_metadata), **_description(self._file.ome_metadata)}
        self._whole: dict[int, np.ndarray] = {}  # levels stored in strips, read once

    def _level_region(self, level: int, x: int, y: int, width: int, height: int) -> np.ndarray:
        """RGB (height, width, 3) of ``level`` at level pixels (x, y); 255 outside the image."""
        page = self._pages[level]
        out = np.full((height, width, 3), 255, dtype=np.uint8)
        inside = clip(x, y, width, height, self.level_dimensions[level])
        if inside is None:
            return out
        x0, y0, x1, y1 = inside
        if not page.is_tiled:
            if level not in self._whole:
                self._whole[level] = page.asarray()
            out[y0 - y:y1 - y, x0 - x:x1 - x] = self._whole[level][y0:y1, x0:x1]
            return out
        across = -(-page.imagewidth // page.tilewidth)
        handle = self._file.filehandle
        for row in range(y0 // page.tilelength, (y1 - 1) // page.tilelength + 1):
            for column in range(x0 // page.tilewidth, (x1 - 1) // page.tilewidth + 1):
                index = row * across + column
                handle.seek(page.dataoffsets[index])
                try:
                    tile, _, _ = page.decode(handle.read(page.databytecounts[index]), index,
                                             jpegtables=page.jpegtables)
                    tile = tile.reshape(page.tilelength, page.tilewidth, 3)
                except Exception as error:  # codecs raise their own types for damaged tiles
                    raise UserError(f"cannot decode tile {index} of level {level} ({type(error).__name__})") from None
                tx, ty = column * page.tilewidth, row * page.tilelength
                sx0, sy0 = max(x0, tx), max(y0, ty)
                sx1, sy1 = min(x1, tx + page.tilewidth), min(y1, ty + page.tilelength)
                out[sy0 - y:sy1 - y, sx0 - x:sx1 - x] = tile[sy0 - ty:sy1 - ty, sx0 - tx:sx1 - tx]
        return out

    def close(self) -> None:
        self._file.close()


def write_ome_tiff(out, name: str, levels: list[np.ndarray], mpp: float | None, description: str = "",
                   tile: int = 256) -> Path:
    """A pyramid (``levels``: (H, W, 3) uint8, the base first, at ``mpp`` um per pixel) as the OME-TIFF ``name`` in
    the :class:`~medattn.outputs.OutputFolder` ``out`` (atomically): the base level, its smaller levels in
    SubIFDs, tiled, deflate; ``PhysicalSizeX``/``Y`` in micrometres and ``description`` as the Image's Description in
    the OME-XML. -> the file."""
    tifffile = require("tifffile", "writing OME-TIFF slides")
    metadata = {"axes": "YXS", "Description": description}
    if mpp:
        metadata.update(PhysicalSizeX=mpp, PhysicalSizeY=mpp, PhysicalSizeXUnit="µm", PhysicalSizeYUnit="µm")
    options = {"tile": (tile, tile), "photometric": "rgb", "compression": "zlib", "compressionargs": {"level": 1}}
    with out.write(name) as tmp, tifffile.TiffWriter(tmp, bigtiff=True, ome=True) as tif:
        tif.write(levels[0], subifds=len(levels) - 1, metadata=metadata, **options)
        for level in levels[1:]:
            tif.write(level, subfiletype=1, metadata=None, **options)
    return out.folder / name
