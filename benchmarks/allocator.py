"""Cost of fresh large allocations under each malloc mode of medattn.allocator, each in a fresh process.

Usage:  python benchmarks/allocator.py [--threads 2]

An elementwise op on a 64 MiB float32 tensor into a new tensor (as every training step allocates its
activations) against the same op into an existing buffer, with the page faults per op, under the modes
``default`` (glibc's own), ``hugepages`` and ``reuse`` (the default of the ``medattn`` command; see
medattn/allocator.py). Each mode runs in a process started with that mode's ``GLIBC_TUNABLES``, as the
command line starts itself. Prints one line per mode: medians of 9 ops after 12 warm-up ops (the heap of
``reuse`` grows during the first few). The whole training step under each mode:
``MEDATTN_MALLOC=<mode> medattn bench scaling --mechanisms seqnorm --resolutions 2048 ...``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from medattn import allocator

CHILD = """
import resource, statistics, time, torch
torch.set_num_threads({threads})
x = torch.randn(16_384, 1024)
buffer = torch.empty_like(x)

def measure(op):
    for _ in range(12):
        op()
    times, faults = [], []
    for _ in range(9):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        started = time.perf_counter()
        op()
        times.append(time.perf_counter() - started)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return statistics.median(times) * 1e3, statistics.median(faults)

fresh, fresh_faults = measure(lambda: x * 2)
reused, reused_faults = measure(lambda: torch.mul(x, 2, out=buffer))
print(f"fresh {{fresh:.1f}} ms ({{fresh_faults:.0f}} page faults), into an existing buffer {{reused:.1f}} ms "
      f"({{reused_faults:.0f}})")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    for mode in allocator.MODES:
        tunables = ":".join(allocator.TUNABLES[mode])
        env = {**clean, **({"GLIBC_TUNABLES": tunables} if tunables else {})}
        done = subprocess.run([sys.executable, "-c", CHILD.format(threads=args.threads)], env=env, text=True,
                              capture_output=True, check=True)
        print(f"{mode:9s} GLIBC_TUNABLES={tunables or '(unset)'}: {done.stdout.strip()}")


if __name__ == "__main__":
    main()
