"""Checkpoints in safe formats, written atomically; loading never executes code.

A checkpoint is a folder:

* ``model.safetensors``: the model's weights;
* ``checkpoint.json``: the resolved run config, the task (:class:`~medattn.data.base.TaskInfo`), the
  epoch and the validation AUROC;
* training checkpoints only: ``training_state.safetensors`` (optimizer moments, torch/CUDA/numpy RNG
  states) and ``training_state.json`` (optimizer hyper-parameters, step, epoch, best score, Python's
  RNG state).

A folder is written under a temporary name and renamed into place, so a run killed while writing
leaves the previous checkpoint intact (a crash between the two renames leaves it as ``<name>.old``,
which :func:`resolve` falls back to).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from medattn.data.base import TaskInfo
from medattn.errors import UserError

MODEL_FILE = "model.safetensors"
META_FILE = "checkpoint.json"
STATE_TENSORS = "training_state.safetensors"
STATE_JSON = "training_state.json"


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


def task_to_dict(task: TaskInfo) -> dict:
    return {**dataclasses.asdict(task), "input_shape": list(task.input_shape)}


def task_from_dict(data: dict) -> TaskInfo:
    return TaskInfo(**{**data, "input_shape": tuple(data["input_shape"])})


def save(path: Path, model: nn.Module, meta: dict, optimizer: torch.optim.Optimizer | None = None,
         state: dict | None = None) -> None:
    """Write a checkpoint folder atomically; ``meta`` must hold ``config`` and ``task`` (JSON-able)."""
    with atomic_dir(path) as tmp:
        save_file({k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}, tmp / MODEL_FILE)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1))
        if optimizer is not None:
            tensors, extra = _training_state(optimizer)
            save_file(tensors, tmp / STATE_TENSORS)
            (tmp / STATE_JSON).write_text(json.dumps({**extra, **(state or {})}))


def load_meta(folder: Path) -> dict:
    try:
        return json.loads((Path(folder) / META_FILE).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise UserError(f"{Path(folder) / META_FILE}: unreadable checkpoint metadata ({error})") from None


def load_weights(folder: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(Path(folder) / MODEL_FILE)
    except Exception as error:  # safetensors raises its own error types for corrupt files
        raise UserError(f"{Path(folder) / MODEL_FILE}: unreadable weights ({error})") from None


def load_model(folder: Path, model: nn.Module) -> None:
    """Load weights that must match ``model`` exactly."""
    missing, unexpected = model.load_state_dict(load_weights(folder), strict=False)
    if missing or unexpected:
        raise UserError(f"{folder}: checkpoint does not match the model (missing {missing[:5]}, "
                        f"unexpected {unexpected[:5]})")


def init_from(model: nn.Module, folder: Path) -> tuple[list[str], list[str]]:
    """Copy every tensor whose name and shape ``model`` shares with the checkpoint (any mechanism).

    Returns (new, unused): the model's tensors that kept their fresh initialisation, and the
    checkpoint's tensors the model has no place for. This is :func:`medattn.models.convert_attention`'s
    rule (shared ``qkv``/``proj`` layout) applied to a whole state dict.
    """
    weights = load_weights(folder)
    own = model.state_dict()
    shared = {k: v for k, v in weights.items() if k in own and own[k].shape == v.shape}
    model.load_state_dict(shared, strict=False)
    new = [k for k in own if k not in shared]
    unused = [k for k in weights if k not in shared]
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
    """Restore the optimizer and RNG states saved by :func:`save`; returns the JSON state (epoch, step, ...)."""
    folder = Path(folder)
    try:
        tensors = load_file(folder / STATE_TENSORS)
        extra = json.loads((folder / STATE_JSON).read_text())
    except Exception as error:
        raise UserError(f"{folder}: unreadable training state ({error})") from None
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        if name.startswith("optim."):
            _, index, key = name.split(".", 2)
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
    return extra
