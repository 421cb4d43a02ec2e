"""Input files before they are read: only regular files (or folders where a kind takes them), and which
paths hold the same content.

A named pipe, socket or device given as an input would make a reader block or read without end, so
it is refused before anything opens it.

Same content (:func:`content_keys`): two paths are the same file when they resolve to one real path
(symbolic links followed) or when their bytes are equal. Equality is found in three steps, each only
among the files left equal by the step before: the size (one ``stat``), a BLAKE2b hash of the first
and last 64 KiB, and the hash of the whole file. Files of a size no other file has are never opened,
and only files with the same size, head and tail are read in full (true duplicates and, for example,
uncompressed volumes of one grid whose first and last slices are background), so the cost is one
``stat`` per file in the common case while equality is decided on every byte. Folders (DICOM series)
are compared by their real path only.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

EDGE = 64 * 1024  # bytes hashed at each end of a file before the whole file is


def check_regular(path: Path, folders: bool = False) -> None:
    """Raise FileNotFoundError when ``path`` is missing, ValueError unless it is a regular file (or, with
    ``folders``, a directory). Symbolic links are followed."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"file {'or folder ' if folders else ''}not found") from None
    if stat.S_ISREG(mode) or (folders and stat.S_ISDIR(mode)):
        return
    kind = ("a directory" if stat.S_ISDIR(mode) else "a named pipe" if stat.S_ISFIFO(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISBLK(mode) or stat.S_ISCHR(mode) else
            "a special file")
    raise ValueError(f"{kind}, not a regular file{' or a folder' if folders else ''}")


def _digest(path: str, edges_only: bool) -> bytes:
    """BLAKE2b of the first and last ``EDGE`` bytes, or of the whole file."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        if edges_only:
            h.update(f.read(EDGE))
            f.seek(max(0, os.fstat(f.fileno()).st_size - EDGE))
            h.update(f.read(EDGE))
        else:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.digest()


def _refine(groups: Iterable[list[str]], key) -> list[list[str]]:
    """Split each group of paths by ``key(path)``; keep the parts holding more than one path."""
    parts: list[list[str]] = []
    for group in groups:
        by_key: dict = {}
        for path in group:
            by_key.setdefault(key(path), []).append(path)
        parts += [p for p in by_key.values() if len(p) > 1]
    return parts


def content_keys(paths: Iterable[Path]) -> dict[Path, str]:
    """path -> a key shared exactly by the paths holding the same file (the first real path of the
    group, see the module docstring). Paths that do not exist key to their own text."""
    real = {p: os.path.realpath(p) for p in paths}
    sizes: dict[int, list[str]] = {}
    for path in sorted(set(real.values())):
        if os.path.isfile(path):
            sizes.setdefault(os.path.getsize(path), []).append(path)
    groups = [g for g in sizes.values() if len(g) > 1]
    groups = _refine(groups, lambda p: _digest(p, edges_only=True))
    groups = [g for g in groups if os.path.getsize(g[0]) <= 2 * EDGE] + _refine(
        [g for g in groups if os.path.getsize(g[0]) > 2 * EDGE], lambda p: _digest(p, edges_only=False))
    same = {path: group[0] for group in groups for path in group}
    return {p: same.get(r, r) for p, r in real.items()}
