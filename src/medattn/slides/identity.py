"""A slide's identity: which scanner file a bag was extracted from, beyond its name.

``medattn wsi extract`` records in each bag the HDF5 attribute :data:`IDENTITY_ATTR`, JSON of :func:`identity`: the
slide's level-0 ``width`` and ``height`` in pixels, its ``bytes`` on disk and ``digest``, the SHA-256 of its first and
last MiB (a DICOM slide, a folder of instances: of each instance's name, size and first 64 KiB). Two cohorts whose
slides share file names are told apart by it: ``medattn explain --slides`` (and report.html's case pictures) draw a
bag's tiles only on the slide it records (:func:`mismatch`); a bag written before the attribute existed is matched by
name only, and the outputs say so.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

#: The bag's HDF5 attribute holding the JSON of :func:`identity`.
IDENTITY_ATTR = "slide_identity"
#: Bytes hashed at each end of a slide file (the TIFF header and the directories BigTIFF writers put last).
END_BYTES = 1 << 20
#: Bytes hashed at the start of each instance of a DICOM slide.
INSTANCE_BYTES = 64 << 10


def _digest(path: Path) -> tuple[int, str]:
    """(bytes, SHA-256 hex) of a slide file's first and last :data:`END_BYTES`, or of a DICOM folder's instances."""
    sha = hashlib.sha256()
    if path.is_dir():
        total = 0
        for item in sorted(p for p in path.iterdir() if p.is_file()):
            size = item.stat().st_size
            total += size
            with open(item, "rb") as f:
                sha.update(f"{item.name}:{size}:".encode() + f.read(INSTANCE_BYTES))
        return total, sha.hexdigest()
    size = path.stat().st_size
    with open(path, "rb") as f:
        sha.update(f.read(END_BYTES))
        if size > END_BYTES:
            f.seek(max(END_BYTES, size - END_BYTES))
            sha.update(f.read(END_BYTES))
    return size, sha.hexdigest()


def identity(path: Path, slide) -> dict:
    """The identity of the slide file ``path`` opened as ``slide`` (module docstring)."""
    width, height = slide.dimensions
    size, digest = _digest(Path(path))
    return {"width": int(width), "height": int(height), "bytes": int(size), "digest": digest}


def recorded(attrs: dict) -> dict | None:
    """The identity a bag's HDF5 attributes record, None when they record none (or it does not parse)."""
    text = attrs.get(IDENTITY_ATTR)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    try:
        found = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return found if isinstance(found, dict) and {"width", "height", "bytes", "digest"} <= set(found) else None


def mismatch(path: Path, expected: dict) -> str:
    """"" when the slide at ``path`` is the one ``expected`` (a bag's :func:`recorded` identity) describes, else
    how it differs, in words."""
    from ..errors import UserError
    from .reader import open_slide

    size, digest = _digest(Path(path))
    try:
        width, height = open_slide(path).dimensions
    except UserError as error:
        return f"it does not open as a slide ({error})"
    if (width, height) != (expected["width"], expected["height"]):
        return (f"it is {width} x {height} px, the bag's slide {expected['width']} x {expected['height']} px: "
                f"another slide of the same name")
    if size != expected["bytes"] or digest != expected["digest"]:
        return (f"its file ({size} bytes, digest {digest[:12]}) is not the bag's slide ({expected['bytes']} bytes, "
                f"digest {str(expected['digest'])[:12]}): another slide of the same name")
    return ""
