"""Cost of fresh large allocations: an elementwise op into a new tensor versus into an existing one.

Usage:  python benchmarks/allocator.py                                   # glibc defaults
        GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/allocator.py   # transparent huge pages

glibc mmaps blocks of 32 MiB and more fresh at each allocation; the page faults that follow dominate
simple ops on large tensors. Prints the median of 9 runs (ms) for a 64 MiB float32 tensor.
"""

from __future__ import annotations

import os

import torch

from medattn.bench.common import median_time

x = torch.randn(16_384, 1024)
buffer = torch.empty_like(x)
fresh = median_time(lambda: x * 2, repeats=9) * 1e3
reused = median_time(lambda: torch.mul(x, 2, out=buffer), repeats=9) * 1e3
print(f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r} threads={torch.get_num_threads()}: "
      f"fresh {fresh:.1f} ms, into an existing buffer {reused:.1f} ms")
