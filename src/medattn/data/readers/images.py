"""Reading a 2D image file: PNG, JPEG, TIFF (Pillow) and DICOM (pydicom).

Reading an image gives a float tensor (C, H, W) in [0, 1]:

* 8-bit images are divided by 255; 16-bit, integer and float images (TIFF, DICOM) are min-max scaled
  per image.
* DICOM: pixel values are mapped through RescaleSlope/RescaleIntercept first; MONOCHROME1 images
  (bright = low values) are inverted so that bright is always high. Multi-frame files are rejected
  (wrong dimensionality).
* Palette, gray+alpha, RGBA and CMYK images become gray or RGB; alpha is dropped.

Then (:class:`ImageLoader`) channels are matched to ``in_chans`` (gray repeated to RGB; RGB to gray with ITU-R
601 luma weights), the image is resized to ``image_size`` (bilinear, antialiased), training augmentation is
applied (in [0, 1], so rotated-in corners are black), and finally ``(x - mean) / std`` per channel.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ..files import check_regular
from ..transforms import Augmentation

if TYPE_CHECKING:
    from ...vocabulary.record import Record

DICOM_SUFFIXES = (".dcm", ".dicom", "")
LUMA = torch.tensor([0.299, 0.587, 0.114])


def is_dicom(path: Path) -> bool:
    """DICOM by suffix (.dcm, .dicom, none) or by the "DICM" marker after the 128-byte preamble."""
    if path.suffix.lower() in DICOM_SUFFIXES:
        return True
    with path.open("rb") as f:
        return f.read(132)[128:] == b"DICM"


def _unit_range(array) -> torch.Tensor:
    """uint8 -> /255; anything else -> min-max scaled to [0, 1] (a constant image becomes 0)."""
    import numpy as np

    if array.dtype == np.uint8:
        return torch.from_numpy(array.astype(np.float32) / 255.0)
    x = torch.from_numpy(np.asarray(array, dtype=np.float32))
    if not torch.isfinite(x).all():
        raise ValueError("the image holds NaN or Inf values")
    low, high = x.min(), x.max()
    return (x - low) / (high - low) if high > low else torch.zeros_like(x)


def _read_dicom(path: Path) -> torch.Tensor:
    import numpy as np
    import pydicom

    ds = pydicom.dcmread(path)
    if int(getattr(ds, "NumberOfFrames", 1) or 1) > 1:
        raise ValueError(f"a 2D image is expected, the DICOM file has {ds.NumberOfFrames} frames")
    pixels = ds.pixel_array
    if pixels.ndim == 2:
        slope, intercept = float(getattr(ds, "RescaleSlope", 1) or 1), float(getattr(ds, "RescaleIntercept", 0) or 0)
        pixels = pixels.astype(np.float64) * slope + intercept
    image = _unit_range(pixels)
    if str(getattr(ds, "PhotometricInterpretation", "")).upper() == "MONOCHROME1":
        image = 1.0 - image
    return image


def _read_pillow(path: Path) -> torch.Tensor:
    import numpy as np
    from PIL import Image

    with Image.open(path) as img:
        img.load()
        if img.mode in ("P", "PA", "RGBA", "CMYK", "YCbCr", "LAB", "HSV"):
            img = img.convert("RGB")
        elif img.mode in ("1", "LA"):
            img = img.convert("L")
        array = np.array(img)
    return _unit_range(array)


def read_image(path: Path) -> torch.Tensor:
    """-> (C, H, W) float in [0, 1], C = 1 (gray) or 3 (RGB); ValueError for other shapes."""
    check_regular(path)
    image = _read_dicom(path) if is_dicom(path) else _read_pillow(path)
    if image.ndim == 2:
        image = image[None]
    elif image.ndim == 3 and image.shape[-1] in (1, 3):
        image = image.permute(2, 0, 1)
    else:
        raise ValueError(f"expected a 2D gray or RGB image, got an array of shape {tuple(image.shape)}")
    return image


def _check_dicom_header(path: Path) -> None:
    """Header without pixels; uncompressed pixel data must fit in what follows the header in the file."""
    import pydicom

    with path.open("rb") as f:
        ds = pydicom.dcmread(f, stop_before_pixels=True)
        after_header = path.stat().st_size - f.tell()
    if "Rows" not in ds or "Columns" not in ds:
        raise ValueError("the DICOM file has no image (no Rows/Columns)")
    syntax = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
    if syntax is None or syntax.is_compressed:
        return  # encapsulated pixel data: its length is only known by reading it
    frames = int(getattr(ds, "NumberOfFrames", 1) or 1)
    expected = (int(ds.Rows) * int(ds.Columns) * int(getattr(ds, "SamplesPerPixel", 1) or 1) * frames
                * int(getattr(ds, "BitsAllocated", 8) or 8) + 7) // 8
    if after_header < expected:
        raise ValueError(f"the DICOM file is truncated: the header declares {expected} bytes of pixel data, "
                         f"{after_header} bytes follow it")


def _check_pillow_complete(path: Path) -> None:
    """Open (header only) and look for truncation where that is cheap: PNG chunk CRCs (``verify``, no
    decoding), TIFF strips/tiles inside the file, a JPEG end marker in the last 4 KiB (a JPEG without
    one is decoded once to decide, since data may follow the marker). Pillow's errors (OSError when
    cut short, SyntaxError for a bad PNG CRC) become ValueError."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            fmt = img.format
            if fmt == "TIFF":
                size = path.stat().st_size
                for offsets, counts in ((273, 279), (324, 325)):  # Strip/TileOffsets, Strip/TileByteCounts
                    ends = [o + c for o, c in zip(img.tag_v2.get(offsets, ()), img.tag_v2.get(counts, ()))]
                    if ends and max(ends) > size:
                        raise OSError(f"its data end at byte {max(ends)}, the file has {size}")
            elif fmt == "PNG":
                img.verify()
        if fmt == "JPEG":
            with path.open("rb") as f:
                f.seek(max(0, path.stat().st_size - 4096))
                if b"\xff\xd9" not in f.read():
                    with Image.open(path) as img:
                        img.load()
    except (OSError, SyntaxError) as exc:
        raise ValueError(f"image file is truncated or corrupt ({exc})") from None


def check_image_header(path: Path) -> None:
    """Cheap check at build time: a regular file whose header reads, and that is not truncated where
    that shows without decoding (uncompressed DICOM, PNG, TIFF, JPEG; see the two helpers above)."""
    check_regular(path)
    if is_dicom(path):
        _check_dicom_header(path)
    else:
        _check_pillow_complete(path)


def match_channels(image: torch.Tensor, in_chans: int) -> torch.Tensor:
    """(C, H, W) with C in {1, 3} -> (in_chans, H, W): gray repeated to RGB, RGB to luma."""
    if image.shape[0] == in_chans:
        return image
    if in_chans == 3:
        return image.expand(3, -1, -1).contiguous()
    return (image * LUMA[:, None, None]).sum(0, keepdim=True)


class ImageLoader:
    """record -> {"input": (in_chans, H, W)}: read, channels, resize, augment, normalise."""

    def __init__(self, size: tuple[int, int], in_chans: int, mean: list[float], std: list[float],
                 augment: Augmentation | None = None) -> None:
        self.size, self.in_chans, self.augment = size, in_chans, augment
        self.mean = torch.tensor(mean, dtype=torch.float32)[:, None, None]
        self.std = torch.tensor(std, dtype=torch.float32)[:, None, None]

    def __call__(self, record: Record) -> dict:
        image = match_channels(read_image(record.paths[0]), self.in_chans)
        if tuple(image.shape[1:]) != self.size:
            image = F.interpolate(image[None], size=self.size, mode="bilinear", antialias=True,
                                  align_corners=False)[0].clamp(0, 1)
        if self.augment is not None:
            image = self.augment(image)
        return {"input": (image - self.mean) / self.std}
