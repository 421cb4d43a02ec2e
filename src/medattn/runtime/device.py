"""The device and numeric precision a model runs at: checked device names and the autocast of ``train.precision``."""

from __future__ import annotations

import contextlib
import os

import torch

from medattn.errors import UserError

from . import distributed


def check_device(name: str) -> None:
    """``train.device`` names a device this machine has (CUDA/MPS present, the CUDA index in range)."""
    if name.startswith("cuda"):
        index = int(name.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise UserError(f"train.device={name}: this machine has {torch.cuda.device_count()} CUDA device(s); "
                            f"use train.device=auto or cpu")
    elif name == "mps" and not torch.backends.mps.is_available():
        raise UserError("train.device=mps: MPS is not available on this machine; use train.device=auto or cpu")


def open_device(name: str) -> torch.device:
    """The checked device ``name`` (``auto``: CUDA when present, else CPU), joining torchrun's process group."""
    check_device(name)
    return distributed.setup(name)


def resolve_device(name: str, option: str = "--device") -> torch.device:
    """A process's device without joining a process group (each process works alone, as ``wsi extract``'s shards):
    ``auto`` -> ``cuda:LOCAL_RANK`` when a GPU exists (one per torchrun process), else cpu; UserError naming
    ``option`` for a name torch does not know."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        return torch.device("cpu")
    try:
        return torch.device(name)
    except RuntimeError as error:
        raise UserError(f"{option} {name!r}: {error}") from None


def autocast(device: torch.device, precision: str):
    """bf16 autocast on ``device`` for ``precision == "bf16"``, else no change (fp32)."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
