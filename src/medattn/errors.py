"""Errors that the command line reports as one line, without a traceback, and the one place where
failures of the machine (disk full, read-only or missing folders, memory) become such errors.

The error boundary of the command line (:func:`medattn.cli.main`) prints a :class:`UserError` as one
``medattn: error:`` line with exit status 2, and so does :func:`machine_problem` for what the machine can cause
anywhere (a full or read-only disk, a permission, memory running out); Ctrl-C is one line with status 130.
Every other exception is a bug and keeps its traceback, so that it gets reported."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path


class UserError(ValueError):
    """A problem with the user's input (file, row, option) that the user can fix.

    A subclass of ``ValueError``, so library callers that catch ``ValueError`` keep working; the
    command line prints only this type as one line and lets every other exception show its traceback.
    """


#: OS errors a user's machine causes (not medattn): disk full, over quota or past a file-size limit, read-only, no
#: permission, a file name too long, too many open files.
MACHINE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM,
                  errno.ENAMETOOLONG, errno.EMFILE}


def machine_problem(error: BaseException) -> str | None:
    """One line for an error the machine caused (see :data:`MACHINE_ERRNOS`, ``MemoryError``), else None."""
    if isinstance(error, MemoryError):
        return ("out of memory; use smaller inputs or batches (train.batch_size, --batch-size, --chunk-size), fewer "
                "workers, or a machine with more memory")
    if isinstance(error, OSError) and error.errno in MACHINE_ERRNOS:
        where = f"{error.filename}: " if error.filename else ""
        return f"{where}{os.strerror(error.errno)}"
    return None


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
