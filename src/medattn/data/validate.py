"""Every file of every split decoded once before compute is spent on it, and not again while it is unchanged.

A table's files are checked cheaply when the data are built (headers, sizes; with ``skip_bad`` decoded too);
damage past what a header shows (a PNG whose data stream breaks, a NIfTI cut short inside its data) would
otherwise surface in the test split after hours of training. :func:`decode_all` reads every sample of every
split that loads from files (:class:`~medattn.data.tables.RecordDataset`) once, with a progress bar on a
terminal, and stops at the first that fails with the one-line error naming its file and table row. Generated
data (the synthetic kinds) come from memory and are not read again.

A sample that decoded is remembered in a cache (``checked_files.json`` in ``$MEDATTN_CACHE_DIR``, default
``$XDG_CACHE_HOME/medattn`` or ``~/.cache/medattn``), keyed by each file's path, size and modification time and
by the loader's settings, so a repeated run on unchanged files does not pay again; a changed file is read anew.
The cache holds only those keys (no image data); an unreadable cache is ignored.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tqdm import tqdm

from ..errors import UserError
from ..outputs import OutputFolder
from ..text import bars_off
from .base import DataBundle
from .tables import RecordDataset


def cache_path() -> Path:
    """Where decoded-file keys are remembered (see the module docstring)."""
    base = os.environ.get("MEDATTN_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "medattn"
    return Path(base).expanduser() / "checked_files.json"


def _load_cache() -> set[str]:
    try:
        return set(json.loads(cache_path().read_text()))
    except (OSError, ValueError, TypeError):
        return set()


def _save_cache(keys: set[str]) -> None:
    try:
        cache = cache_path()
        OutputFolder.within(cache.parent).save_json(cache.name, sorted(keys), indent=None)  # the cache's own folder
    except (OSError, UserError):
        pass  # a cache that cannot be written costs time on the next run, nothing else


def sample_key(dataset: RecordDataset, index: int) -> str | None:
    """The cache key of sample ``index``: its files' paths, sizes and modification times and the loader's settings
    (None when a file cannot be stat-ed: it is decoded, and fails there with its own message)."""
    load = dataset.load
    settings = {k: repr(v) for k, v in sorted(vars(load).items()) if k != "augment"} if hasattr(load, "__dict__") \
        else {}
    try:
        files = [(str(Path(p).resolve()), os.stat(p).st_size, os.stat(p).st_mtime_ns)
                 for p in dataset.records[index].paths]
    except OSError:
        return None
    return json.dumps([type(load).__name__, settings, files])


def file_backed(bundle: DataBundle) -> list[tuple[str, RecordDataset]]:
    """(split name, dataset) for the splits whose samples are read from files."""
    return [(name, getattr(bundle, name)) for name in ("train", "val", "test")
            if isinstance(getattr(bundle, name), RecordDataset)]


def decode_all(bundle: DataBundle, progress: bool = True) -> int:
    """Load every sample of every file-backed split not decoded before (see the module docstring); -> samples
    read. A bad file raises its one-line :class:`~medattn.errors.UserError` (``--skip-bad`` leaves such out)."""
    splits = file_backed(bundle)
    if not splits:
        return 0
    known = _load_cache()
    todo = [(dataset, index, sample_key(dataset, index)) for _, dataset in splits for index in range(len(dataset))]
    todo = [item for item in todo if item[2] is None or item[2] not in known]
    try:
        bar = tqdm(todo, desc="checking files", leave=False, disable=bars_off(progress and bool(todo)))
        for dataset, index, key in bar:
            dataset[index]  # decodes: a bad file raises its one-line error naming file and row
            if key is not None:
                known.add(key)
    finally:
        if todo:
            _save_cache(known)
    return len(todo)
