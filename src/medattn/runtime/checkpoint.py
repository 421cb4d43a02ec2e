"""Checkpoints in safe formats, written atomically; loading never executes code.

A checkpoint is a folder:

* ``model.safetensors``: the model's weights;
* ``checkpoint.json``: the resolved run config, the task (:class:`~medattn.data.base.TaskInfo`), the
  epoch and the validation AUROC;
* training checkpoints only: ``training_state.safetensors`` (optimizer moments, torch/CUDA/numpy RNG
  states) and ``training_state.json`` (optimizer hyper-parameters, step, epoch, best score, Python's
  RNG state).

A folder is written under a temporary name (``.<name>.tmp-<pid>``) and renamed into place, so a run
killed while writing leaves the previous checkpoint intact (a crash between the two renames leaves it
as ``<name>.old``, which :func:`resolve` falls back to); :func:`clean_stale` tidies both up.

Loading trusts nothing in the folder: ``checkpoint.json`` is checked against a schema with bounded
sizes (:func:`load_meta`), and the tensor names and shapes in the safetensors header are compared with
the model's before any weight is read (:func:`check_shapes`), so a mismatch is one line naming the
first differing tensor and a hostile file cannot make the loader allocate more than the file holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from medattn.config import validate, with_defaults
from medattn.data.base import INPUT_KINDS, TASK_TYPES, TaskInfo, task_problem
from medattn.errors import UserError, writing

from .checkpoint_compat import keep_design
from .checkpoint_fields import check_fields

MODEL_FILE = "model.safetensors"
META_FILE = "checkpoint.json"
STATE_TENSORS = "training_state.safetensors"
STATE_JSON = "training_state.json"
STALE_TMP = re.compile(r"^\..+\.tmp-\d+$")  # what atomic_dir writes into before the rename
MAX_SIZE = 1 << 16  # largest integer checkpoint.json may give a size (input side, width, class count)
MAX_COUNT = 1 << 10  # largest repeat count (depth, blocks, heads) and list length in model.kwargs
COUNT_KEYS = ("depth", "num_blocks", "num_heads")


@contextlib.contextmanager
def atomic_dir(path: Path):
    """Yield a temporary folder; on success it replaces ``path`` by rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    old = path.with_name(f"{path.name}.old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def resolve(path: str | Path) -> Path:
    """The checkpoint folder for a run folder (its best checkpoint), a checkpoint folder or its weights file."""
    path = Path(path)
    candidates = [path.parent] if path.name == MODEL_FILE else [path, path / "checkpoints" / "best"]
    for candidate in candidates:
        for folder in (candidate, candidate.with_name(f"{candidate.name}.old")):
            if (folder / MODEL_FILE).is_file() and (folder / META_FILE).is_file():
                return folder
    raise UserError(f"no checkpoint found at {path} (expected a run folder or a folder with {MODEL_FILE} and "
                    f"{META_FILE})")


def is_plain_weights(path: str | Path) -> bool:
    """Whether ``path`` is a weights file that is not part of a medattn checkpoint (no checkpoint.json beside
    it), e.g. timm, DINO, MAE or MONAI weights for :func:`medattn.models.pretrained.load_pretrained`."""
    path = Path(path)
    return path.is_file() and not (path.name == MODEL_FILE and (path.parent / META_FILE).is_file())


def task_to_dict(task: TaskInfo) -> dict:
    return {**dataclasses.asdict(task), "input_shape": list(task.input_shape)}


def task_from_dict(data: dict) -> TaskInfo:
    return TaskInfo(**{**data, "input_shape": tuple(data["input_shape"])})


def save(path: Path, model: nn.Module, meta: dict, optimizer: torch.optim.Optimizer | None = None,
         state: dict | None = None, extra_tensors: dict[str, torch.Tensor] | None = None) -> None:
    """Write a checkpoint folder atomically; ``meta`` must hold ``config`` and ``task`` (JSON-able).
    ``extra_tensors`` (e.g. the EMA weights, ``ema.*``) join the training state (:func:`load_extra_tensors`).
    An OSError (disk full, read-only) becomes a UserError naming ``path``; the previous checkpoint stays."""
    with writing(path), atomic_dir(path) as tmp:
        _save_tensors({k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}, tmp / MODEL_FILE,
                      path)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1))
        if optimizer is not None:
            tensors, extra = _training_state(optimizer)
            tensors.update({k: v.detach().contiguous().cpu() for k, v in (extra_tensors or {}).items()})
            _save_tensors(tensors, tmp / STATE_TENSORS, path)
            (tmp / STATE_JSON).write_text(json.dumps({**extra, **(state or {})}))


def _save_tensors(tensors: dict[str, torch.Tensor], file: Path, checkpoint_path: Path) -> None:
    """``save_file``, whose I/O failures (a full disk, a file-size limit) arrive as safetensors' own error type:
    one-line UserError naming the checkpoint (the temporary folder is removed by :func:`atomic_dir`)."""
    try:
        save_file(tensors, file)
    except OSError:
        raise
    except Exception as error:  # safetensors.SafetensorError: "Error while serializing: I/O error: ..."
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(f"cannot write {checkpoint_path}: {reason.split('I/O error: ')[-1]}") from None


def clean_stale(folder: Path) -> None:
    """Tidy a checkpoints folder after a killed run (call it holding the run's lock): remove the
    ``.<name>.tmp-<pid>`` folders of unfinished saves, and settle each ``<name>.old`` (deleted when
    ``<name>`` exists, else renamed back to it)."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    for entry in sorted(folder.iterdir()):
        if entry.is_dir() and STALE_TMP.match(entry.name):
            shutil.rmtree(entry)
        elif entry.is_dir() and entry.name.endswith(".old"):
            live = entry.with_name(entry.name[: -len(".old")])
            if live.exists():
                shutil.rmtree(entry)
            else:
                os.replace(entry, live)


def load_meta(folder: Path) -> dict:
    """``checkpoint.json``, checked by :func:`check_meta`; a one-line UserError naming the file otherwise."""
    path = Path(folder) / META_FILE
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UserError(f"{path}: unreadable checkpoint metadata ({error})") from None
    if isinstance(meta, dict) and isinstance(meta.get("config"), dict) and "diffusion" not in meta:
        # keys added since it was saved: defaults
        meta["config"] = with_defaults(meta["config"], f"{path}: config")
    check_meta(meta, str(path))
    keep_design(meta, lambda: header_shapes(folder))  # an older checkpoint keeps the design its weights show
    return meta


def model_config(meta: dict) -> dict:
    """The model config a checkpoint builds: ``config.model`` with the preset values recorded at training time
    (``model_defaults``) for the keys it left to them, so a preset whose default changed since builds as it was."""
    model = meta["config"]["model"]
    return {**model, "kwargs": {**meta.get("model_defaults", {}), **model["kwargs"]}}


def check_meta(meta, source: str) -> None:
    """The schema of ``checkpoint.json``: a mapping with ``config`` (a valid run config whose integers in
    ``model.kwargs`` are bounded), ``task`` (a :class:`TaskInfo` with bounded sizes) and perhaps ``model_defaults``
    (the preset's design values the config left to it, ``{"stem": "residual", "init_values": 1e-05, ...}``: applied on
    load, so a checkpoint keeps its design when a preset's default changes later) and perhaps ``features`` (what
    made a bag model's training features: :mod:`medattn.data.provenance`); every other field by
    :func:`medattn.runtime.checkpoint_fields.check_fields`."""
    if isinstance(meta, dict) and "diffusion" in meta:
        raise UserError(f"{source}: a diffusion checkpoint (3D inpainting): eval, predict, explain and export take "
                        f"classification and segmentation models; use medattn inpaint")
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict) or not isinstance(meta.get("task"),
                                                                                                dict):
        raise UserError(f"{source}: a checkpoint's metadata must be a mapping with 'config' and 'task' mappings")
    validate(meta["config"], f"{source}: config")
    _check_bounded(meta["config"]["model"]["kwargs"], f"{source}: config.model.kwargs", None)
    recorded = meta.get("model_defaults", {})
    if not isinstance(recorded, dict) or not all(
            isinstance(key, str) and key.isidentifier() and isinstance(value, (str, bool, int, float))
            and (not isinstance(value, float) or math.isfinite(value)) for key, value in recorded.items()):
        raise UserError(f"{source}: model_defaults must map model argument names to strings, booleans or finite "
                        f"numbers")
    if "features" in meta:  # optional: older checkpoints and non-bag ones record none
        from medattn.data.provenance import check_recorded

        check_recorded(meta["features"], source)
    task = meta["task"]
    fields = {f.name for f in dataclasses.fields(TaskInfo)}
    problems = {
        "task_type": task.get("task_type") in TASK_TYPES,
        "input_kind": task.get("input_kind") in INPUT_KINDS,
        "num_outputs": _is_size(task.get("num_outputs")),
        "input_shape": isinstance(task.get("input_shape"), list) and 1 <= len(task["input_shape"]) <= 4
        and all(_is_size(v) for v in task["input_shape"]),
        "class_names": isinstance(task.get("class_names", []), list) and len(task.get("class_names", [])) <= MAX_SIZE
        and all(isinstance(v, str) for v in task.get("class_names", [])),
        "synthetic": isinstance(task.get("synthetic", False), bool),
        "target_std": _numbers(task.get("target_std", [])) and all(v > 0 for v in task.get("target_std", []))
        and len(task.get("target_std", [])) in (0, task.get("num_outputs")),
        "target_mean": _numbers(task.get("target_mean", [])) and len(task.get("target_mean", []))
        == len(task.get("target_std", [])),
        "unknown keys": set(task) <= fields,
    }
    bad = next((key for key, ok in problems.items() if not ok), None)
    if bad == "unknown keys":
        raise UserError(f"{source}: task has unknown keys {sorted(set(task) - fields)}")
    if bad is not None:
        raise UserError(f"{source}: task.{bad} is missing or invalid (got {task.get(bad)!r}); sizes are integers "
                        f"from 1 to {MAX_SIZE}")
    contradiction = task_problem(task["task_type"], task["num_outputs"], task.get("class_names", []))
    if contradiction:
        raise UserError(f"{source}: the task contradicts itself ({contradiction}): the file was edited or damaged")
    check_fields(meta, source)  # epoch, val_<metric>, threshold, preprocessing, pretrained; no other key


def _numbers(value) -> bool:
    """A list of finite real numbers (a regression task's target statistics)."""
    return isinstance(value, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                           and math.isfinite(v) for v in value)


def _is_size(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_SIZE


def _check_bounded(value, where: str, key: str | None) -> None:
    """Integers within +-MAX_SIZE (+-MAX_COUNT for repeat counts), lists of at most MAX_COUNT items."""
    limit = MAX_COUNT if key in COUNT_KEYS else MAX_SIZE
    if isinstance(value, dict):
        for name, item in value.items():
            _check_bounded(item, f"{where}.{name}", name)
    elif isinstance(value, list):
        if len(value) > MAX_COUNT:
            raise UserError(f"{where}: a list of {len(value)} items (at most {MAX_COUNT})")
        for item in value:
            _check_bounded(item, where, key)
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > limit:
        raise UserError(f"{where} is {value}, more than a checkpoint may ask for ({limit})")


def header_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from the safetensors header, without reading any weight."""
    path = Path(folder) / MODEL_FILE
    try:
        with safe_open(path, "pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
    except Exception as error:  # safetensors raises its own error types for corrupt files
        raise UserError(f"{path}: unreadable weights ({error})") from None


def check_shapes(folder: Path, model: nn.Module) -> None:
    """The weights file holds exactly ``model``'s tensors with its shapes (the model may be on the meta
    device); a UserError names the first tensor that is missing, unexpected or of another shape."""
    path = Path(folder) / MODEL_FILE
    stored = header_shapes(folder)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    for name, shape in expected.items():
        if name not in stored:
            raise UserError(f"{path}: the model's tensor {name} {list(shape)} is missing (the checkpoint holds "
                            f"{len(stored)} tensors, the model {len(expected)})")
        if stored[name] != shape:
            raise UserError(f"{path}: tensor {name} has shape {list(stored[name])}, the model expects {list(shape)}")
    unexpected = [name for name in stored if name not in expected]
    if unexpected:
        raise UserError(f"{path}: tensor {unexpected[0]} is not part of the model ({len(unexpected)} unexpected)")


def load_weights(folder: Path, names: list[str] | None = None) -> dict[str, torch.Tensor]:
    """The tensors of the weights file (only ``names`` when given)."""
    path = Path(folder) / MODEL_FILE
    try:
        if names is None:
            return load_file(path)
        with safe_open(path, "pt") as f:
            return {name: f.get_tensor(name) for name in names}
    except Exception as error:  # safetensors raises its own error types for corrupt files
        raise UserError(f"{path}: unreadable weights ({error})") from None


def load_model(folder: Path, model: nn.Module) -> None:
    """Load weights that must match ``model`` exactly (names and shapes checked before reading)."""
    check_shapes(folder, model)
    model.load_state_dict(load_weights(folder))


def init_from(model: nn.Module, folder: Path) -> tuple[list[str], list[str]]:
    """Copy every tensor whose name and shape ``model`` shares with the checkpoint (any mechanism).

    Returns (new, unused): the model's tensors that kept their fresh initialisation, and the
    checkpoint's tensors the model has no place for. This is :func:`medattn.models.convert_attention`'s
    rule (shared ``qkv``/``proj`` layout) applied to a whole state dict. The metadata must be valid and
    at least one tensor shared; only shared tensors are read.
    """
    load_meta(folder)
    stored = header_shapes(folder)
    own = model.state_dict()
    shared = [k for k, shape in stored.items() if k in own and tuple(own[k].shape) == shape]
    if not shared:
        raise UserError(f"{Path(folder) / MODEL_FILE}: shares no tensor (name and shape) with the model; "
                        f"--init-from needs a checkpoint of the same architecture")
    model.load_state_dict(load_weights(folder, shared), strict=False)
    new = [k for k in own if k not in shared]
    unused = [k for k in stored if k not in shared]
    return new, unused


def _training_state(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Split optimizer and RNG state into tensors (safetensors) and plain values (JSON)."""
    opt = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    plain_state: dict[str, dict] = {}
    for index, values in opt["state"].items():
        for key, value in values.items():
            if torch.is_tensor(value):
                tensors[f"optim.{index}.{key}"] = value.detach().contiguous().cpu()
            else:
                plain_state.setdefault(str(index), {})[key] = value
    tensors["rng.torch"] = torch.get_rng_state()
    if torch.cuda.is_available():
        for i, value in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = value
    np_state = np.random.get_state()
    tensors["rng.numpy"] = torch.from_numpy(np_state[1].astype(np.int64))
    py_state = random.getstate()
    extra = {
        "optimizer": {"param_groups": opt["param_groups"], "plain_state": plain_state},
        "rng": {"numpy": [np_state[0], *map(_plain, np_state[2:])], "python": [py_state[0], list(py_state[1]),
                                                                           py_state[2]]},
    }
    return tensors, extra


def _plain(value):
    return value.item() if hasattr(value, "item") else value


def load_training_state(folder: Path, optimizer: torch.optim.Optimizer) -> dict:
    """Restore the optimizer and RNG states saved by :func:`save`; returns the JSON state (epoch, step, ...).
    A state that does not fit ``optimizer`` (or is malformed) is a UserError naming the folder."""
    folder = Path(folder)
    try:
        tensors = load_file(folder / STATE_TENSORS)
        extra = json.loads((folder / STATE_JSON).read_text())
    except Exception as error:
        raise UserError(f"{folder}: unreadable training state ({error})") from None
    try:
        _restore(tensors, extra, optimizer)
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as error:
        raise UserError(f"{folder / STATE_JSON}: training state does not fit this run ({type(error).__name__}: "
                        f"{error})") from None
    return extra


def load_extra_tensors(folder: Path, prefix: str) -> dict[str, torch.Tensor]:
    """The training state's tensors whose names start with ``prefix`` (saved as ``extra_tensors``)."""
    try:
        with safe_open(Path(folder) / STATE_TENSORS, framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys() if k.startswith(prefix)}
    except Exception as error:
        raise UserError(f"{folder}: unreadable training state ({error})") from None


def _restore(tensors: dict[str, torch.Tensor], extra: dict, optimizer: torch.optim.Optimizer) -> None:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        if name.startswith("optim."):
            _, index, key = name.split(".", 2)
            expected = params[int(index)].shape
            if value.ndim and value.shape != expected:
                raise ValueError(f"{name} has shape {list(value.shape)}, the parameter {list(expected)}")
            state.setdefault(int(index), {})[key] = value
    for index, values in extra["optimizer"]["plain_state"].items():
        state.setdefault(int(index), {}).update(values)
    optimizer.load_state_dict({"state": state, "param_groups": extra["optimizer"]["param_groups"]})
    torch.set_rng_state(tensors["rng.torch"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("rng.cuda.")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    name, *rest = extra["rng"]["numpy"]
    np.random.set_state((name, tensors["rng.numpy"].numpy().astype(np.uint32), *rest))
    version, internal, gauss = extra["rng"]["python"]
    random.setstate((version, tuple(internal), gauss))
