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
* **skip what is done** (``resume``, for ``wsi tile``/``extract``, ``cv`` and ``compare``): the command judges each
  entry by its own record (written last, e.g. a slide's JSON) and skips what is done; what is not done (an entry a
  killed call left, or its summary) is replaced, without ``--overwrite``;
* **atomic**: every file is written to a temporary name beside its target and renamed into place
  (:meth:`OutputFolder.write`), so a killed command leaves the old file or the complete new one.

OS errors while writing (disk full, read-only folder) become one-line :class:`~medattn.errors.UserError`.

This module is the only code in ``src/`` that writes or removes files (``tests/house/test_output_policy.py``),
besides the checkpoint writer (:mod:`medattn.runtime.checkpoint`) and train's run-folder transaction
(:mod:`medattn.train.rundir`). A writer below the commands takes a folder, never a bare path: the command's
:class:`OutputFolder`, or, for a folder whose policy its caller applied (a run folder, a cache, a slide's folder),
:meth:`OutputFolder.within`. A format's own writer (PIL, nibabel, h5py, tifffile, torch.export) writes the temporary
path :meth:`OutputFolder.write` hands out.

The path primitives (:func:`atomic`, :func:`save_csv`, :func:`save_dicts`, :func:`append_csv`, :func:`save_figure`,
:func:`remove`) decide nothing: the policy's internals, left public only for the writers not yet converted, which
``tests/house/test_one_writer.py`` lists (a list that only shrinks); the names with a leading underscore
(``_save_text``, ``_safe_name``, ``_temporary_name``, ...) are this module's alone.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from medattn.errors import UserError, writing

DOUBLE_SUFFIXES = (".nii.gz",)


def _file_stem(path: Path) -> str:
    """The file name without its suffix (``scan.nii.gz`` -> ``scan``; a DICOM series folder keeps its name)."""
    name = Path(path).name
    for suffix in DOUBLE_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return Path(name).stem or name


def _safe_name(name: str) -> str:
    """``name`` as one file name inside a folder: a UserError for an empty name, ``..``, or a separator."""
    text = str(name)
    if not text or text in (".", "..") or "/" in text or "\\" in text or "\0" in text:
        raise UserError(f"{text!r} cannot be an output file name (empty, '..' or a path): rename the input")
    return text


def _temporary_name(target: Path) -> Path:
    """``.<name>.tmp-<pid><suffix>`` beside ``target``: hidden, this process's, and with the target's suffix (the
    writers of PIL and nibabel choose their format by it)."""
    name = target.name
    suffix = next((s for s in DOUBLE_SUFFIXES if name.lower().endswith(s)), Path(name).suffix)
    return target.with_name(f".{name}.tmp-{os.getpid()}{suffix}")


@contextlib.contextmanager
def atomic(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (its folder created); when the block ends without an error it is
    renamed to ``path`` (atomic on one file system), on any failure removed, ``path`` untouched. No policy: the
    caller decided that ``path`` may be written; OS errors propagate (wrap the block in
    :func:`~medattn.errors.writing` for a one-line error)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary_name(target)
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _save_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically; an OS error is a one-line UserError naming ``path``."""
    with writing(path), atomic(path) as tmp:
        tmp.write_text(text, encoding=encoding)
    return Path(path)


#: The one CSV dialect of every file medattn writes: the csv module's (comma, minimal quoting) with lines ended by
#: "\n" (the module's default ends them with "\r\n"; explain's tile tables and hand-made headers used "\n").
CSV_LINE_END = "\n"


def _csv_text(header: Sequence | None, rows: Iterable[Sequence]) -> str:
    """``header`` (None: no header) and ``rows`` as CSV text, as :mod:`csv` writes them with :data:`CSV_LINE_END`."""
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer, lineterminator=CSV_LINE_END)
    if header is not None:
        writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


def _dicts_text(rows: Iterable[dict], fields: Sequence[str], header: bool = True) -> str:
    """``rows`` (mappings) as CSV text with the columns ``fields``, as :class:`csv.DictWriter` writes them with
    :data:`CSV_LINE_END`."""
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=list(fields), lineterminator=CSV_LINE_END)
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def save_csv(path: str | Path, header: Sequence | None, rows: Iterable[Sequence]) -> Path:
    """A CSV file of ``header`` and ``rows``, atomically."""
    return _save_text(path, _csv_text(header, rows))


def save_dicts(path: str | Path, rows: Iterable[dict], fields: Sequence[str]) -> Path:
    """A CSV file of ``rows`` (mappings) with the columns ``fields``, atomically."""
    return _save_text(path, _dicts_text(rows, fields))


def append_csv(path: str | Path, rows: Iterable[dict], fields: Sequence[str]) -> Path:
    """Add ``rows`` to the CSV file ``path`` (with its header when the file is new): the file is written again
    under a temporary name and renamed, so a kill leaves the rows before or after, never half a row. The old text is
    read with universal newlines, so a file an earlier medattn ended with CR LF comes out ended as the new rows."""
    path = Path(path)
    with writing(path):
        old = path.read_text(encoding="utf-8") if path.exists() else ""
    return _save_text(path, old + _dicts_text(rows, fields, header=not old))


def save_figure(path: str | Path, fig, **options) -> Path:
    """A matplotlib figure (``fig.savefig(options)``; the format from ``path``'s suffix), atomically."""
    options.setdefault("format", Path(path).suffix.lstrip(".") or None)
    with writing(path), atomic(path) as tmp:
        fig.savefig(tmp, **options)
    return Path(path)


def remove(path: str | Path) -> None:
    """Remove the file or folder tree ``path`` (a link itself, never what it points to); nothing if missing."""
    path = Path(path)
    with writing(path):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


class OutputFolder:
    """One command's output folder (see the module docstring). ``inputs``: every file the command reads;
    ``overwrite``: replace existing files (``--overwrite``); ``resume``: the command skips what is done and replaces
    the rest (it judges each entry itself); ``manifest``: the name of the file in the folder that records what this
    command's calls wrote there."""

    def __init__(self, folder: str | Path, inputs: Iterable[str | Path] = (), overwrite: bool = False,
                 manifest: str | None = None, resume: bool = False) -> None:
        self.folder, self.overwrite, self.resume = Path(folder), overwrite, resume
        self._inputs = [Path(p) for p in inputs]
        self._stems: set[str] = set()
        self._written: set[Path] = set()
        self._manifest = manifest
        self.recorded = self._read_manifest() if manifest else []  # what earlier calls wrote (relative paths)
        if self.folder.exists() and not self.folder.is_dir():
            raise UserError(f"output folder {self.folder} is a file, not a folder")
        if any(self._same(self.folder, p) for p in self._inputs):
            raise UserError(f"output folder {self.folder} is one of the inputs")

    @classmethod
    def within(cls, folder: str | Path) -> OutputFolder:
        """A folder whose policy its caller applied (a run folder train's transaction set up, a cache, a slide's own
        folder inside a command's): every name in it may be written and replaced, atomically."""
        return cls(folder, overwrite=True)

    @staticmethod
    def _same(a: Path, b: Path) -> bool:
        try:
            return a.exists() and b.exists() and os.path.samefile(a, b)
        except OSError:
            return False

    def stem_for(self, source: str | Path) -> str:
        """A stem for the outputs of input ``source``, distinct from every stem given before in this command (also
        in case: the outputs stay apart on a case-insensitive disk): ``x``, then ``x_2``, ``x_3``, ..."""
        stem = _safe_name(_file_stem(Path(source)))
        unique, n = stem, 1
        while unique.casefold() in self._stems:
            n += 1
            unique = f"{stem}_{n}"
        self._stems.add(unique.casefold())
        return unique

    def path(self, name: str) -> Path:
        """The checked target ``folder/name`` (see the module docstring); the folder is created."""
        target = self.folder / _safe_name(name)
        if any(self._same(target, p) or target == p for p in self._inputs):
            raise UserError(f"{target} is an input of this command: refusing to write over it (choose another "
                            f"--out)")
        if target.exists() and target not in self._written and not (self.overwrite or self.resume):
            raise UserError(f"{target} exists and this command did not write it: refusing to replace it (choose "
                            f"another --out, or give --overwrite)")
        self.create()
        return target

    def create(self) -> Path:
        """The folder, created (with its parents) if missing; an OS error is a one-line UserError."""
        with writing(self.folder):
            self.folder.mkdir(parents=True, exist_ok=True)
        return self.folder

    def entry(self, name: str) -> Path:
        """``folder/name`` for a relative path ``name`` (``runs/x``), each part confined as by :func:`_safe_name`."""
        return self.folder.joinpath(*(_safe_name(part) for part in str(name).split("/")))

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
        for name in sorted(set(self.recorded) - set(names)):
            remove(self.entry(name))
        self._record(names)
        self.recorded = sorted(set(names))

    @contextlib.contextmanager
    def write(self, name: str) -> Iterator[Path]:
        """Yield a temporary path beside ``folder/name``; on success it is renamed into place (atomic), on any
        failure it is removed and the target untouched."""
        target = self.path(name)
        with writing(target), atomic(target) as tmp:
            yield tmp
        self._written.add(target)

    def save_text(self, name: str, text: str) -> Path:
        """``folder/name`` holding ``text`` (checked as :meth:`path`, written as :meth:`write`)."""
        with self.write(name) as tmp:
            tmp.write_text(text, encoding="utf-8")
        return self.folder / name

    def save_json(self, name: str, value, indent: int | None = 1, **options) -> Path:
        """``folder/name`` holding ``value`` as JSON."""
        return self.save_text(name, json.dumps(value, indent=indent, **options))

    def save_csv(self, name: str, header: Sequence | None, rows: Iterable[Sequence]) -> Path:
        """``folder/name``: a CSV file of ``header`` and ``rows``."""
        return self.save_text(name, _csv_text(header, rows))

    def save_dicts(self, name: str, rows: Iterable[dict], fields: Sequence[str]) -> Path:
        """``folder/name``: a CSV file of ``rows`` (mappings) with the columns ``fields``."""
        return self.save_text(name, _dicts_text(rows, fields))

    def save_figure(self, name: str, fig, **options) -> Path:
        """``folder/name``: a matplotlib figure (format from the suffix)."""
        options.setdefault("format", Path(name).suffix.lstrip(".") or None)
        with self.write(name) as tmp:
            fig.savefig(tmp, **options)
        return self.folder / name

    def save_image(self, name: str, image, **options) -> Path:
        """``folder/name``: a PIL image."""
        with self.write(name) as tmp:
            image.save(tmp, **options)
        return self.folder / name

    def append_csv(self, name: str, rows: Iterable[dict], fields: Sequence[str]) -> Path:
        """Add ``rows`` to the CSV file ``folder/name`` (with its header when the file is new; a file the command
        did not write is refused as by :meth:`path` unless ``overwrite``), as :func:`append_csv` does."""
        target = append_csv(self.path(name), rows, fields)
        self._written.add(target)
        return target

    def remove(self, name: str) -> None:
        """Remove the entry ``folder/name`` (a relative path, confined as by :meth:`entry`); nothing if missing."""
        remove(self.entry(name))
