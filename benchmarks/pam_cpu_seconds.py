"""CPU seconds per 10^6 points of the permutohedral filter's forward, sizes timed in turn in one process.

Usage:  python benchmarks/pam_cpu_seconds.py [SIZES] [ROUNDS]       # default 100000,300000,1000000,2000000 3

Inputs as ``medattn bench pam`` (SYNTHETIC uniform cloud, d = 5, 8 channels, float32, no gradient). Each
size is called once to warm up (Numba kernels, allocator), then ``ROUNDS`` rounds call every size once in
turn, so a change of load falls on all sizes alike. Prints the median CPU time per 10^6 points split into
user and system time (system time is mostly the kernel zeroing fresh pages of large temporaries) and the
minor page faults per point. To compare two trees, run it under ``PYTHONPATH=<tree>/src`` for each
(e.g. a ``git archive`` of an older commit).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics

from medattn.bench.pam import _inputs
from medattn.permutohedral import lattice, permutohedral_filter
from medattn.threads import set_threads

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("sizes", nargs="?", default="100000,300000,1000000,2000000", help="comma-separated point counts")
parser.add_argument("rounds", nargs="?", type=int, default=3)
args = parser.parse_args()
sizes = [int(x) for x in args.sizes.split(",")]
rounds = args.rounds
data = {n: _inputs(n, 5, 8) for n in sizes}
for n in sizes:
    permutohedral_filter(*data[n])
threads = set_threads(1, log=lambda _: None)
samples: dict[int, list[tuple[float, float, float]]] = {n: [] for n in sizes}
for _ in range(rounds):
    for n in sizes:
        before = resource.getrusage(resource.RUSAGE_SELF)
        permutohedral_filter(*data[n])
        after = resource.getrusage(resource.RUSAGE_SELF)
        samples[n].append((after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime,
                           after.ru_minflt - before.ru_minflt))


def per_million(n: int, k: int) -> float:
    return round(statistics.median(s[k] for s in samples[n]) / n * 1e6, 3)


print(json.dumps({
    "tree": lattice.__file__, "threads": threads, "load_average_1min": round(__import__("os").getloadavg()[0], 2),
    "cpu_s_per_1M": {n: round(statistics.median(s[0] + s[1] for s in samples[n]) / n * 1e6, 3) for n in sizes},
    "user_s_per_1M": {n: per_million(n, 0) for n in sizes},
    "sys_s_per_1M": {n: per_million(n, 1) for n in sizes},
    "minor_faults_per_point": {n: round(statistics.median(s[2] for s in samples[n]) / n, 3) for n in sizes},
}))
