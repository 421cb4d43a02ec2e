"""Shared benchmark plumbing: timing, the record of the machine, and CSV/JSON output.

Every benchmark reports medians over repeats and records the environment (machine, its bf16 support,
threads, load average, allocator, precision, versions) next to its figures, so a number is never quoted
without them.
"""

from __future__ import annotations

import datetime
import gc
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from medattn import allocator
from medattn.runtime.outputs import OutputFolder


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


def median_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1, budget_s: float | None = None) -> float:
    """Median wall time of ``fn()`` in seconds over ``repeats`` runs after ``warmup`` runs.

    With ``budget_s``, stops repeating once the runs so far took longer than the budget (at least one
    timed run always happens). CUDA work is synchronised before each clock read.
    """
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn()
    times: list[float] = []
    started = time.perf_counter()
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
        if budget_s is not None and time.perf_counter() - started > budget_s:
            break
    return statistics.median(times)


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far, in bytes.

    Read from ``VmHWM`` in ``/proc/self/status`` where it exists: that is this process's own peak and
    :func:`reset_peak_rss` can lower it. ``getrusage``'s ``ru_maxrss`` (the fallback, KiB on Linux) also
    keeps the RSS of the parent a process was forked from before it exec-ed, so a small benchmark
    process started by a large one would report the parent's size.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def add_device_options(parser) -> None:
    """``--device``, ``--threads`` and ``--no-isolate`` of the benches that time a model on one device
    (``bench attention``, ``bench scaling``); :func:`run_device` applies the first two."""
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="where to run (default: cuda when available, else cpu)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--no-isolate", action="store_true",
                        help="run every configuration in this process (faster, memory figures less clean)")


def run_device(args) -> str:
    """The device of :func:`add_device_options` (cuda when available unless given), after setting the torch threads
    (``args.threads`` becomes the count set, so isolated runs get the same)."""
    from medattn.threads import set_threads

    args.threads = set_threads(args.threads)
    return args.device or default_device()


def add_overwrite(parser) -> None:
    """A bench's ``--overwrite``: without it, results already in ``--out`` are refused before anything is measured
    (:func:`results_folder`)."""
    parser.add_argument("--overwrite", action="store_true", help="replace the results of an earlier run in --out")


def results_folder(out_dir: str | Path, stems: list[str], overwrite: bool = False,
                   names: tuple[str, ...] = ()) -> OutputFolder:
    """The bench's output folder (:class:`~medattn.runtime.outputs.OutputFolder`), every result (``stem.csv`` and
    ``stem.json`` of each of ``stems``, and ``names``) checked before anything is measured: one that exists is
    refused unless ``overwrite``."""
    out = OutputFolder(out_dir, overwrite=overwrite)
    for name in [*(f"{stem}.{suffix}" for stem in stems for suffix in ("csv", "json")), *names]:
        out.path(name)
    return out


def write_results(rows: list[dict], out_dir: str | Path | OutputFolder, stem: str, env: dict) -> tuple[Path, Path]:
    """Write ``rows`` as ``stem.csv`` and ``{"environment": env, "results": rows}`` as ``stem.json``, each
    atomically. ``out_dir``: the bench's :func:`results_folder` (which refused results it did not write), or a plain
    folder (a script's: earlier results there are replaced)."""
    out = out_dir if isinstance(out_dir, OutputFolder) else OutputFolder(out_dir, overwrite=True)
    fields = list(dict.fromkeys(key for row in rows for key in row))
    csv_path = out.save_dicts(f"{stem}.csv", rows, fields)
    json_path = out.save_json(f"{stem}.json", {"environment": env, "results": rows}, indent=2)
    return csv_path, json_path


def current_rss_bytes(pid: int | None = None) -> int:
    """Resident set size now, in bytes, of this process or of process ``pid`` (Linux ``/proc``).

    Where ``/proc`` is unreadable: this process's peak so far, or 0 for another process.
    """
    try:
        for line in Path(f"/proc/{pid or 'self'}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0 if pid else peak_rss_bytes()


def reset_peak_rss() -> bool:
    """Lower this process's peak RSS (what :func:`peak_rss_bytes` reads) to its current RSS.

    Uses Linux's ``/proc/self/clear_refs`` (kernel >= 4.0); returns False where that is unavailable,
    in which case the peak keeps counting from the start of the process.
    """
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def extrapolate(points: list[tuple[float, float]], x: float, default_exponent: float = 2.0,
                min_exponent: float = 1.0, max_exponent: float = 3.0) -> float | None:
    """Power-law prediction ``y(x)`` from measured ``(x, y)`` points (ascending x), for budget checks.

    The exponent comes from the last two points, clamped to ``[min_exponent, max_exponent]``; with one
    point it is ``default_exponent``; with none the answer is None.
    """
    if not points:
        return None
    x1, y1 = points[-1]
    exponent = default_exponent
    if len(points) > 1:
        x0, y0 = points[-2]
        if x1 > x0 and y0 > 0 and y1 > 0:
            exponent = math.log(y1 / y0) / math.log(x1 / x0)
    exponent = min(max(exponent, min_exponent), max_exponent)
    return y1 * (x / x1) ** exponent


_CHILD = (
    "import importlib, json, sys\n"
    "module, _, name = sys.argv[1].partition(':')\n"
    "kwargs = json.loads(open(sys.argv[2]).read())\n"
    "result = getattr(importlib.import_module(module), name)(**kwargs)\n"
    "open(sys.argv[3], 'w').write(json.dumps(result))\n"
)


def run_isolated(target: str, kwargs: dict, timeout_s: float, memory_limit_bytes: int | None = None,
                 poll_s: float = 0.05) -> dict:
    """Call ``module:function(**kwargs)`` in a fresh Python process and return its JSON-able dict.

    The parent polls the child's RSS: past ``memory_limit_bytes`` it kills the child and returns
    ``{"status": "skipped: over memory budget ..."}``; past ``timeout_s`` seconds likewise with
    ``"skipped: over time budget ..."``. A crash returns ``{"status": "failed: ..."}`` with the last
    line of the child's stderr. The child inherits the environment (threads, ``LD_PRELOAD``).
    """
    with tempfile.TemporaryDirectory(prefix="medattn-bench-") as tmp:
        in_path, out_path, err_path = (Path(tmp) / name for name in ("in.json", "out.json", "err.txt"))
        in_path.write_text(json.dumps(kwargs))
        with err_path.open("w") as err:
            child = subprocess.Popen([sys.executable, "-c", _CHILD, target, str(in_path), str(out_path)],
                                     stdout=subprocess.DEVNULL, stderr=err)
            started = time.perf_counter()
            status = None
            while child.poll() is None:
                rss = current_rss_bytes(child.pid)
                if memory_limit_bytes is not None and rss > memory_limit_bytes:
                    status = f"skipped: over memory budget (killed at {rss / 2**30:.2f} GiB RSS)"
                elif time.perf_counter() - started > timeout_s:
                    status = f"skipped: over time budget (killed after {timeout_s:.0f} s)"
                if status is not None:
                    child.kill()
                    child.wait()
                    return {"status": status}
                time.sleep(poll_s)
        if child.returncode != 0:
            lines = err_path.read_text().strip().splitlines()
            return {"status": f"failed: exit {child.returncode}: {lines[-1] if lines else 'no message'}"}
        return json.loads(out_path.read_text())


def run_in_process(measure: Callable[..., dict], kwargs: dict) -> dict:
    """``measure(**kwargs)`` in this process; an exception becomes ``{"status": "failed: ..."}``, as a
    crash does in :func:`run_isolated`, so one broken configuration does not stop a benchmark."""
    try:
        return measure(**kwargs)
    except Exception as error:
        return {"status": f"failed: {type(error).__name__}: {error}"}


#: The environment fields copied into every result row.
ROW_ENV_KEYS = ("machine", "processor", "cpu_bf16", "torch_threads", "allocator", "torch", "device", "device_name")


def row_environment(env: dict) -> dict:
    """The fields of :func:`environment` that every result row carries (:data:`ROW_ENV_KEYS`)."""
    return {key: env[key] for key in ROW_ENV_KEYS}


def reset_peak_memory(device: str) -> None:
    """Collect garbage and restart peak-memory tracking: CUDA's allocator peak, or this process's peak RSS."""
    gc.collect()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    else:
        reset_peak_rss()


def peak_memory_bytes(device: str, baseline: int = 0) -> int:
    """Peak since :func:`reset_peak_memory`: ``torch.cuda.max_memory_allocated`` or peak RSS minus ``baseline``."""
    if device == "cuda":
        return torch.cuda.max_memory_allocated()
    return max(peak_rss_bytes() - baseline, 0)


def comma_list(text: str) -> list[str]:
    """``"a, b"`` -> ``["a", "b"]``: the argparse type of comma-separated options."""
    return [item.strip() for item in text.split(",") if item.strip()]
