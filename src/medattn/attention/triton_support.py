"""When the Triton kernels run: the CUDA paths of the SeqNorm core and of bit attention (optional extra ``triton``).

This module imports no Triton, so ``medattn`` imports cleanly without it. The kernels themselves are
:mod:`medattn.attention.triton_seqnorm` and :mod:`medattn.attention.triton_bits` (both need ``triton``:
``pip install 'medattn[triton]'``); they run on CUDA tensors where :func:`available` holds, and on CPU tensors
only under Triton's interpreter (``TRITON_INTERPRET=1`` set before they are imported), which is how the tests run
them. :func:`kernels_off` switches them off for a comparison (``medattn bench attention --device cuda``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager

import torch

#: Widest head (and value head) the kernels take: one (d x D_v) fp32 tile per program.
MAX_WIDTH = 128

#: Dtypes the kernels take; statistics and accumulation in float32, bf16 products on CUDA for bf16.
DTYPES = (torch.float32, torch.bfloat16)

#: Most elements a tensor the kernels take may span (:func:`span`). Their offsets are int32 (Triton's arithmetic on
#: int32 arguments), exact below 2^31; the bit kernels stack up to two terms of a tensor (the Bernoulli mechanism's
#: two samples) into one, so each tensor may span half of that. Larger tensors take the PyTorch paths.
MAX_ELEMENTS = 2**30

_switched_off = False


def available() -> bool:
    """Whether the kernels can serve CUDA tensors here: ``triton`` is installed and this torch is built with NVIDIA's
    CUDA (asked without touching a device, so importing medattn starts no CUDA driver). ROCm builds, whose GPUs are
    "cuda" devices too, take the PyTorch paths: the kernels are compiled and checked for NVIDIA targets only."""
    return (torch.backends.cuda.is_built() and torch.version.hip is None
            and importlib.util.find_spec("triton") is not None)


def span(t: torch.Tensor) -> int:
    """Elements from a tensor's first to its last, in its storage: ``1 + sum_i (size_i - 1) stride_i`` (more than
    its ``numel`` for a view such as q of a fused qkv projection); 0 when empty."""
    return 0 if t.numel() == 0 else 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))


def fits(*tensors: torch.Tensor) -> bool:
    """Whether the kernels take these per-head tensors (..., width): float32 or bf16, width at most
    :data:`MAX_WIDTH`, spanning at most :data:`MAX_ELEMENTS` elements."""
    return all(t.dtype in DTYPES and t.shape[-1] <= MAX_WIDTH and span(t) <= MAX_ELEMENTS for t in tensors)


def runs_kernels(*tensors: torch.Tensor) -> bool:
    """Whether the CUDA path takes the kernels for these tensors: on CUDA, :func:`available`, :func:`fits`, and
    not inside :func:`kernels_off`."""
    return (not _switched_off and all(t.is_cuda for t in tensors) and fits(*tensors) and available())


def switched_off() -> bool:
    """Whether :func:`kernels_off` is in force."""
    return _switched_off


@contextmanager
def kernels_off() -> Iterator[None]:
    """Within: the CUDA paths run their PyTorch operations instead of the Triton kernels (a process-wide switch,
    so that autograd's device threads see it too)."""
    global _switched_off
    before, _switched_off = _switched_off, True
    try:
        yield
    finally:
        _switched_off = before
