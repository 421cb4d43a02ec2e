"""The output policy of every command that writes files: nothing a user owns is lost.

An :class:`OutputFolder` is where one command writes. Its rules:

* **never over an input**: a path the command read (any of ``inputs``, compared as the same file on disk) is
  refused, with or without ``--overwrite``;
* **never over what it did not create**: an existing file is refused unless ``overwrite`` is given (a file this
  command already wrote in the same call may be replaced);
* **never outside the folder**: a name taken from an input or a table is confined (no ``..``, no absolute
  path, no separator, not empty);
* **distinct names for inputs that share one**: ``a/x.png`` and ``b/x.png`` give ``x`` and ``x_2``
  (:meth:`OutputFolder.stem_for`), so no output replaces another; the summary names each;
* **atomic**: every file is written to a temporary name beside its target and renamed into place
  (:meth:`OutputFolder.write`), so a killed command leaves the old file or the complete new one.

OS errors while writing (disk full, read-only folder) become one-line :class:`~medattn.errors.UserError`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from medattn.errors import UserError, writing

DOUBLE_SUFFIXES = (".nii.gz",)


def file_stem(path: Path) -> str:
    """The file name without its suffix (``scan.nii.gz`` -> ``scan``; a DICOM series folder keeps its name)."""
    name = Path(path).name
    for suffix in DOUBLE_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return Path(name).stem or name


def safe_name(name: str) -> str:
    """``name`` as one file name inside a folder: a UserError for an empty name, ``..``, or a separator."""
    text = str(name)
    if not text or text in (".", "..") or "/" in text or "\\" in text or "\0" in text:
        raise UserError(f"{text!r} cannot be an output file name (empty, '..' or a path): rename the input")
    return text


class OutputFolder:
    """One command's output folder (see the module docstring). ``inputs``: every file the command reads."""

    def __init__(self, folder: str | Path, inputs: Iterable[str | Path] = (), overwrite: bool = False) -> None:
        self.folder, self.overwrite = Path(folder), overwrite
        self._inputs = [Path(p) for p in inputs]
        self._stems: dict[str, int] = {}
        self._written: set[Path] = set()
        if self.folder.exists() and not self.folder.is_dir():
            raise UserError(f"output folder {self.folder} is a file, not a folder")
        if any(self._same(self.folder, p) for p in self._inputs):
            raise UserError(f"output folder {self.folder} is one of the inputs")

    @staticmethod
    def _same(a: Path, b: Path) -> bool:
        try:
            return a.exists() and b.exists() and os.path.samefile(a, b)
        except OSError:
            return False

    def stem_for(self, source: str | Path) -> str:
        """A stem for the outputs of input ``source``, distinct from every other input's in this command."""
        stem = safe_name(file_stem(Path(source)))
        self._stems[stem] = self._stems.get(stem, 0) + 1
        return stem if self._stems[stem] == 1 else f"{stem}_{self._stems[stem]}"

    def path(self, name: str) -> Path:
        """The checked target ``folder/name`` (see the module docstring); the folder is created."""
        target = self.folder / safe_name(name)
        if any(self._same(target, p) or target == p for p in self._inputs):
            raise UserError(f"{target} is an input of this command: refusing to write over it (choose another "
                            f"--out)")
        if target.exists() and target not in self._written and not self.overwrite:
            raise UserError(f"{target} exists and this command did not write it: refusing to replace it (choose "
                            f"another --out, or give --overwrite)")
        with writing(self.folder):
            self.folder.mkdir(parents=True, exist_ok=True)
        return target

    @contextlib.contextmanager
    def write(self, name: str) -> Iterator[Path]:
        """Yield a temporary path beside ``folder/name``; on success it is renamed into place (atomic), on any
        failure it is removed and the target untouched."""
        target = self.path(name)
        suffix = "".join(Path(name).suffixes[-2:]) if name.lower().endswith(DOUBLE_SUFFIXES) else Path(name).suffix
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}{suffix}")
        try:
            with writing(target):
                yield tmp
                os.replace(tmp, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        self._written.add(target)
