"""Errors that the command line reports as one line, without a traceback, and the one place where
failures of the machine (disk full, read-only or missing folders) become such errors."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


class UserError(ValueError):
    """A problem with the user's input (file, row, option) that the user can fix.

    A subclass of ``ValueError``, so library callers that catch ``ValueError`` keep working; the
    command line prints only this type as one line and lets every other exception show its traceback.
    """


@contextlib.contextmanager
def writing(path: str | Path):
    """Turn an ``OSError`` raised while writing ``path`` (disk full, read-only, a file where a folder
    belongs) into a one-line :class:`UserError` naming the path and the reason."""
    try:
        yield
    except OSError as error:
        reason = os.strerror(error.errno) if error.errno else str(error)
        where = error.filename if error.filename and str(error.filename) != str(path) else None
        raise UserError(f"cannot write {path}: {reason}" + (f" ({where})" if where else "")) from None
