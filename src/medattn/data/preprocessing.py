"""One preprocessing description per trained model: how a file becomes the model's input.

Every data builder returns the description of what it applied (``DataBundle.preprocessing``, made with
:meth:`Preprocessing.of` from the very values its loaders use); nothing derives it again from a config.
Training stores it in the checkpoint (``checkpoint.json`` key ``preprocessing``), and ``predict``,
``explain`` and ``export`` read it back (:func:`from_checkpoint_meta`), so a file is prepared for
prediction exactly as the training split's files were (minus augmentation); ``eval`` compares it with
the description of the data it scores. It holds no paths, labels or splits: only what a new file needs.
The steps it drives are the data layer's own loaders (:class:`~medattn.data.readers.images.ImageLoader`,
:class:`~medattn.data.readers.volumes.VolumeLoader`, :class:`~medattn.data.readers.slices.SliceFileLoader`,
:class:`~medattn.data.readers.bags.BagLoader`); a generated test checks for every data kind that a file prepared
so equals the tensor training built.

The description's fields: :mod:`medattn.vocabulary.preprocessing`.

An inference sample is one tuple of paths (two for ``subtract``); with ``split_sides`` it gives two
samples, ``<file>#left`` and ``<file>#right`` (:func:`inference_dataset`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from torch.utils.data import Dataset

from ..errors import UserError
from ..vocabulary import task_types
from ..vocabulary.preprocessing import VERSION, Preprocessing
from . import input_kinds
from .base import TASK_TYPES, TaskInfo, task_problem

NORMALISATIONS = ("zscore", "percentile", "none")
SIDES = ("left", "right")


def stated_task(prep: Preprocessing) -> TaskInfo:
    """The task a description states (type, input kind, outputs, classes, input shape, targets' scale)."""
    return TaskInfo(prep.task_type, prep.input_kind, prep.num_outputs, prep.input_shape, list(prep.class_names),
                    prep.synthetic, list(prep.target_mean), list(prep.target_std))


def from_dict(data, source: str) -> Preprocessing:
    """A stored description, checked; a one-line UserError naming ``source`` and the field otherwise."""
    fields = {f.name: f for f in dataclasses.fields(Preprocessing)}
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise UserError(f"{source}: preprocessing must be a mapping with version {VERSION}, got "
                        f"{data.get('version') if isinstance(data, dict) else type(data).__name__!r}")
    unknown = sorted(set(data) - set(fields) - {"version"})
    if unknown:
        raise UserError(f"{source}: preprocessing has unknown keys {unknown}")

    def numbers(value, count=None) -> bool:
        return isinstance(value, list) and (count is None or len(value) == count) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)

    shape = data.get("input_shape")
    kind = input_kinds.known(data.get("input_kind"))
    # per-channel mean/std: images read as they are (a slice model normalises each file as a whole instead)
    reads_channels = kind is not None and kind.channel_statistics and data.get("slice_axis") is None \
        and not data.get("unpredictable")
    channels = shape[0] if reads_channels and isinstance(shape, list) else 0
    checks = {
        "data_kind": isinstance(data.get("data_kind"), str),
        "input_kind": kind is not None,
        "task_type": data.get("task_type") in TASK_TYPES,
        "num_outputs": isinstance(data.get("num_outputs"), int) and 1 <= data["num_outputs"] <= 1 << 16,
        "class_names": isinstance(data.get("class_names"), list)
        and all(isinstance(c, str) for c in data["class_names"]),
        "input_shape": isinstance(shape, list) and kind is not None and len(shape) == kind.spatial_dims + 1
        and all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1 << 16 for v in shape),
        "synthetic": isinstance(data.get("synthetic", False), bool),
        "mean": numbers(data.get("mean", []), channels),
        "std": numbers(data.get("std", []), channels) and all(v > 0 for v in data.get("std", [])),
        "spacing": data.get("spacing") is None or (numbers(data["spacing"], 3) and min(data["spacing"]) > 0),
        "normalize": data.get("normalize", "none") in NORMALISATIONS,
        "subtract": isinstance(data.get("subtract", False), bool),
        "split_sides": isinstance(data.get("split_sides", False), bool),
        "slice_axis": data.get("slice_axis") in (None, 0, 1, 2) and not isinstance(data.get("slice_axis"), bool),
        "unpredictable": isinstance(data.get("unpredictable", ""), str),
        "target_mean": numbers(data.get("target_mean", []), len(data.get("target_std", []))),
        "target_std": numbers(data.get("target_std", [])) and all(v > 0 for v in data.get("target_std", [])),
    }
    bad = next((key for key, ok in checks.items() if not ok), None)
    if bad is not None:
        raise UserError(f"{source}: preprocessing.{bad} is missing or invalid (got {data.get(bad)!r})")
    contradiction = task_problem(data["task_type"], data["num_outputs"], data["class_names"])
    if contradiction:
        raise UserError(f"{source}: the preprocessing contradicts itself ({contradiction}): the file was edited or "
                        f"damaged")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k != "version"}
    return Preprocessing(**values)


def from_checkpoint_meta(meta: dict, source: str) -> Preprocessing | None:
    """The checkpoint's stored description (``meta`` is its checkpoint.json), checked; None for a checkpoint
    that stores none (written before 2026-11-20, or from data built outside the registered kinds)."""
    return from_dict(meta["preprocessing"], source) if "preprocessing" in meta else None


def check_task(prep: Preprocessing, task: TaskInfo, source: str) -> None:
    """The description agrees with the checkpoint's task (type, input kind, outputs, classes, input shape);
    a UserError naming the first field that differs (an edited file)."""
    stated = stated_task(prep)
    for name in ("task_type", "input_kind", "num_outputs", "class_names", "input_shape", "target_mean", "target_std"):
        mine, theirs = getattr(stated, name), getattr(task, name)
        if (list(mine) != list(theirs)) if isinstance(mine, (list, tuple)) else (mine != theirs):
            raise UserError(f"{source}: preprocessing.{name} is {mine!r} but the task says {theirs!r}; the file was "
                            f"edited or damaged: refusing to guess which is right")


def differences(trained: Preprocessing, other: Preprocessing) -> list[str]:
    """The fields (besides the data kind, paths and synthetic flag) where ``other`` prepares inputs differently."""
    ignore = {"data_kind", "synthetic"}
    return [f.name for f in dataclasses.fields(Preprocessing)
            if f.name not in ignore and getattr(trained, f.name) != getattr(other, f.name)]


def segments_whole_volumes(prep: Preprocessing) -> bool:
    """Whether prediction gives this model whole inputs: a 3D segmentation model's volumes, a slice segmenter's slices
    (padded up to its input size, never cropped, then segmented by sliding windows of that size,
    :mod:`medattn.deploy.segmentation`)."""
    spatial = input_kinds.of(prep.input_kind).spatial_dims
    return task_types.of(prep.task_type).voxel_labels and (spatial == 3 or prep.slice_axis is not None)


def file_loader(prep: Preprocessing, whole: bool = False):
    """record (paths, ``extra["side"]``) -> {"input": tensor}: the data layer's loader for this description;
    a one-line UserError for a description no single file can follow (``unpredictable``). ``whole``: a segmentation
    model's inputs uncropped (:func:`segments_whole_volumes`)."""
    if prep.unpredictable:
        raise UserError(prep.unpredictable)
    whole = whole and segments_whole_volumes(prep)
    if prep.slice_axis is not None:
        from .readers.slices import SliceFileLoader

        return SliceFileLoader(prep.spacing, tuple(prep.input_shape[1:]), prep.normalize, prep.slice_axis, whole)
    if whole:
        from .readers.volumes import VolumeLoader

        return VolumeLoader(prep.spacing, tuple(prep.input_shape[1:]), prep.normalize, whole=True)
    return input_kinds.of(prep.input_kind).loader(prep)


def sample_paths(prep: Preprocessing, files: list, subtract: list | None = None) -> list[tuple[Path, ...]]:
    """Files (and the ``--subtract`` files, one per file) -> one tuple of paths per sample, as ``prep`` takes them
    (two for subtraction models); a UserError when the files do not fit its need."""
    files = expand_folders(prep, files)
    if prep.inputs_per_sample == 2:
        if subtract is None or len(subtract) != len(files):
            raise UserError(f"this model was trained on subtraction volumes: give --subtract with one volume per "
                            f"file ({len(files)} file(s), {0 if subtract is None else len(subtract)} --subtract)")
        return [(Path(a), Path(b)) for a, b in zip(files, subtract)]
    if subtract is not None:
        raise UserError("--subtract is for models trained on subtraction volumes; this one takes one file per sample")
    return [(Path(f),) for f in files]


class BadInputFile(UserError):
    """An input file that cannot be read or prepared (``--skip-bad`` leaves such files out)."""


def reads_folders(prep: Preprocessing) -> bool:
    """Whether a folder is one input of this model (a volume's DICOM series; a slice model reads volumes)."""
    return input_kinds.of(prep.input_kind).reads_folders or prep.slice_axis is not None


def expand_folders(prep: Preprocessing, files: list) -> list[Path]:
    """``files`` with each folder replaced by its files of the model's kind (its ``folder_suffixes``, sorted, not
    recursive); a volume model's folder stays (a DICOM series), as does a slice model's. An empty folder is a
    UserError."""
    suffixes = input_kinds.of(prep.input_kind).folder_suffixes
    out = []
    for name in files:
        path = Path(name)
        if not path.is_dir() or reads_folders(prep):
            out.append(path)
            continue
        found = sorted(p for p in path.iterdir() if p.is_file() and p.name.lower().endswith(suffixes))
        if not found:
            raise UserError(f"{path}: a folder with no {' / '.join(suffixes)} file")
        out += found
    return out


@dataclass(frozen=True)
class Item:
    """One inference sample: its id (the first file, ``#left``/``#right`` for sides), files and side."""

    id: str
    paths: tuple[Path, ...]
    side: str | None = None

    @property
    def name(self) -> str:
        """The sample's name without its side: the first file, or the name given (a patient)."""
        return self.id.removesuffix(f"#{self.side}") if self.side else self.id


def items(prep: Preprocessing, inputs: list[tuple[Path, ...]], names: list[str] | None = None) -> list[Item]:
    """The samples of ``inputs`` (one tuple of ``prep.inputs_per_sample`` paths each; a bag model's tuple may hold
    several slides of one patient, joined as training joined them), two per input with ``split_sides``; ``names``:
    their ids (default: the first file). A tuple of the wrong length is a UserError naming it."""
    joins = input_kinds.of(prep.input_kind).joins_files
    out = []
    for index, paths in enumerate(inputs):
        if len(paths) != prep.inputs_per_sample and not (joins and paths):
            what = ("two volumes (the second is subtracted from the first, as training's subtract_column was)"
                    if prep.subtract else "one file")
            raise UserError(f"{', '.join(map(str, paths))}: this model takes {what} per sample")
        sides = SIDES if prep.split_sides else (None,)
        name = str(paths[0]) if names is None else names[index]
        out += [Item(f"{name}#{side}" if side else name, tuple(paths), side) for side in sides]
    return out


class InferenceDataset(Dataset):
    """Files prepared as ``prep`` says, as samples with ``id`` and a placeholder label (map-style).

    With ``skip_bad`` a file that cannot be read or prepared gives a zero input of the model's shape
    (a one-instance bag for bags) and its reason is kept in ``bad`` (id -> reason), so one bad file does
    not stop a batch; the caller drops those ids. Without it the first bad file raises a UserError
    naming it. ``bad`` is filled in the process that reads (use no DataLoader workers with ``skip_bad``).
    """

    def __init__(self, prep: Preprocessing, inputs: list[tuple[Path, ...]], skip_bad: bool = False,
                 names: list[str] | None = None, whole: bool = False) -> None:
        from .files import check_regular
        from .tables import Record

        self.prep, self.skip_bad, self.items = prep, skip_bad, items(prep, inputs, names)
        self.load, self.bad = file_loader(prep, whole), {}
        self._record, self._check = Record, check_regular

    def __len__(self) -> int:
        return len(self.items)

    def _read(self, item: Item) -> dict:
        for path in item.paths:  # before anything opens them: a named pipe would block the reader
            try:
                self._check(path, folders=reads_folders(self.prep))
            except FileNotFoundError:
                raise BadInputFile(f"{path}: no such file") from None
            except ValueError as error:
                raise BadInputFile(f"{path}: {error}") from None
        record = self._record(id=item.id, patient=item.id, where=item.id, paths=item.paths,
                              extra={"side": item.side} if item.side else {})
        try:
            return self.load(record)
        except UserError as error:
            raise BadInputFile(str(error)) from None
        except Exception as error:  # readers raise many types for corrupt files
            raise BadInputFile(f"{item.id}: cannot read ({type(error).__name__}: {error})".replace("\n", " ")) \
                from None

    def placeholder(self) -> dict:
        return input_kinds.of(self.prep.input_kind).placeholder(self.prep.input_shape)

    def __getitem__(self, index: int) -> dict:
        item = self.items[index]
        try:
            sample = self._read(item)
        except UserError as error:
            if not self.skip_bad:
                raise
            self.bad[item.id] = str(error)
            sample = self.placeholder()
        # a class index, a label map of the input's shape (a slice model's volume: (1, h, w, S)) or zeros per output
        label = task_types.of(self.prep.task_type).placeholder_label(self.prep.num_outputs, sample["input"].shape[1:])
        return {**sample, "id": item.id, "patient": item.id, "label": label}  # placeholder label: outputs only


def inference_dataset(prep: Preprocessing, inputs: list[tuple[Path, ...]], skip_bad: bool = False,
                      names: list[str] | None = None, whole: bool = False) -> InferenceDataset:
    """The dataset of files ``inputs`` (tuples of paths, see :func:`items`; ``names`` their ids) prepared as
    ``prep`` says; ``whole``: a 3D segmentation model's volumes uncropped (:func:`segments_whole_volumes`)."""
    return InferenceDataset(prep, [tuple(Path(p) for p in paths) for paths in inputs], skip_bad, names, whole)
