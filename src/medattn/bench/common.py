"""Shared benchmark plumbing: timing, the record of the machine, and CSV/JSON output.

Every benchmark reports medians over repeats and records the environment (machine, threads,
allocator, precision, versions) next to its figures, so a number is never quoted without them.
"""

from __future__ import annotations

import csv
import datetime
import json
import os
import platform
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch


def environment(precision: str = "fp32") -> dict:
    """Machine, threads, allocator, precision and versions, for the header of every result file."""
    preload = os.environ.get("LD_PRELOAD", "")
    allocator = "tcmalloc" if "tcmalloc" in preload else "jemalloc" if "jemalloc" in preload else "default (glibc)"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": platform.machine(),
        "processor": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "allocator": allocator,
        "precision": precision,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


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
    """Peak resident set size of this process so far, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def write_results(rows: list[dict], out_dir: str | Path, stem: str, env: dict) -> tuple[Path, Path]:
    """Write ``rows`` as ``stem.csv`` and ``{"environment": env, "results": rows}`` as ``stem.json``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out_dir / f"{stem}.csv", out_dir / f"{stem}.json"
    fields = list(dict.fromkeys(key for row in rows for key in row))
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    json_path.write_text(json.dumps({"environment": env, "results": rows}, indent=2))
    return csv_path, json_path
