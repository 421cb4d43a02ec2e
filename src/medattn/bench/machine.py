"""The record of the machine a bench ran on: CPU model, torch's CPU capability, bf16 hardware, threads, load,
allocator, precision, versions and the device (:func:`environment`), and the fields of it every result row carries.

Re-exported by :mod:`medattn.bench.common`, the benches' one import.
"""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path

import torch

from medattn import allocator


def environment(precision: str = "fp32", device: str | None = None) -> dict:
    """Machine, threads, allocator, precision and versions, for the header of every result file.

    ``cpu_bf16`` says whether the CPU multiplies bf16 in hardware (see :func:`cpu_bf16_support`) and
    ``load_average_1min`` how busy the machine was when the benchmark started (other processes' work
    slows every timing; ratios within one run are what counts). ``device``: where the bench ran (``cpu``, ``cuda``,
    ``cuda:N``; None: :func:`default_device`), recorded with the name of its hardware (``device_name``,
    :func:`device_name`: the GPU's on CUDA), which the plot titles show.
    """
    bf16 = cpu_bf16_support()
    device = device or default_device()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": platform.machine(),
        "processor": _cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_bf16": bf16.describe(),
        "cpu_count": os.cpu_count(),
        "load_average_1min": _load_average(),
        "torch_threads": torch.get_num_threads(),
        "allocator": allocator.describe(),
        "precision": precision,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": device,
        "device_name": device_name(device),
    }


def default_device() -> str:
    """Where a bench runs unless told: ``cuda`` when available, else ``cpu``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def device_name(device: str) -> str:
    """The hardware ``device`` names, for a result's record and its plot titles: the GPU's name
    (``torch.cuda.get_device_name``) for ``cuda`` / ``cuda:N``, else the CPU's model name."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    return _cpu_model()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


#: /proc/cpuinfo flags of bf16 arithmetic in hardware: x86 AVX-512 BF16 and AMX-BF16, Arm's BF16 extension.
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


class Bf16Support:
    """Whether this CPU computes in bf16 in hardware: ``supported`` and the ``flags`` that say so."""

    def __init__(self, flags: tuple[str, ...], cpu_capability: str) -> None:
        self.flags, self.cpu_capability = flags, cpu_capability
        self.supported = bool(flags)

    def describe(self) -> str:
        """``"yes (avx512_bf16, amx_bf16)"`` or ``"no (...)"``, for the machine record."""
        if self.supported:
            return f"yes ({', '.join(self.flags)})"
        return f"no (no {' / '.join(BF16_FLAGS[:2])} flag; torch CPU capability {self.cpu_capability})"

    def unsupported_reason(self) -> str | None:
        """None where bf16 runs in hardware, else the line a benchmark prints instead of timing bf16."""
        if self.supported:
            return None
        return (f"bf16: not supported on this CPU ({_cpu_model()}: {self.describe()}); bf16 here would be an "
                "emulation, so it is not timed")


def cpu_bf16_support(cpuinfo: str | None = None) -> Bf16Support:
    """Detect bf16 hardware from the CPU flags (``/proc/cpuinfo``, or the text ``cpuinfo``).

    x86: ``avx512_bf16`` (AVX-512 BF16 dot products) or ``amx_bf16`` (AMX tiles); Arm: ``bf16`` in
    ``Features``. ``torch.backends.cpu.get_cpu_capability()`` (e.g. ``AVX2``, ``AVX512``, ``AMX``...) is
    recorded beside it. Without a readable ``/proc/cpuinfo`` (not Linux) the answer is "no flags found".
    """
    capability = torch.backends.cpu.get_cpu_capability()
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return Bf16Support(tuple(flag for flag in BF16_FLAGS if flag in flags), capability)


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


#: The environment fields copied into every result row.
ROW_ENV_KEYS = ("machine", "processor", "cpu_bf16", "torch_threads", "allocator", "torch", "device", "device_name")


def row_environment(env: dict) -> dict:
    """The fields of :func:`environment` that every result row carries (:data:`ROW_ENV_KEYS`)."""
    return {key: env[key] for key in ROW_ENV_KEYS}
