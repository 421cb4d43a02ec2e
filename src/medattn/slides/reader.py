"""Open whole-slide images; microns per pixel; which pyramid level serves a patch size.

OpenSlide (``openslide-python`` with the ``openslide-bin`` wheel, ``pip install medattn[slides]``) reads
SVS, NDPI, MRXS, SCN, BIF, Philips/Ventana TIFF and generic tiled TIFF; OME-TIFF (``.ome.tif``) is read
with tifffile (:mod:`medattn.slides.ome`) and DICOM whole-slide images (a folder of ``.dcm`` instances) with
wsidicom (:mod:`medattn.slides.dicom`); :data:`OTHER_READERS` lists which. Microns per pixel come
from ``openslide.mpp-x`` / ``openslide.mpp-y``, else from the TIFF resolution tags (``tiff.XResolution``
with ``tiff.ResolutionUnit`` centimeter or inch); an explicit ``mpp`` overrides both.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from ..errors import UserError
from ..extras import require
from .dicom import DicomSlide, is_dicom
from .ome import OmeTiffSlide, is_ome_tiff

SLIDE_SUFFIXES = (".svs", ".tif", ".tiff", ".ndpi", ".vms", ".vmu", ".scn", ".mrxs", ".svslide", ".bif", ".czi")
#: Formats not read with OpenSlide: (whether a path is one, the class that opens it with OpenSlide's interface).
OTHER_READERS = ((is_ome_tiff, OmeTiffSlide), (is_dicom, DicomSlide))
MICRONS_PER_UNIT = {"centimeter": 1e4, "inch": 25.4e3}
MAX_ANISOTROPY = 0.02  # mpp-x and mpp-y may differ by this fraction; beyond it square patches are not square


def _openslide():
    return require("openslide", "reading slides")  # the module, or its C library from openslide-bin


def open_slide(path: Path):
    """-> ``openslide.OpenSlide``, or the class of :data:`OTHER_READERS` for its format (the same interface);
    UserError naming ``path`` when it is missing, not a slide file (or DICOM folder) or not a slide."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: file not found")
    for is_format, reader in OTHER_READERS:
        if is_format(path):
            return reader(path)
    if not path.is_file():
        raise UserError(f"{path}: not a file (nor a folder of DICOM instances)")
    openslide = _openslide()
    try:
        return openslide.OpenSlide(str(path))
    except (openslide.OpenSlideError, OSError) as error:  # unsupported format is a subclass of OpenSlideError
        reason = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        raise UserError(f"{path}: not a slide OpenSlide can read ({reason})") from None


@contextlib.contextmanager
def reading(path: Path):
    """Turn an OpenSlide error raised while reading ``path`` (a corrupt or truncated tile) into a one-line
    :class:`UserError` naming the file; a UserError raised inside (a level too large to read) gets the name too."""
    openslide = _openslide()
    try:
        yield
    except openslide.OpenSlideError as error:
        raise UserError(f"{path}: cannot read the slide ({str(error).strip().splitlines()[-1]})") from None
    except UserError as error:
        raise UserError(f"{path}: {error}") from None


def _tiff_mpp(properties, axis: str) -> float | None:
    unit = properties.get("tiff.ResolutionUnit", "").lower()
    value = properties.get(f"tiff.{axis.upper()}Resolution")
    if unit not in MICRONS_PER_UNIT or value is None or float(value) <= 0:
        return None
    return MICRONS_PER_UNIT[unit] / float(value)


def slide_mpp(slide, path: Path, override: float | None = None) -> float:
    """Microns per level-0 pixel: ``override`` if given, else from the slide's properties (mean of x and y).

    UserError naming ``path`` when the slide states none (give ``--mpp``), a non-positive value, or x and
    y differing by more than ``MAX_ANISOTROPY``."""
    if override is not None:
        if not (math.isfinite(override) and override > 0):
            raise UserError(f"--mpp must be a positive number of microns per pixel, got {override}")
        return float(override)
    props = slide.properties
    pair = []
    for axis in ("x", "y"):
        value = props.get(f"openslide.mpp-{axis}")
        pair.append(float(value) if value not in (None, "") else _tiff_mpp(props, axis))
    if None in pair or not all(math.isfinite(v) and v > 0 for v in pair):
        raise UserError(f"{path}: the slide states no microns per pixel (openslide.mpp-x/y or TIFF resolution); "
                        f"give it with --mpp")
    if abs(pair[0] - pair[1]) > MAX_ANISOTROPY * max(pair):
        raise UserError(f"{path}: pixels are not square (mpp-x {pair[0]}, mpp-y {pair[1]}); give --mpp to accept")
    return (pair[0] + pair[1]) / 2


def _slides_in(folder: Path) -> list[Path]:
    """The slides of a folder: itself when it holds only DICOM instances (one DICOM slide), else its files
    with a slide suffix and its sub-folders of DICOM instances (not deeper)."""
    children = sorted(folder.iterdir())
    files = [p for p in children if p.is_file() and p.suffix.lower() in SLIDE_SUFFIXES]
    if is_dicom(folder):
        if files:
            raise UserError(f"{folder}: DICOM instances (.dcm) beside other slides ({files[0].name}); put each DICOM "
                            f"slide's instances in a folder of their own")
        return [folder]
    return files + [p for p in children if p.is_dir() and is_dicom(p)]


def list_slides(inputs: list[Path]) -> list[Path]:
    """Slides from files and folders (a folder: :func:`_slides_in`; a ``.dcm`` file: the DICOM slide of its folder),
    sorted, without repeats. UserError for a missing input or when nothing is found."""
    found: list[Path] = []
    for item in map(Path, inputs):
        if item.is_dir():
            found += _slides_in(item)
        elif item.exists():
            found.append(item.parent if is_dicom(item) else item)
        else:
            raise UserError(f"{item}: file or folder not found")
    unique = list(dict.fromkeys(found))
    if not unique:
        raise UserError(f"no slide files ({', '.join(SLIDE_SUFFIXES)}, or folders of DICOM .dcm instances) in "
                        f"{', '.join(map(str, inputs))}")
    stems = {}
    for path in unique:
        if stems.setdefault(path.stem, path) != path:
            raise UserError(f"two slides share the name {path.stem!r} ({stems[path.stem]}, {path}); outputs are "
                            f"named by it")
    return unique


def best_level(downsamples, wanted: float, tolerance: float = 1e-3) -> int:
    """The pyramid level with the largest downsample <= ``wanted`` (within a relative ``tolerance``, as
    scanners store 4.0002 for 4), so patches are read at or above the resolution they are resized to."""
    ok = [i for i, d in enumerate(downsamples) if d <= wanted * (1 + tolerance)]
    return max(ok, key=lambda i: downsamples[i]) if ok else 0


@dataclass(frozen=True)
class PatchGeometry:
    """How one patch is read: ``size0`` level-0 pixels square at ``level`` (``read_size`` pixels there),
    resized to ``patch_px``."""

    size0: int
    level: int
    read_size: int
    patch_px: int


def patch_geometry(slide, mpp: float, patch_um: float, patch_px: int) -> PatchGeometry:
    """Square patches of ``patch_um`` microns: size0 = round(patch_um / mpp) level-0 px."""
    size0 = round(patch_um / mpp)
    if size0 < 1:
        raise UserError(f"--patch-um {patch_um} is smaller than one pixel at {mpp} microns per pixel")
    width, height = slide.dimensions
    if size0 > min(width, height):
        raise UserError(f"a patch of {patch_um} microns ({size0} px) is larger than the slide ({width} x {height} px)")
    level = best_level(slide.level_downsamples, size0 / patch_px)
    read_size = max(1, round(size0 / slide.level_downsamples[level]))
    return PatchGeometry(size0, level, read_size, patch_px)


def read_patch(slide, x: int, y: int, geometry: PatchGeometry) -> np.ndarray:
    """The patch with level-0 top-left (x, y) -> (patch_px, patch_px, 3) uint8 RGB; transparent areas white."""
    region = slide.read_region((int(x), int(y)), geometry.level, (geometry.read_size, geometry.read_size))
    rgb = Image.new("RGB", region.size, (255, 255, 255))
    rgb.paste(region, mask=region.getchannel("A"))
    if rgb.size != (geometry.patch_px, geometry.patch_px):
        rgb = rgb.resize((geometry.patch_px, geometry.patch_px), Image.Resampling.LANCZOS)
    return np.array(rgb)  # writable, so torch.from_numpy can share it


def memory_bytes() -> int:
    """Physical memory of this machine in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def thumbnail(slide, max_px: int) -> tuple[np.ndarray, tuple[float, float]]:
    """-> (RGB thumbnail (h, w, 3) uint8 whose longer side is at most ``max_px``, level-0 px per thumbnail
    px along (x, y)). OpenSlide reads the whole level nearest the thumbnail's scale first: a header declaring
    a level larger than half this machine's memory is refused (UserError) before anything is allocated."""
    width, height = slide.dimensions
    level = slide.get_best_level_for_downsample(max(width, height) / max_px)
    level_width, level_height = slide.level_dimensions[level]
    need = 4 * level_width * level_height  # RGBA as OpenSlide reads it
    if need > memory_bytes() // 2:
        raise UserError(f"the slide declares {width} x {height} px, and its smallest level {level_width} x "
                        f"{level_height} px would take {need / 2**30:.1f} GiB to read for a thumbnail, more than half "
                        f"this machine's memory ({memory_bytes() / 2**30:.1f} GiB); it holds no pyramid, or its "
                        f"header is wrong")
    image = slide.get_thumbnail((max_px, max_px)).convert("RGB")
    return np.asarray(image), (width / image.width, height / image.height)
