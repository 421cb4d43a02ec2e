"""One configuration of ``medattn bench scaling`` measured: its training steps' time, memory and work.

:func:`measure_step` builds each variant of one (model, mechanism, resolution) (compiled, activation checkpointing,
precision; on CUDA each twice where the mechanism has Triton kernels), warms it up, takes its peak memory, counts
its FLOPs and times one step of every variant per round beside a matmul probe. It is meant for a fresh process
(:func:`medattn.bench.common.run_isolated`); :mod:`medattn.bench.scaling` sweeps the configurations and turns the
measurements into its rows.
"""

from __future__ import annotations

import ctypes
import gc
import itertools
import time
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from medattn.attention import triton_support
from medattn.config import DEFAULTS
from medattn.models import create_model
from medattn.train.defaults import GENERAL
from medattn.train.optim import make_optimizer

from .attention import implementations
from .common import current_rss_bytes, interleaved_rounds, peak_memory_bytes, reset_peak_memory
from .roofline import DTYPES, matmul_probe, measure_matmul_gflops


def _release_freed_memory() -> None:
    """Collect garbage and hand freed heap memory back to the OS (glibc ``malloc_trim``; no-op elsewhere)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def variant_name(compiled: bool, checkpointing: bool, precision: str = "fp32") -> str:
    """"eager", "compiled", "eager+checkpointing", "compiled+checkpointing", each with " bf16" under bf16 (and, on
    CUDA for a mechanism with Triton kernels, each twice: " torch" with the kernels switched off, " triton")."""
    name = ("compiled" if compiled else "eager") + ("+checkpointing" if checkpointing else "")
    return name if precision == "fp32" else f"{name} {precision}"


def training_step(model: str, mechanism: str, resolution: int, images: torch.Tensor, targets: torch.Tensor,
                  compiled: bool = False, checkpointing: bool = False, precision: str = "fp32", device: str = "cpu",
                  seed: int = 0) -> Callable[[], None]:
    """A function running one training step of a fresh ``model`` (weights of ``seed``, one output) on ``images``
    (B, C, *spatial) and ``targets`` (B, 1): forward (compiled with ``torch.compile(fullgraph=True)``, per-block
    activation checkpointing, bf16 autocast as asked), binary cross-entropy, backward, and the optimizer training
    builds (fused AdamW)."""
    torch.manual_seed(seed)
    net = create_model(model, attention=mechanism, img_size=resolution, num_classes=1,
                       activation_checkpointing=checkpointing).to(device)
    optimizer = make_optimizer(net, {**DEFAULTS["train"], **GENERAL})
    run = torch.compile(net, fullgraph=True) if compiled else net
    autocast = torch.autocast(device, dtype=DTYPES[precision]) if precision != "fp32" else nullcontext()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            logits = run(images)
        F.binary_cross_entropy_with_logits(logits.float(), targets).backward()
        optimizer.step()

    return step


def measure_step(model: str, mechanism: str, resolution: int, batch_size: int = 1, repeats: int = 3,
                 warmup: int = 1, budget_s: float | None = None, device: str = "cpu", seed: int = 0,
                 threads: int | None = None, variants: list[list] | tuple = ((False, False, "fp32"),)) -> dict:
    """Median training-step time and peak memory of one configuration per variant; meant for a fresh process.

    ``variants``: ``(compiled, checkpointing, precision)`` triples, all on the same input.

    1. One variant after the other: build the model (same seed, so the same initial weights) and its
       optimizer; if compiled, the first call compiles (timed as ``compile_s``); then ``max(warmup, 1)``
       untimed steps. The variant's memory is the peak RSS of this phase minus the RSS before its model was
       built (freed heap trimmed first; variants built earlier stay resident and are not counted).
    2. In rounds, one timed step of every variant per round, ``repeats`` rounds (fewer once they took
       ``budget_s``), so a change of the machine's load falls on all variants alike; the median per variant.
       Each round also times one matmul per precision (the product the before/after rates use): the median is
       the rate the steps ran beside (``matmul_gflops_interleaved``), a floor that moves with the machine as the
       steps do. Then each precision's matmul rate is measured again (``matmul_gflops_after``).
    3. Before the rounds, one step of each eager variant runs under ``FlopCounterMode``: the FLOPs the step
       executes (every matmul, attention core included), machine-independent work (``counted_gflop``).

    Returns ``{"variants": [{"variant", "status", "step_s", "compile_s", "peak_mem_bytes",
    "matmul_gflops_after", "matmul_gflops_interleaved", "counted_gflop" (eager)}, ...], "memory_method"}``; a
    variant that raises gets a "failed: ..." status and
    the others still run.
    """
    if threads:
        torch.set_num_threads(threads)
    with torch.device("meta"):
        probe = create_model(model, attention=mechanism, img_size=resolution)
    shape = (batch_size, probe.in_chans, *(resolution,) * probe.spatial_dims)
    images = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device)
    targets = torch.zeros(batch_size, 1, device=device)
    # prepared: (result, step, precision) of the variants that built and ran
    results, prepared = _prepare_variants(model, mechanism, resolution, images, targets, variants, warmup, device,
                                          seed)
    _count_flops(prepared)
    steps, interleaved = _timed_rounds(prepared, repeats, budget_s, device)
    rates = {precision: measure_matmul_gflops(precision, device=device) for _, _, precision in prepared}
    for index, (result, _, precision) in enumerate(prepared):
        if result["status"] == "ok":
            result.update(step_s=steps[index], matmul_gflops_after=rates[precision],
                          matmul_gflops_interleaved=interleaved[precision])
    prepared.clear()
    if any(compiled for compiled, _, _ in variants):
        torch._dynamo.reset()
    method = ("torch.cuda.max_memory_allocated" if device == "cuda"
              else "peak RSS minus the RSS before the variant's model was built (glibc freed memory trimmed)")
    return {"variants": results, "memory_method": method}


def _failed(error: Exception) -> str:
    """The status of a variant that raised."""
    return f"failed: {type(error).__name__}: {error}"[:300]


def _prepare_variants(model: str, mechanism: str, resolution: int, images: torch.Tensor, targets: torch.Tensor,
                      variants, warmup: int, device: str, seed: int) -> tuple[list[dict], list[tuple]]:
    """Phase 1 of :func:`measure_step`: each variant built, compiled (timed) and warmed up, its peak memory taken.
    -> (a result per variant, (result, step, precision) of those that built and ran)."""
    results, prepared = [], []
    for (compiled, checkpointing, precision), kernels in itertools.product(variants,
                                                                          implementations(mechanism, device)):
        result = {"variant": variant_name(compiled, checkpointing, precision) + (f" {kernels}" if kernels else "")}
        results.append(result)
        _release_freed_memory()
        baseline = current_rss_bytes() if device == "cpu" else 0
        reset_peak_memory(device)
        try:
            step = training_step(model, mechanism, resolution, images, targets, compiled, checkpointing, precision,
                                 device, seed)
            if kernels == "torch":  # the same step with the Triton kernels switched off
                step = partial(_without_kernels, step)
            result["compile_s"] = None
            if compiled:  # the first call compiles forward and backward
                started = time.perf_counter()
                step()
                result["compile_s"] = time.perf_counter() - started
            for _ in range(max(warmup, 1)):
                step()
            result.update(status="ok", peak_mem_bytes=peak_memory_bytes(device, baseline))
            prepared.append((result, step, precision))
        except Exception as error:  # one failing variant (e.g. a compiler error) does not hide the others
            result["status"] = _failed(error)
    return results, prepared


def _without_kernels(step: Callable[[], None]) -> None:
    """One training step with the Triton kernels switched off (:func:`medattn.attention.triton_support.kernels_off`)."""
    with triton_support.kernels_off():
        step()


def _count_flops(prepared: list[tuple]) -> None:
    """Phase 3 of :func:`measure_step`: the work a step does, counted once per eager variant (the counter sees
    every op) as ``counted_gflop``."""
    for result, step, _ in prepared:
        if result["variant"].startswith("eager"):
            with FlopCounterMode(display=False) as counter:
                step()
            result["counted_gflop"] = counter.get_total_flops() / 1e9


def _timed_rounds(prepared: list[tuple], repeats: int, budget_s: float | None, device: str
                  ) -> tuple[dict[int, float], dict[str, float]]:
    """Phase 2 of :func:`measure_step`: :func:`~medattn.bench.common.interleaved_rounds` of one timed step of every
    variant and one matmul per precision (its probes), ``repeats`` rounds (fewer past ``budget_s``); a variant that
    raises gets a "failed: ..." status. -> (index in ``prepared`` -> median step seconds, precision -> median matmul
    rate of the rounds)."""
    probes = {precision: matmul_probe(precision, device=device) for _, _, precision in prepared}  # as before/after
    rounds = interleaved_rounds({index: step for index, (_, step, _) in enumerate(prepared)}, repeats, warmup=0,
                                budget_s=budget_s, probes=probes, catch=True)
    for index, error in rounds.failed.items():
        prepared[index][0]["status"] = _failed(error)
    return rounds.medians(), rounds.value_medians()
