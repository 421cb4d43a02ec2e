"""The dtype casts a piece of PyTorch work executes: counted work for bf16 measurements, the same on every machine.

:class:`CastRecorder` records every dtype-changing ``aten._to_copy`` (source and target dtype, shape, bytes read and
written, whether its input is one of the given parameters, and the phase the caller set); it also works under
``FakeTensorMode``, so a large step can be counted without being computed. A cast inside a registered operator is
not seen (its fake or its kernel runs below the mode). :func:`float32_seqnorm_core` runs SeqNorm's previous float32
core under bf16 autocast, the "before" of the bf16 core's comparisons (benchmarks/bf16_step_casts.py,
benchmarks/bf16_core_gradients.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from medattn.attention import seqnorm_fused


@dataclass(frozen=True)
class Cast:
    source: torch.dtype
    target: torch.dtype
    shape: tuple[int, ...]
    nbytes: int  # read and written
    of_parameter: bool
    phase: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class CastRecorder(TorchDispatchMode):
    """Records the dtype-changing ``_to_copy`` calls made while it is active, in ``casts``; set ``phase`` (e.g. to
    ``"backward"``) to label the ones that follow. Casts of the tensors in ``parameters`` are marked as such."""

    def __init__(self, parameters: Iterable[torch.Tensor] = ()):
        super().__init__()
        self.parameter_ids = {id(p) for p in parameters}
        self.phase = "forward"
        self.casts: list[Cast] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._to_copy.default and out.dtype != args[0].dtype:
            source = args[0]
            self.casts.append(Cast(source.dtype, out.dtype, tuple(source.shape),
                                   source.numel() * (source.element_size() + out.element_size()),
                                   id(source) in self.parameter_ids, self.phase))
        return out


@contextmanager
def float32_seqnorm_core() -> Iterator[None]:
    """Within the block, bf16 q, k, v are cast up and SeqNorm's core runs in float32 (as before the bf16 core)."""
    shipped = seqnorm_fused.LOW_PRECISION
    seqnorm_fused.LOW_PRECISION = ()
    try:
        yield
    finally:
        seqnorm_fused.LOW_PRECISION = shipped
