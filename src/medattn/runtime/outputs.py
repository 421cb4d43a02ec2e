"""The output policy of every command that writes files: nothing a user owns is lost.

An :class:`OutputFolder` is where one command writes. Its rules:

* **never over an input**: a path the command read (any of ``inputs``, compared as the same file on disk) is
  refused, with or without ``--overwrite``;
* **never over what it did not create**: an existing file is refused unless ``overwrite`` is given (a file this
  command already wrote in the same call may be replaced);
* **never outside the folder**: a name taken from an input or a table is confined (no ``..``, no absolute
  path, no separator, not empty);
* **distinct names for inputs that share one**: ``a/x.png`` and ``b/x.png`` give ``x`` and ``x_2``
  (:meth:`OutputFolder.stem_for`; never a stem given before, whatever its case, so ``x_2.png`` as a third input
  gets ``x_2_2``), so no output replaces another; the summary names each;
* **replace only what this command wrote before** (``manifest``, for a command such as ``demo`` that is run
  again into one folder): :meth:`OutputFolder.claim` refuses an existing entry its earlier calls did not record in
  the folder's manifest, and :meth:`OutputFolder.settle` removes what they recorded and this call no longer
  writes; nothing else in the folder is touched;
* **atomic**: every file is written to a temporary name beside its target and renamed into place
  (:meth:`OutputFolder.write`), so a killed command leaves the old file or the complete new one.

OS errors while writing (disk full, read-only folder) become one-line :class:`~medattn.errors.UserError`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
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
    """One command's output folder (see the module docstring). ``inputs``: every file the command reads;
    ``manifest``: the name of the file in the folder that records what this command's calls wrote there."""

    def __init__(self, folder: str | Path, inputs: Iterable[str | Path] = (), overwrite: bool = False,
                 manifest: str | None = None) -> None:
        self.folder, self.overwrite = Path(folder), overwrite
        self._inputs = [Path(p) for p in inputs]
        self._stems: set[str] = set()
        self._written: set[Path] = set()
        self._manifest = manifest
        self.recorded = self._read_manifest() if manifest else []  # what earlier calls wrote (relative paths)
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
        """A stem for the outputs of input ``source``, distinct from every stem given before in this command (also
        in case: the outputs stay apart on a case-insensitive disk): ``x``, then ``x_2``, ``x_3``, ..."""
        stem = safe_name(file_stem(Path(source)))
        unique, n = stem, 1
        while unique.casefold() in self._stems:
            n += 1
            unique = f"{stem}_{n}"
        self._stems.add(unique.casefold())
        return unique

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

    def entry(self, name: str) -> Path:
        """``folder/name`` for a relative path ``name`` (``runs/x``), each part confined as by :func:`safe_name`."""
        return self.folder.joinpath(*(safe_name(part) for part in str(name).split("/")))

    def _read_manifest(self) -> list[str]:
        """The entries the manifest records; none when it is missing or unreadable (then nothing is replaced)."""
        try:
            recorded = json.loads((self.folder / self._manifest).read_text())["written"]
        except (OSError, ValueError, KeyError, TypeError):
            return []
        if not isinstance(recorded, list):
            return []
        return [name for name in recorded if isinstance(name, str) and all(
            part not in ("", ".", "..") and "\\" not in part and "\0" not in part for part in name.split("/"))]

    def _record(self, names: Iterable[str]) -> None:
        self._written.add(self.folder / self._manifest)  # the manifest is this command's own file
        with self.write(self._manifest) as tmp:
            tmp.write_text(json.dumps({"written": sorted(set(names))}, indent=1) + "\n")

    def claim(self, names: Iterable[str]) -> None:
        """Before writing the entries ``names`` (relative paths, files or folders; needs ``manifest``): refuse one
        that exists and that no earlier call recorded, then record them (before they are written, so what a killed
        call leaves is this command's to replace); those entries may then be replaced."""
        names = list(names)
        for name in names:
            target = self.entry(name)
            if target.exists() and name not in self.recorded and not self.overwrite:
                raise UserError(f"{target} exists and an earlier call of this command did not write it: refusing to "
                                f"replace it (move it, or choose another --out)")
        self._record([*self.recorded, *names])
        self.recorded = sorted(set(self.recorded) | set(names))
        self._written.update(self.entry(name) for name in names)

    def settle(self, names: Iterable[str]) -> None:
        """After a complete call that wrote ``names``: remove the entries earlier calls recorded that this one did not
        write again, and record only ``names`` (those that exist)."""
        names = [name for name in names if self.entry(name).exists()]
        with writing(self.folder):
            for name in sorted(set(self.recorded) - set(names)):
                target = self.entry(name)
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                elif target.exists() or target.is_symlink():
                    target.unlink()
        self._record(names)
        self.recorded = sorted(set(names))

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
