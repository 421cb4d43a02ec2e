"""The output policy seen by behaviour, not by form (issue 50): a :func:`sys.addaudithook` recorder of every file a
command writes, removes or creates while it runs in this process.

The AST scan (``tests/house/write_scan.py``) recognises the forms of a write; this recorder does not need to. It
hears CPython's audit events (``open`` with a flag that writes, ``os.rename`` (``os.replace`` too), ``os.remove``,
``os.rmdir``, ``os.mkdir``, ``os.symlink``, ``os.link``, ``os.truncate``, ``shutil.rmtree``, ``shutil.copyfile``,
``shutil.move``) with the Python stack of each, and :func:`problems` judges them:

* **who**: an event whose stack passes through ``medattn`` must have one of the allowed writers on that stack
  (:data:`WRITERS`: the output module, the checkpoint writer, train's run-folder transaction), or write a temporary
  name the output module hands out (``.<name>.tmp-<pid>``, which a format's own writer, PIL or nibabel, fills
  under :meth:`OutputFolder.write` or :func:`atomic`), or come from a test's stand-in (:data:`STAND_INS`);
* **where**: every path it writes lies in the run's output folder, in a folder ``tempfile`` made during the call,
  or is a file ``tempfile`` made itself.

No file is written by ``os.devnull`` or ``/proc/self/...`` (a bench's memory reset), and a library's own cache
(:data:`CACHES`) is no output of a command: neither is judged.

What it cannot hear: writes of native code (h5py's HDF5 library, ``torch.save``'s C++ zip writer, safetensors),
writes of child processes and of threads whose stack never enters ``medattn`` (TensorBoard's event writer): the
AST scan covers those forms. Audit hooks cannot be removed, so :data:`RECORDER` is installed once per process and
records only inside :func:`recording`.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from getpass import getuser
from pathlib import Path

import medattn

PACKAGE = Path(medattn.__file__).resolve().parent
WRITERS = {"outputs.py", "runtime/checkpoint.py", "train/rundir.py"}
#: (test file, function) -> why a test's fake may write: it stands in for an allowed writer.
STAND_INS = {("test_outputs.py", "train_job"): "demo's fake training stands in for train's run folder (train.rundir)"}
#: Folders a library keeps for itself, which no command owns -> why they may be written.
CACHES = {Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or Path(tempfile.gettempdir()) / f"torchinductor_{getuser()}"):
          "torch's compile cache (torch._inductor's cache_dir), made when torch.export traces a model"}
EVENTS = {"open", "os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.truncate",
          "shutil.rmtree", "shutil.copyfile", "shutil.move", "tempfile.mkdtemp", "tempfile.mkstemp"}
#: Events whose first path is only read (the second is written); for the others every path is written.
READS_FIRST = {"shutil.copyfile", "os.symlink", "os.link"}
#: Where an event's folder descriptors begin (``dir_fd``: its names are relative to that folder).
DIR_FDS = {"os.remove": 1, "os.rmdir": 1, "os.mkdir": 2, "os.rename": 2, "os.symlink": 2, "os.link": 2}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
TEMPORARY = re.compile(r"^\..+\.tmp-\d+")  # medattn.outputs.temporary_name
TEMPFILE = str(Path(tempfile.__file__).resolve())


@dataclass
class Event:
    name: str
    paths: list[str]
    stack: list[tuple[str, str]]  # (file, function), innermost first


@dataclass
class Recorder:
    on: bool = False
    events: list[Event] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def hear(self, name: str, args: tuple) -> None:
        if not self.on or name not in EVENTS:
            return
        if name == "open":
            path, mode, flags = args
            if isinstance(path, int) or not (set(mode or "") & set("wax+") or (flags or 0) & WRITE_FLAGS):
                return
            paths = [path]
        elif any(isinstance(a, int) and a >= 0 for a in args[DIR_FDS.get(name, len(args)):]):
            return  # a name relative to a folder's descriptor: an entry of the shutil.rmtree heard before it
        else:
            paths = [a for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))]
            paths = paths[1:2] if name in READS_FIRST else paths[:2 if name in ("os.rename", "shutil.move") else 1]
        frame, stack = sys._getframe(1), []
        while frame is not None:
            stack.append((frame.f_code.co_filename, frame.f_code.co_name))
            frame = frame.f_back
        with self.lock:
            self.events.append(Event(name, [os.fsdecode(p) for p in paths], stack))


RECORDER = Recorder()
sys.addaudithook(RECORDER.hear)


@contextlib.contextmanager
def recording():
    """Record the events of the block; yields the list they are added to."""
    with RECORDER.lock:
        RECORDER.events = []
    RECORDER.on = True
    try:
        yield RECORDER.events
    finally:
        RECORDER.on = False


def _module(file: str) -> str | None:
    """``outputs.py`` for a file of the package; None for any other file."""
    try:
        return Path(file).resolve().relative_to(PACKAGE).as_posix()
    except ValueError:
        return None


def _device(path: str) -> bool:
    """Whether ``path`` is no file: ``os.devnull`` or one of this process's ``/proc/self`` entries."""
    return path == os.devnull or path.startswith("/proc/self/")


def _inside(path: Path, folders: list[Path]) -> bool:
    return any(path == folder or folder in path.parents for folder in folders)


def problems(events: list[Event], out: Path) -> list[str]:
    """Each recorded write that breaks the policy, in words (see the module docstring); ``out``: the output folder."""
    folders = [Path(out).resolve()] + [Path(e.paths[0]).resolve() for e in events if e.name == "tempfile.mkdtemp"]
    made = {Path(e.paths[0]).resolve() for e in events if e.name == "tempfile.mkstemp"}
    found = []
    for event in events:
        if event.name.startswith("tempfile."):
            continue
        modules = [m for m in (_module(file) for file, _ in event.stack) if m is not None]
        stand_in = any((Path(file).name, function) in STAND_INS for file, function in event.stack)
        if not modules or stand_in or str(Path(event.stack[0][0]).resolve()) == TEMPFILE:
            continue  # not the command's (a thread, the test itself), a stand-in's, or tempfile's own file
        paths = [Path(os.path.abspath(p)) for p in event.paths if not _device(p) and not _inside(Path(p), [*CACHES])]
        if not paths:
            continue
        where = f"{event.name} {', '.join(map(str, paths))} from {modules[0]}"
        if not set(modules) & WRITERS and not all(
                any(TEMPORARY.match(part) for part in p.parts) for p in paths):
            found.append(f"{where}: no allowed writer ({', '.join(sorted(WRITERS))}) on the stack")
        elsewhere = [p for p in paths if not _inside(p.resolve(), folders) and p.resolve() not in made
                     and not (event.name == "os.mkdir" and p.resolve() in folders[0].parents)]  # the way to out
        if elsewhere:
            found.append(f"{where}: outside the output folder {out} and any tempfile folder")
    return found
