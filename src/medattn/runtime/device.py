"""The device and numeric precision a model runs at: checked device names, the device a trained model runs on
(:func:`inference_device`: ``train.device`` is recorded in a checkpoint, not obeyed), bf16 hardware
(:func:`bf16_in_hardware`) and the autocast of ``train.precision``."""

from __future__ import annotations

import contextlib
import logging
import os

import torch

from medattn.config.keys import DEVICE_PATTERN
from medattn.errors import UserError

from . import distributed

log = logging.getLogger("medattn.runtime")


def check_device(name: str, option: str = "train.device") -> None:
    """``name`` names a device this machine has (CUDA/MPS present, the CUDA index in range); else a one-line
    UserError naming ``option`` (``train.device``, or a command's ``--device``)."""
    if DEVICE_PATTERN.fullmatch(name) is None:
        raise UserError(f"{option}={name}: not a device; use auto, cpu, mps, cuda or cuda:N")
    if name.startswith("cuda"):
        index = int(name.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise UserError(f"{option}={name}: this machine has {torch.cuda.device_count()} CUDA device(s); "
                            f"use {option}=auto or cpu")
    elif name == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"{option}=mps: MPS is not available on this machine; use {option}=auto or cpu")


def open_device(name: str, option: str = "train.device") -> torch.device:
    """The checked device ``name`` (``auto``: CUDA when present, else CPU), joining torchrun's process group."""
    check_device(name, option)
    return distributed.setup(name)


def best_device() -> str:
    """What ``auto`` runs a trained model on: ``cuda`` when a GPU is present, else ``mps``, else ``cpu``."""
    if torch.cuda.is_available():
        return "cuda"
    return "mps" if torch.backends.mps.is_available() else "cpu"


def inference_device(name: str = "auto", option: str = "--device") -> torch.device:
    """The device eval, predict and explain run a trained model on: ``name`` as ``train.device`` names devices,
    ``auto`` the best this machine has (:func:`best_device`), whatever device the model was trained on; a device
    this machine lacks is a one-line UserError naming ``option``. Joins torchrun's process group as
    :func:`open_device` does (eval's ranks)."""
    return open_device(best_device() if name == "auto" else name, option)


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


def bf16_in_hardware(device: torch.device) -> bool:
    """Whether ``device`` computes in bf16 in hardware: a CUDA GPU that supports it without emulation (compute
    capability 8.0 and later), a CPU with AVX-512 BF16 or AMX tiles. Elsewhere (other CPUs, MPS) bf16 would be
    emulated: many times slower than fp32."""
    if device.type == "cuda":
        with torch.cuda.device(device):
            return torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return False


def inference_precision(precision: str, device: torch.device) -> str:
    """The precision a model trained at ``precision`` (``train.precision``) runs at on ``device``: bf16 where the
    device computes it in hardware (:func:`bf16_in_hardware`), else fp32, said in one log line (fp32 is at least
    as exact, and emulated bf16 would crawl)."""
    if precision == "bf16" and not bf16_in_hardware(device):
        lacks = {"cpu": "this CPU has no AVX-512 BF16 or AMX",
                 "cuda": "this GPU has no bf16 units (compute capability below 8.0)"}.get(device.type,
                                                                                     f"{device.type} emulates bf16")
        log.warning("the model was trained with train.precision=bf16, but %s: it runs in fp32", lacks)
        return "fp32"
    return precision


def autocast(device: torch.device, precision: str):
    """bf16 autocast on ``device`` for ``precision == "bf16"``, else no change (fp32)."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
