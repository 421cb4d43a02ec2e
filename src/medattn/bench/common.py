"""The one bench harness: every bench of ``cli.BENCHES`` measures through this module.

* timing: :func:`interleaved_rounds` (medians over rounds that call every measured callable once each, so a change
  of the machine's load falls on all alike), :func:`median_time` and :func:`interleaved_medians` its short forms;
* memory: :func:`peak_rss_bytes`, :func:`current_rss_bytes` and :func:`reset_peak_rss` (Linux ``/proc``), or CUDA's
  allocator peak (:func:`reset_peak_memory`, :func:`peak_memory_bytes`);
* isolation: :func:`run_isolated` runs a measurement in a fresh Python process (a function and its keyword
  arguments, as data), with a time and a memory budget; :func:`run_in_process` the same in this process;
* sweeps: :func:`skip_reason` (why a larger size is not measured, from :func:`extrapolate`);
* results: ``--overwrite``, the refused results folder, CSV/JSON written with the record of the machine
  (:func:`environment`, from :mod:`medattn.bench.machine`), so a number is never quoted without it.

``tests/bench/test_one_harness.py`` fails on a bench that starts processes, reads ``/proc`` or takes medians itself.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from medattn.outputs import OutputFolder

from .machine import BF16_FLAGS as BF16_FLAGS
from .machine import ROW_ENV_KEYS as ROW_ENV_KEYS
from .machine import Bf16Support as Bf16Support
from .machine import cpu_bf16_support as cpu_bf16_support
from .machine import default_device
from .machine import device_name as device_name
from .machine import environment as environment
from .machine import row_environment as row_environment


class Rounds:
    """What :func:`interleaved_rounds` measured: per callable the wall ``seconds`` and process ``cpu_seconds``
    (``time.process_time``: user + system of every thread) of each timed call, per probe the ``values`` it returned,
    and the callables that raised (``failed``: name -> exception, with ``catch``)."""

    def __init__(self, names, probes) -> None:
        self.seconds: dict = {name: [] for name in names}
        self.cpu_seconds: dict = {name: [] for name in names}
        self.values: dict = {name: [] for name in probes}
        self.failed: dict = {}

    def medians(self) -> dict:
        """Median wall seconds of each callable that ran and did not fail."""
        return {name: statistics.median(times) for name, times in self.seconds.items()
                if times and name not in self.failed}

    def value_medians(self) -> dict:
        """Median of the values each probe returned."""
        return {name: statistics.median(values) for name, values in self.values.items() if values}

    def mean_cpu_seconds(self, name) -> float:
        """CPU seconds per timed call of ``name``."""
        return statistics.fmean(self.cpu_seconds[name])


def _attempt(rounds: Rounds, name, fn: Callable[[], object], catch: bool) -> bool:
    """``fn()``; with ``catch`` an exception is recorded in ``rounds.failed`` (-> False) instead of raised."""
    try:
        fn()
    except Exception as error:
        if not catch:
            raise
        rounds.failed[name] = error
        return False
    return True


def interleaved_rounds(fns: dict, repeats: int, warmup: int = 1, budget_s: float | None = None,
                       probes: dict | None = None, catch: bool = False) -> Rounds:
    """The one timer of the benches: the callables ``fns`` (name -> zero-argument callable) timed in rounds.

    Each round calls every callable once, in order, then every probe of ``probes`` (name -> callable returning a figure
    it measured itself, such as a matmul rate, recorded as is), so a change of the machine's load falls on all of them
    alike and their ratios hold. ``warmup`` untimed rounds first; then ``repeats`` timed rounds, fewer once they took
    longer than ``budget_s`` (at least one). CUDA work is synchronised before each clock read once CUDA is in use.
    With ``catch`` a callable that raises is recorded in :attr:`Rounds.failed` and left out of the later rounds;
    without, the exception propagates.
    """
    probes = probes or {}
    rounds = Rounds(fns, probes)
    for _ in range(warmup):
        for name, fn in fns.items():
            if name not in rounds.failed:
                _attempt(rounds, name, fn, catch)
        for probe in probes.values():
            probe()
    sync = torch.cuda.synchronize if torch.cuda.is_available() and torch.cuda.is_initialized() else (lambda: None)
    started = time.perf_counter()
    for _ in range(repeats):
        for name, fn in fns.items():
            if name in rounds.failed:
                continue
            sync()
            cpu_started, wall_started = time.process_time(), time.perf_counter()
            try:
                fn()
                sync()
            except Exception as error:
                if not catch:
                    raise
                rounds.failed[name] = error
                continue
            rounds.seconds[name].append(time.perf_counter() - wall_started)
            rounds.cpu_seconds[name].append(time.process_time() - cpu_started)
        for name, probe in probes.items():
            rounds.values[name].append(probe())
        if budget_s is not None and time.perf_counter() - started > budget_s:
            break
    return rounds


def interleaved_medians(fns: dict, repeats: int, budget_s: float | None = None, warmup: int = 1) -> dict:
    """Median wall seconds of each callable of ``fns``, timed in rounds (:func:`interleaved_rounds`)."""
    return interleaved_rounds(fns, repeats, warmup, budget_s).medians()


def median_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1, budget_s: float | None = None) -> float:
    """Median wall time of ``fn()`` in seconds over ``repeats`` runs after ``warmup`` runs (:func:`interleaved_rounds`
    of one callable: with ``budget_s``, no more runs once they took longer than that; at least one timed run)."""
    return interleaved_rounds({"fn": fn}, repeats, warmup, budget_s).medians()["fn"]


def _status_bytes(field: str, pid: int | None = None) -> int | None:
    """The one memory reader: ``field`` (``VmRSS``, ``VmHWM``) of ``/proc/<pid or self>/status`` in bytes; None where
    that is unreadable (not Linux)."""
    try:
        for line in Path(f"/proc/{pid or 'self'}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far, in bytes.

    Read from ``VmHWM`` in ``/proc/self/status`` where it exists: that is this process's own peak and
    :func:`reset_peak_rss` can lower it. ``getrusage``'s ``ru_maxrss`` (the fallback, KiB on Linux) also
    keeps the RSS of the parent a process was forked from before it exec-ed, so a small benchmark
    process started by a large one would report the parent's size.
    """
    peak = _status_bytes("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


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
    """The bench's output folder (:class:`~medattn.outputs.OutputFolder`), every result (``stem.csv`` and
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
    rss = _status_bytes("VmRSS", pid)
    if rss is not None:
        return rss
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


def skip_reason(size: float, times: list[tuple[float, float]], time_budget_s: float,
                memories: list[tuple[float, float]] = (), memory_budget_bytes: float | None = None,
                per: str = "") -> str | None:
    """Why a sweep (sizes ascending) skips its configuration of ``size``, as a ``"skipped: ..."`` status, or None to
    measure it. ``times`` / ``memories``: the (size, seconds) / (size, bytes) measured so far. Skipped: once the last
    measured took longer than ``time_budget_s``, or where :func:`extrapolate` predicts more than a budget (seconds
    with an exponent of 1 to 3, memory of 0 to 3). ``per``: what a predicted time is of (``" per step"``)."""
    if times and times[-1][1] > time_budget_s:
        return f"skipped: over time budget (N={times[-1][0]} took {times[-1][1]:.2f} s)"
    predicted = extrapolate(times, size)
    if predicted is not None and predicted > time_budget_s:
        return f"skipped: over time budget (predicted {predicted:.1f} s{per})"
    predicted = extrapolate(memories, size, default_exponent=0.0, min_exponent=0.0)
    if memory_budget_bytes is not None and predicted is not None and predicted > memory_budget_bytes:
        return f"skipped: over memory budget (predicted {predicted / 2**30:.1f} GiB)"
    return None


#: What precedes the result on a child's standard output (:func:`run_isolated`).
RESULT_MARK = "medattn-bench-result: "
#: The module whose ``python -m`` is the child of :func:`run_isolated` (this one: :func:`_child`).
CHILD_MODULE = "medattn.bench.common"


def run_isolated(target: str | Callable[..., object], kwargs: dict, timeout_s: float | None = None,
                 memory_limit_bytes: int | None = None, poll_s: float = 0.05, env: dict | None = None,
                 check: bool = False):
    """The one way a bench isolates a measurement: ``target(**kwargs)`` in a fresh Python process, its JSON-able
    result returned.

    ``target``: a function of an importable module, or its name ``"module:function"``. The child is
    ``python -m medattn.bench.common TARGET KWARGS_JSON`` (:func:`_child`): a function and its arguments as data,
    never Python source. It inherits this process's environment (threads, ``LD_PRELOAD``) updated with ``env``; its
    output comes back through pipes (no file is written). The parent polls the child's RSS: past
    ``memory_limit_bytes`` it kills the child and returns ``{"status": "skipped: over memory budget ..."}``; past
    ``timeout_s`` seconds likewise with ``"skipped: over time budget ..."``. A crash returns
    ``{"status": "failed: ..."}`` with the last line of the child's stderr. With ``check`` each of those raises a
    RuntimeError (with the end of the child's stderr) instead.
    """
    if callable(target):
        target = f"{target.__module__}:{target.__qualname__}"
    child = subprocess.Popen([sys.executable, "-m", CHILD_MODULE, target, json.dumps(kwargs)], text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **(env or {})})
    started, status = time.perf_counter(), None
    while True:
        try:
            out, errors = child.communicate(timeout=poll_s)
            break
        except subprocess.TimeoutExpired:
            status = status or _over_budget(child.pid, time.perf_counter() - started, timeout_s, memory_limit_bytes)
            if status is not None:
                child.kill()  # the next communicate() collects what it wrote
    if status is None and child.returncode != 0:
        lines = errors.strip().splitlines()
        status = f"failed: exit {child.returncode}: {lines[-1] if lines else 'no message'}"
    if status is not None and check:
        raise RuntimeError(f"{target}(**{kwargs}) in a fresh process: {status}\n{errors[-2000:]}")
    if status is not None:
        return {"status": status}
    results = [line for line in out.splitlines() if line.startswith(RESULT_MARK)]
    return json.loads(results[-1][len(RESULT_MARK):])


def _over_budget(pid: int, seconds: float, timeout_s: float | None, memory_limit_bytes: int | None) -> str | None:
    """The ``"skipped: ..."`` status of a child past its memory or time budget, else None."""
    rss = current_rss_bytes(pid)
    if memory_limit_bytes is not None and rss > memory_limit_bytes:
        return f"skipped: over memory budget (killed at {rss / 2**30:.2f} GiB RSS)"
    if timeout_s is not None and seconds > timeout_s:
        return f"skipped: over time budget (killed after {timeout_s:.0f} s)"
    return None


def _child(target: str, kwargs_json: str) -> None:
    """The child end of :func:`run_isolated`: ``module:function(**kwargs)``, whatever it prints sent to stderr, its
    result printed as JSON after :data:`RESULT_MARK`."""
    module, _, name = target.partition(":")
    function = importlib.import_module(module)
    for part in name.split("."):
        function = getattr(function, part)
    with contextlib.redirect_stdout(sys.stderr):
        result = function(**json.loads(kwargs_json))
    print(RESULT_MARK + json.dumps(result), flush=True)


def run_in_process(measure: Callable[..., dict], kwargs: dict) -> dict:
    """``measure(**kwargs)`` in this process; an exception becomes ``{"status": "failed: ..."}``, as a
    crash does in :func:`run_isolated`, so one broken configuration does not stop a benchmark."""
    try:
        return measure(**kwargs)
    except Exception as error:
        return {"status": f"failed: {type(error).__name__}: {error}"}


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


if __name__ == "__main__":  # the child of run_isolated
    _child(*sys.argv[1:])
