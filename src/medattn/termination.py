"""SIGTERM ends a command as Ctrl-C does.

A batch scheduler stops a job with SIGTERM (Slurm at its time limit or on preemption, then SIGKILL some 30 s later;
Kubernetes and systemd alike). Python's default for SIGTERM ends the process at once: no ``finally`` runs, so a run
folder's lock, an overwrite's backup or the recipe search's temporary folder stay behind and nothing says how to go
on. While :func:`sigterm_as_interrupt` holds, SIGTERM raises :class:`Terminated` (a ``KeyboardInterrupt``) in the
main thread instead, so every path that cleans up after Ctrl-C runs and the command line prints its one line (what
was kept, the command that resumes) and exits with 143 (128 + SIGTERM). Outside the main thread, where no handler can
be installed, nothing changes; the previous handler is back when the block ends, so a second SIGTERM during the
clean-up ends the process as before.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while :func:`sigterm_as_interrupt` held."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block SIGTERM raises :class:`Terminated` in the main thread; the previous handler after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
