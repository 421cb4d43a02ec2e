"""Permutohedral lattice filter: time and peak memory versus number of points, against brute force.

Each configuration (method, number of points, pass) runs in a fresh Python subprocess, so its peak resident
set size belongs to that configuration alone (``medattn.bench.common.run_isolated``): the worker resets the kernel's
peak mark (``medattn.bench.common.reset_peak_memory``: ``/proc/self/clear_refs``, falling back to ``ru_maxrss``) once
its inputs exist, and ``peak_mem_mb`` is the peak (VmHWM) minus the resident size at that moment, i.e. the filter's
working memory. Features are uniform in a d-cube whose volume grows with N (one point per unit volume, in units of
the Gaussian's standard deviation), as voxel coordinates of a growing volume would; values are standard normal.
``brute`` is the exact O(N^2) filter, computed in row blocks of 1024 to bound memory. Timings are medians over
repeats after one warm-up (``medattn.bench.common.interleaved_rounds``); from 10^6 points on, one warm-up and one
timed run (a cold single run also paid the first touch of every fresh page, which made the cost per point look
non-linear in N: 1.06 vs 0.63 CPU-us at 10^6 vs 3x10^5 in one run, sys time 25% of the total). Besides
wall time, ``cpu_seconds`` is the worker's CPU time per timed call (``time.process_time``, user + system), which is less
disturbed when other processes share the machine. The lattice's Numba kernels are loaded (compiled on
the first run ever) by a filter of 1,000 points before the peak mark is reset and the clocks start: a
one-off cost of the process (measured: 0.5 CPU-s and 130 MiB, mostly Numba and LLVM), not of the filter.
"""

from __future__ import annotations

import torch

from medattn.errors import UserError
from medattn.threads import set_threads

from .common import (
    add_overwrite,
    current_rss_bytes,
    environment,
    interleaved_rounds,
    peak_memory_bytes,
    reset_peak_memory,
    results_folder,
    run_isolated,
    write_results,
)

FULL_SIZES = [10_000, 30_000, 100_000, 300_000, 1_000_000, 2_000_000]
QUICK_SIZES = [1_000, 3_000, 10_000]


def add_arguments(parser) -> None:
    parser.add_argument("--sizes", type=int, nargs="+", default=None,
                        help=f"numbers of points (default {FULL_SIZES}; --quick: {QUICK_SIZES})")
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--dim", type=int, default=5, help="feature dimension d (default 5)")
    parser.add_argument("--channels", type=int, default=8, help="value channels (default 8)")
    parser.add_argument("--normalize", action="store_true", help="time the normalised form")
    parser.add_argument("--brute-max", type=int, default=None,
                        help="largest N for the brute-force filter (default 10000; --quick: 3000)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per configuration (the median is kept)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads in each worker")
    parser.add_argument("--out", default="reports/bench-pam", help="output folder (CSV + JSON)")
    add_overwrite(parser)


def _inputs(num_points: int, dim: int, channels: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    side = num_points ** (1.0 / dim)  # one point per unit volume
    features = torch.rand(num_points, dim, generator=gen) * side
    values = torch.randn(num_points, channels, generator=gen)
    return values, features


def _brute(values: torch.Tensor, features: torch.Tensor, normalize: bool, block: int = 1024) -> torch.Tensor:
    rows = []
    for start in range(0, features.shape[0], block):
        weights = torch.exp(-torch.cdist(features[start:start + block], features).square() / 2)  # (b, N)
        out = weights @ values
        rows.append(out / weights.sum(1, keepdim=True) if normalize else out)
    return torch.cat(rows)


def measure(config: dict) -> dict:
    """Time one configuration in this process; returns a result row (run inside a fresh worker)."""
    from medattn.permutohedral import permutohedral_filter

    if config["method"] == "lattice":  # load (or compile) the Numba kernels first: once per process, not timed
        small_values, small_features = _inputs(min(config["num_points"], 1000), config["dim"], config["channels"])
        permutohedral_filter(small_values.requires_grad_(), small_features.requires_grad_()).sum().backward()
    if config["threads"]:
        set_threads(config["threads"], log=lambda _: None)  # torch's and Numba's
    values, features = _inputs(config["num_points"], config["dim"], config["channels"])
    backward = config["pass"] == "forward+backward"
    values.requires_grad_(backward)
    features.requires_grad_(backward)
    normalize = config["normalize"]

    def call():
        if config["method"] == "lattice":
            out = permutohedral_filter(values, features, normalize=normalize)
        else:
            out = _brute(values, features, normalize)
        if backward:
            out.sum().backward()
            values.grad = features.grad = None

    reset_peak_memory("cpu")
    baseline = current_rss_bytes()
    repeats = 1 if config["num_points"] >= 1_000_000 else config["repeats"]
    with torch.set_grad_enabled(backward):  # the warm-up's memory counts in the peak, its time in neither clock
        rounds = interleaved_rounds({"call": call}, repeats, warmup=1)
    seconds, cpu_seconds = rounds.medians()["call"], rounds.mean_cpu_seconds("call")
    return {**config, "seconds": seconds, "us_per_point": seconds / config["num_points"] * 1e6,
            "cpu_seconds": cpu_seconds, "cpu_us_per_point": cpu_seconds / config["num_points"] * 1e6,
            "peak_mem_mb": peak_memory_bytes("cpu", baseline) / 2**20, "threads_used": torch.get_num_threads()}


def scaling_ratio(rows: list[dict], method: str, pass_name: str, low: int = 100_000,
                  key: str = "us_per_point") -> float | None:
    """max / min of ``key`` (a cost per point) over the sizes >= ``low`` (1.0 = perfectly linear)."""
    costs = [r[key] for r in rows
             if r["method"] == method and r["pass"] == pass_name and r["num_points"] >= low]
    return max(costs) / min(costs) if len(costs) >= 2 else None


def run(args) -> int:
    args.threads = set_threads(args.threads)  # each worker gets the same count
    if args.dim < 1 or args.channels < 1 or args.repeats < 1:
        raise UserError("--dim, --channels and --repeats must be positive")
    sizes = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
    if min(sizes) < 1:
        raise UserError(f"--sizes must be positive, got {sizes}")
    brute_max = args.brute_max if args.brute_max is not None else 3_000 if args.quick else 10_000
    out = results_folder(args.out, ["pam"], args.overwrite)
    rows = []
    for num_points in sizes:
        for method in ("lattice", "brute"):
            if method == "brute" and num_points > brute_max:
                continue
            for pass_name in ("forward", "forward+backward"):
                config = {"method": method, "num_points": num_points, "pass": pass_name, "dim": args.dim,
                          "channels": args.channels, "normalize": args.normalize, "repeats": args.repeats,
                          "threads": args.threads}
                row = run_isolated(measure, {"config": config}, check=True)
                rows.append(row)
                print(f"{method:8s} N={num_points:>9,d} {pass_name:17s} {row['seconds']:9.4f} s "
                      f"{row['us_per_point']:8.3f} us/point (CPU {row['cpu_us_per_point']:8.3f})  "
                      f"peak +{row['peak_mem_mb']:8.1f} MiB", flush=True)
    env = environment("fp32")
    env["threads_per_worker"] = rows[0]["threads_used"] if rows else None
    env["peak_memory"] = ("VmHWM of a fresh subprocess per configuration, reset via /proc/self/clear_refs "
                          "after the inputs exist, minus VmRSS at that moment")
    csv_path, json_path = write_results(rows, out, "pam", env)
    for pass_name in ("forward", "forward+backward"):
        for key in ("us_per_point", "cpu_us_per_point"):
            ratio = scaling_ratio(rows, "lattice", pass_name, key=key)
            if ratio is not None:
                print(f"lattice {pass_name}: {key} max/min over N >= 1e5 = {ratio:.2f}")
    print(f"wrote {csv_path} and {json_path}")
    return 0
