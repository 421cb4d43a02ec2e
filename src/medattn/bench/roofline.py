"""Roofline: this machine's measured matmul rate and memory bandwidth, and cost models to compare with.

Measured rates (:func:`measure_rates`):

* matmul rate: median GFLOP/s of a square ``(n x n) @ (n x n)`` product (``2 n^3`` FLOPs), in
  float32 for ``fp32`` and in bfloat16 tensors for ``bf16``;
* memory bandwidth: median GB/s of ``b.copy_(a)`` between two preallocated buffers much larger than
  the caches, counting ``2 * size`` bytes (one read, one write; write-allocate traffic not counted).

Cost model (:class:`Cost`): a piece of work costs ``flops`` matmul FLOPs and moves ``bytes`` bytes; its
roofline time is ``flops / matmul rate + bytes / bandwidth`` (the sum, not the max: the two are not
assumed to overlap). Both terms are lower bounds:

* FLOPs count only matrix products (``2 m k n`` per ``(m x k) @ (k x n)``); elementwise work
  (normalisation statistics, exp, elu) is left to the bytes term. The backward of a product
  ``C = A B`` is two products of the same size (``dA = dC B^T``, ``dB = A^T dC``), so a backward
  costs twice the forward FLOPs, or once where the input needs no gradient (an image).
* Bytes are compulsory traffic only: every input read once and every output written once, in the
  element size of the precision (4 bytes fp32, 2 bytes bf16). Attention core (q, k, v given, each
  (B, H, N, d)): forward reads q, k, v and writes the output, ``4 B H N d`` elements; backward reads
  q, k, v and the output gradient and writes three input gradients, ``7 B H N d``. Temporaries that
  a real kernel stores and re-reads are extra, so an implementation can approach but never beat it.

Forward matmul FLOPs of an attention core (batch B, H heads of width d, N tokens) are the mechanism's own
:meth:`~medattn.attention.base.Attention.core_forward_flops` (softmax ``4 B H N^2 d``, SeqNorm ``4 B H N d^2``,
SimA ``4 B H N d min(N, d)``, elu+1 linear ``4 B H N d^2 + 2 B H N d``); a mechanism without one has no model
(its roofline is blank). The
full layer adds its projections, ``qkv`` (dim -> 3 inner_dim) and ``proj`` (inner_dim -> dim), as
:func:`linear_cost`. :func:`matmul_flops` counts a whole model's ``nn.Linear`` and convolution FLOPs
from shapes alone (a forward on the meta device), for the training step's matmul floor.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from medattn.attention import Attention, get_attention_class

from .common import interleaved_rounds, median_time

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
ELEMENT_BYTES = {"fp32": 4, "bf16": 2}



@dataclass(frozen=True)
class Cost:
    """Matmul FLOPs and compulsory bytes of a piece of work."""

    flops: float
    bytes: float

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.flops + other.flops, self.bytes + other.bytes)


@dataclass(frozen=True)
class MachineRates:
    """Measured matmul GFLOP/s per precision and memory bandwidth in GB/s."""

    matmul_gflops: dict[str, float]
    bandwidth_gbs: float

    def time_s(self, cost: Cost, precision: str) -> float:
        """Roofline time of ``cost``: ``flops / matmul rate + bytes / bandwidth``."""
        if precision not in self.matmul_gflops:
            raise ValueError(f"no matmul rate measured for {precision!r}; have {sorted(self.matmul_gflops)}")
        return cost.flops / (self.matmul_gflops[precision] * 1e9) + cost.bytes / (self.bandwidth_gbs * 1e9)

    def as_dict(self) -> dict:
        return {"matmul_gflops": dict(self.matmul_gflops), "bandwidth_gbs": self.bandwidth_gbs}


def matmul_probe(precision: str = "fp32", size: int = 2048, device: str = "cpu",
                 target_s: float = 0.2) -> Callable[[], float]:
    """A square matmul in ``precision`` sized to take about ``target_s`` seconds (at most ``size``; a 256 x 256
    product first estimates the rate, so a slow path such as bf16 without hardware support is measured in
    seconds rather than minutes) -> a function that runs it once and returns its GFLOP/s (``2 n^3`` FLOPs)."""
    if precision not in DTYPES:
        raise ValueError(f"precision must be one of {sorted(DTYPES)}, got {precision!r}")

    def product(n: int) -> Callable[[], float]:
        a, b = (torch.randn(n, n, device=device, dtype=DTYPES[precision]) for _ in range(2))
        out = torch.empty_like(a)
        sync = torch.cuda.synchronize if a.is_cuda else (lambda: None)

        def once() -> float:
            sync()
            started = time.perf_counter()
            torch.matmul(a, b, out=out)
            sync()
            return 2 * n**3 / (time.perf_counter() - started) / 1e9
        return once

    estimate = interleaved_rounds({}, 3, probes={"rate": product(256)}).value_medians()["rate"]  # after a warm-up
    return product(int(min(size, max(256, (target_s * estimate * 1e9 / 2) ** (1 / 3))) // 64 * 64))


def measure_matmul_gflops(precision: str = "fp32", size: int = 2048, repeats: int = 5, device: str = "cpu",
                          target_s: float = 0.2) -> float:
    """Median GFLOP/s of :func:`matmul_probe` over ``repeats`` products (after one warm-up)."""
    probe = matmul_probe(precision, size, device, target_s)
    return interleaved_rounds({}, repeats, probes={"rate": probe}).value_medians()["rate"]


def measure_bandwidth_gbs(megabytes: int = 256, repeats: int = 5, device: str = "cpu") -> float:
    """Median GB/s of copying a ``megabytes`` MiB buffer into another (read + write counted)."""
    a = torch.ones(megabytes * 2**20 // 4, device=device)
    b = torch.empty_like(a)
    seconds = median_time(lambda: b.copy_(a), repeats=repeats, warmup=1)
    return 2 * a.numel() * 4 / seconds / 1e9


def measure_rates(precisions: tuple[str, ...] = ("fp32", "bf16"), matmul_size: int = 2048,
                  bandwidth_megabytes: int = 256, repeats: int = 5, device: str = "cpu") -> MachineRates:
    """Measure the matmul rate for each precision and the memory bandwidth (a few seconds on a CPU)."""
    return MachineRates(
        {p: measure_matmul_gflops(p, matmul_size, repeats, device) for p in precisions},
        measure_bandwidth_gbs(bandwidth_megabytes, repeats, device),
    )


def linear_cost(rows: int, fan_in: int, fan_out: int, backward: bool = False, input_grad: bool = True,
                element_bytes: int = 4) -> Cost:
    """A dense layer ``(rows x fan_in) @ (fan_in x fan_out)``; with ``backward``, forward plus backward.

    Forward reads X and W and writes Y. Backward reads dY, X and W and writes dW, and dX when
    ``input_grad``; each gradient is one product of the forward's size.
    """
    weight, x, y = fan_in * fan_out, rows * fan_in, rows * fan_out
    flops = 2 * rows * fan_in * fan_out
    cost = Cost(flops, (x + weight + y) * element_bytes)
    if backward:
        grads = 2 if input_grad else 1
        cost += Cost(grads * flops, (y + x + weight + weight + (x if input_grad else 0)) * element_bytes)
    return cost


def attention_cost(mechanism: str, seq_len: int, heads: int = 8, head_dim: int = 64, dim: int = 512,
                   batch: int = 1, backward: bool = False, layer: bool = False,
                   precision: str = "fp32") -> Cost | None:
    """Cost of one attention core (``layer=False``) or layer (with its projections), see the module doc.

    None where ``mechanism`` has no FLOP model (:meth:`Attention.core_forward_flops` returns None).
    """
    flops = get_attention_class(mechanism).core_forward_flops(batch, heads, seq_len, head_dim)
    if flops is None:
        return None
    size = ELEMENT_BYTES[precision]
    elements = batch * heads * seq_len * head_dim
    cost = Cost(flops, 4 * elements * size)
    if backward:
        cost += Cost(2 * flops, 7 * elements * size)
    if layer:
        inner, rows = heads * head_dim, batch * seq_len
        cost += linear_cost(rows, dim, 3 * inner, backward, True, size)
        cost += linear_cost(rows, inner, dim, backward, True, size)
    return cost


def matmul_flops(build: Callable[[], nn.Module], input_shape: tuple[int, ...], backward: bool = True) -> float:
    """FLOPs of every ``nn.Linear`` and convolution of ``build()`` on an input of ``input_shape``.

    The model is built and run on the meta device, so nothing is computed or allocated; every
    attention core (:meth:`Attention.attend`) is replaced by "return q" for that run, since cores are
    not counted and need not support the meta device. With ``backward``, each layer also counts its
    weight gradient and, unless its input needs no gradient (the image into the patch embedding), its
    input gradient.
    """
    total = 0.0

    def count(module, inputs, output):
        nonlocal total
        if isinstance(module, nn.Linear):
            flops = 2 * math.prod(inputs[0].shape[:-1]) * module.in_features * module.out_features
        else:  # convolution: each output element is a dot product over in/groups * kernel
            flops = 2 * output.numel() * module.in_channels // module.groups * math.prod(module.kernel_size)
        grads = 1 + inputs[0].requires_grad if backward else 0
        total += flops * (1 + grads)

    with torch.device("meta"):
        model = build()
        for module in model.modules():
            if isinstance(module, Attention):
                module.attend = lambda q, k, v, mask: q
        handles = [m.register_forward_hook(count) for m in model.modules()
                   if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d))]
        model(torch.empty(input_shape))
    for handle in handles:
        handle.remove()
    return total
