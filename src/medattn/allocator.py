"""glibc malloc settings for large CPU tensors: freed memory kept for reuse, backed by huge pages.

glibc serves every block of 32 MiB and more with a fresh ``mmap`` and returns it to the kernel when it
is freed, so each large tensor a training step allocates is page-faulted in (and zeroed by the kernel)
again at every step. At 2048 px (N = 16,385 tokens) that was 2.9 million page faults and 17 s of system
time in a 40 s step, 12 GB zeroed per step (docs/performance-training.md, "Freed memory kept for reuse"). Huge
pages (``glibc.malloc.hugetlb=1``) cut the number of faults, not the zeroing, and did not shorten that step.

The mode ``reuse`` takes every block from the heap (``mmap_max = 0``) and keeps freed heap memory in the
process (a trim threshold of 1 TiB), so later steps reuse pages already mapped: the same step took 27-30 s.
The price is a higher peak of resident memory, since freed blocks are reused in place rather than returned
and the heap fragments: at 2048 px +14% by ``medattn bench scaling``, +21-26% in the maximum resident size of
a process running two steps; and in streaming inference the fragments pile up (a 200,000-token bag: 2.7 GB
peak instead of 1.4 GB; 3.5 GB at 1,000,000 tokens, growing with the bag). Hence two defaults: ``reuse`` for training
(``medattn train``, ``cv``, ``compare``, ``demo``, ``bench`` and :func:`keep_freed_memory` in ``fit()``),
``hugepages`` for the commands that only run models. Modes, from ``MEDATTN_MALLOC`` (which wins over both):

* ``reuse``: the above, with huge pages for the heap when the process starts with them (the command line);
* ``hugepages``: huge pages only;
* ``default``: glibc's own behaviour.

A user's own choice wins and this module then changes nothing: an allocator in ``LD_PRELOAD`` (tcmalloc,
jemalloc, mimalloc) or any ``MALLOC_*`` variable, or malloc tunables in ``GLIBC_TUNABLES`` other than
these. On a C library other than glibc nothing is changed.

Two ways in: the ``medattn`` command restarts itself once with the tunables of its mode in
``GLIBC_TUNABLES`` (:func:`startup_tunables`; huge pages can only be chosen at process start), and the
library's training entry points call :func:`keep_freed_memory`, which applies ``reuse`` to a running process
with ``mallopt`` (whose trim threshold is a C int: at most 2 GiB of free memory at the heap's top is kept) and
exports the 1 TiB setting to the processes it starts.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform

MODE_VARIABLE = "MEDATTN_MALLOC"
MODES = ("reuse", "hugepages", "default")
HUGE_PAGES = "glibc.malloc.hugetlb=1"
#: Freed heap memory beyond this (1 TiB) would be returned to the kernel: in practice, never.
TRIM_THRESHOLD = 1 << 40
REUSE = f"glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold={TRIM_THRESHOLD}"
TUNABLES = {"reuse": (HUGE_PAGES, REUSE), "hugepages": (HUGE_PAGES,), "default": ()}
_PRELOADED_ALLOCATORS = ("tcmalloc", "jemalloc", "mimalloc")
# glibc's <malloc.h> parameter numbers for mallopt
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4


def mode(default: str = "reuse") -> str:
    """The mode asked for in ``MEDATTN_MALLOC``, else ``default``; an unknown value raises ValueError."""
    chosen = os.environ.get(MODE_VARIABLE, default)
    if chosen not in MODES:
        raise ValueError(f"{MODE_VARIABLE}={chosen!r}: must be one of {', '.join(MODES)}")
    return chosen


def user_allocator_settings() -> str | None:
    """The user's own allocator settings that medattn leaves alone (a short description), or None."""
    preload = os.environ.get("LD_PRELOAD", "")
    preloaded = next((name for name in _PRELOADED_ALLOCATORS if name in preload), None)
    if preloaded:
        return f"{preloaded} (LD_PRELOAD)"
    variables = sorted(name for name in os.environ if name.startswith("MALLOC_"))
    if variables:
        return ", ".join(variables)
    ours = {setting for tunables in TUNABLES.values() for group in tunables for setting in group.split(":")}
    theirs = [t for t in os.environ.get("GLIBC_TUNABLES", "").split(":") if "malloc" in t and t not in ours]
    return f"GLIBC_TUNABLES={':'.join(theirs)}" if theirs else None


def _applies() -> bool:
    return platform.libc_ver()[0] == "glibc" and user_allocator_settings() is None


def startup_tunables(default_mode: str = "reuse") -> str | None:
    """``GLIBC_TUNABLES`` for a process to start with in the mode of ``MEDATTN_MALLOC`` (else ``default_mode``), or
    None when nothing is to change (mode ``default``, the user's own settings, not glibc, or the environment
    already holds them)."""
    current = os.environ.get("GLIBC_TUNABLES", "")
    missing = [group for group in TUNABLES[mode(default_mode)] if group not in current]
    if not missing or not _applies():
        return None
    return ":".join([current, *missing] if current else missing)


@functools.cache
def keep_freed_memory() -> bool:
    """Apply mode ``reuse`` to this running process (``mallopt``: no ``mmap`` for large blocks, freed memory
    kept) and to the processes it starts (``GLIBC_TUNABLES``); nothing to do in a process that started with it.
    Returns whether the process now runs in mode ``reuse``: False in the other modes, with the user's own
    settings, or off glibc. Blocks allocated before stay as they were."""
    if mode() != "reuse" or not _applies():
        return False
    current = os.environ.get("GLIBC_TUNABLES", "")
    if REUSE in current:  # started with it (the command line): mallopt would lower the trim threshold to 2 GiB
        return True
    libc = ctypes.CDLL(None)
    if not (libc.mallopt(_M_MMAP_MAX, 0) and libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)):  # an int, at most
        return False
    os.environ["GLIBC_TUNABLES"] = f"{current}:{REUSE}" if current else REUSE
    return True


def describe() -> str:
    """The allocator this process runs with, for benchmark records."""
    user = user_allocator_settings()
    if user:
        return user if "LD_PRELOAD" in user else f"glibc with the user's settings ({user})"
    if platform.libc_ver()[0] != "glibc":
        return platform.libc_ver()[0] or "the C library's malloc"
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    parts = (["freed memory kept for reuse (mmap_max=0)"] if REUSE in tunables else []) + (
        ["transparent huge pages (hugetlb=1)"] if HUGE_PAGES in tunables else [])
    return "glibc with " + " and ".join(parts) if parts else "glibc"
