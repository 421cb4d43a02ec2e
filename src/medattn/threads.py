"""How many intra-op threads to use, so that a run does not oversubscribe a shared CPU.

Two torch threads on a 2-core machine where another process kept one core busy made a training step
5x slower than one thread (docs/performance.md). The default therefore counts the cores this process
may run on (``os.sched_getaffinity``), shares them among the processes torchrun starts on this machine
(``LOCAL_WORLD_SIZE``), and leaves out the cores that other processes keep busy, read from the
1-minute load average (rounded; at least one thread stays). The choice is made once per process, at
its first use, before this process's own work enters the load average, and a note says when it
left cores out. An explicit count (``train.threads``, ``--threads``) always wins, then ``OMP_NUM_THREADS``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable


def available_cores() -> int:
    """Cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def user_threads() -> int | None:
    """The user's thread setting: a positive ``OMP_NUM_THREADS`` in the environment, else None."""
    user = os.environ.get("OMP_NUM_THREADS", "")
    return int(user) if user.isdigit() and int(user) > 0 else None


@functools.cache
def default_threads() -> tuple[int, str | None]:
    """(threads, a note when busy cores were left out, else None); decided once per process. A positive
    ``OMP_NUM_THREADS`` in the environment is the user's setting and wins over the automatic count."""
    user = user_threads()
    if user is not None:
        return user, None
    cores = max(1, available_cores() // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average on this platform
        load = 0.0
    busy = min(cores - 1, int(load + 0.5))
    threads = cores - busy
    if busy == 0:
        return threads, None
    return threads, (f"load average {load:.1f} on {cores} core(s) available: using {threads} thread(s) so "
                     f"as not to oversubscribe (set the thread count explicitly to override)")


def set_threads(requested: int | None = None, log: Callable[[str], None] = print) -> int:
    """Set torch's intra-op threads and Numba's (the bit kernel's) to ``requested``, else to
    :func:`default_threads`; returns the count.

    Numba goes first: its first ``set_num_threads`` (or first parallel kernel) starts its threading layer,
    and its OpenMP layer, sharing the process's OpenMP runtime with torch, then sets torch's count to
    ``NUMBA_NUM_THREADS`` (every core by default) once torch has used that runtime. Set after torch's, it
    overrode the count in the first run of a process only: ``train.threads=1`` trained on 2 threads there,
    and its float sums differed from a resumed (or any later) run's in the last bits."""
    import numba
    import torch

    threads, note = (requested, None) if requested else default_threads()
    if note:
        log(note)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    torch.set_num_threads(threads)
    return threads
