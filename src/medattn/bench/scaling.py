"""Training-step time and memory of a ViT versus image resolution, per mechanism (the paper's Figure 2).

For each mechanism (default softmax, sima, seqnorm) and resolution (default 224, 512, 1024, 2048, i.e.
N = 196 ... 16,384 patches of 16 for ``vit2d``), one training step of the model preset at batch size
``--batch-size``: forward, binary cross-entropy loss, backward, AdamW step. Reported: the median step
time, the epoch time it implies for ``--images-per-epoch`` images, the peak memory, and the step's
matmul floor, i.e. the FLOPs of every ``nn.Linear`` and convolution (qkv and output projections, MLP,
patch embedding, head) forward and backward at the measured matmul rate, with the ratio
step time / floor (``floor_ratio``: the rate measured before the runs; ``floor_ratio_after``: the rate
measured again by the measuring process right after the variant's steps; ``floor_ratio_interleaved``: the rate
timed in the same rounds as the steps, one product per round, so a shared machine whose speed moves within a
minute moves floor and step alike). The attention cores are not in the floor: a ratio near 1 means attention is
free. Beside the time, the work: ``counted_gflop``, the FLOPs one eager step executes (PyTorch's
``FlopCounterMode``: every matmul and convolution, attention cores included), and ``achieved_gflops``, that work
over the step time.

Memory: each configuration runs in a fresh Python process (``--no-isolate``: in this one); the peak
RSS minus the RSS after imports, so it counts parameters, gradients, AdamW state, activations and
allocator overhead (on CUDA: ``torch.cuda.max_memory_allocated``). Configurations whose time or memory,
extrapolated from the smaller resolutions, exceed the budgets are skipped and recorded as such.
Writes ``scaling.csv``, ``scaling.json`` and ``scaling.png`` (time per epoch and memory vs resolution).

Triton: on CUDA, where ``triton`` is installed, a mechanism with Triton kernels (SeqNorm, the binary ones;
:data:`medattn.bench.attention.TRITON_MECHANISMS`) runs every variant twice, ``<variant> torch`` (the kernels
switched off) and ``<variant> triton``, so ``vs_eager`` of ``eager triton`` is the kernels' gain on the whole step.

Variants (``--compile``, ``--activation-checkpointing``, ``--precision fp32,bf16``): each configuration
is then also measured compiled (``torch.compile(model, fullgraph=True)``, inductor; the first call's
compile time is ``compile_s``), with per-block activation checkpointing and/or under bf16 autocast, in
the same process, timed in rounds (one step of every variant per round,
:func:`~medattn.bench.scaling_step.measure_step`), so the ratio ``vs_eager`` (step time / the first variant's,
the plain eager step) compares like with like on a shared machine whose load changes. bf16 is timed on a CPU
only where it has bf16 hardware (AVX-512 BF16 or AMX, :func:`~medattn.bench.common.cpu_bf16_support`);
elsewhere its rows say why they were skipped instead of reporting an emulation's slowdown. The matmul
floor of a bf16 row uses the measured bf16 matmul rate. A variant's memory is its peak RSS while it is built
(and compiled) and its warm-up steps run, minus the RSS before its model was built (freed memory is
handed back to the OS between variants with glibc's ``malloc_trim``).

The optimizer is training's (:func:`medattn.train.optim.make_optimizer` with the default train config:
AdamW, fused where torch has the kernel).

    medattn bench scaling --resolutions 224,512 --model vit2d --out reports/bench-scaling
    medattn bench scaling --resolutions 224,1024 --compile --out reports/bench-compile
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from functools import partial

import torch

from medattn.attention import get_attention_class
from medattn.errors import UserError
from medattn.models import available_models, create_model
from medattn.text import format_table

from .attention import RUNTIME_ALLOWANCE_BYTES
from .common import (
    add_device_options,
    add_overwrite,
    comma_list,
    cpu_bf16_support,
    default_device,
    environment,
    results_folder,
    row_environment,
    run_device,
    run_in_process,
    run_isolated,
    skip_reason,
    write_results,
)
from .roofline import DTYPES, MachineRates, matmul_flops, measure_rates
from .scaling_step import measure_step, variant_name

DEFAULT_MECHANISMS = ("softmax", "sima", "seqnorm")
DEFAULT_RESOLUTIONS = (224, 512, 1024, 2048)


def run_scaling_bench(mechanisms=DEFAULT_MECHANISMS, resolutions=DEFAULT_RESOLUTIONS, model: str = "vit2d",
                      batch_size: int = 1, precision: str | list[str] = "fp32", repeats: int = 3, warmup: int = 1,
                      time_budget_s: float = 120.0, memory_budget_gb: float = 8.0, images_per_epoch: int = 15000,
                      device: str | None = None, rates: MachineRates | None = None, isolate: bool = True,
                      threads: int | None = None, verbose: bool = False, compile: bool = False,
                      activation_checkpointing: bool = False) -> list[dict]:
    """One row per (mechanism, resolution, variant): step time, epoch time, peak memory, matmul floor.

    ``time_budget_s`` bounds one training step; ``rates`` defaults to measuring them now. Skipped
    configurations are rows with a ``status`` starting with "skipped:". ``compile``,
    ``activation_checkpointing`` and a list of precisions (e.g. ``["fp32", "bf16"]``) add the variants of
    the module docstring beside the first precision's eager step; its times drive the budget checks.
    """
    precisions = [precision] if isinstance(precision, str) else list(precision)
    resolutions = _check_arguments(mechanisms, resolutions, model, precisions)
    if batch_size < 1 or repeats < 1 or images_per_epoch < 1 or time_budget_s <= 0 or memory_budget_gb <= 0:
        raise UserError("batch size, repeats, images per epoch and the budgets must be positive")
    device = device or default_device()
    if threads:
        torch.set_num_threads(threads)
    env = environment(precisions[0], str(device))
    env_fields = row_environment(env)
    rates = rates or measure_rates(device=device)
    memory_budget = memory_budget_gb * 2**30
    unsupported = {p: _unsupported_reason(p, device) for p in precisions}
    variants = [(c, a, p) for p, c, a in itertools.product(precisions, (False, True) if compile else (False,),
                                                           (False, True) if activation_checkpointing else (False,))]
    skipped_variants = [v for v in variants if unsupported[v[2]]]
    variants = [v for v in variants if not unsupported[v[2]]]
    rows = []
    for mechanism in mechanisms:
        times: list[tuple[float, float]] = []
        memories: list[tuple[float, float]] = []
        for resolution in resolutions:
            with torch.device("meta"):  # validates the size; allocates nothing
                probe = create_model(model, attention=mechanism, img_size=resolution)
            shape = (batch_size, probe.in_chans, *(resolution,) * probe.spatial_dims)
            tokens = 1 + math.prod(probe.grid_size)
            flops = matmul_flops(partial(create_model, model, attention=mechanism, img_size=resolution), shape)
            floors = {p: flops / (rates.matmul_gflops[p] * 1e9) for p in precisions}
            base = dict(mechanism=mechanism, model=model, resolution=resolution, tokens=tokens, batch_size=batch_size,
                        matmul_gflop=flops / 1e9)

            def row(variant, base=base, floors=floors):
                return {**base, "variant": variant_name(*variant), "precision": variant[2],
                        "matmul_floor_s": floors[variant[2]]}

            rows.extend({**row(v), "status": f"skipped: {unsupported[v[2]]}", **env_fields} for v in skipped_variants)
            status = "skipped: no variant to measure" if not variants else skip_reason(
                tokens, times, time_budget_s, memories, memory_budget, per=" per step")
            if status is None:
                kwargs = dict(model=model, mechanism=mechanism, resolution=resolution, batch_size=batch_size,
                              repeats=repeats, warmup=warmup, budget_s=time_budget_s, device=device,
                              threads=threads, variants=variants)
                started = time.perf_counter()
                measured = _measure(kwargs, isolate, compile, memory_budget)
                if verbose:
                    print(f"  {mechanism} {resolution}px: {time.perf_counter() - started:.1f} s wall", flush=True)
                status = measured.get("status")
            if status is not None:
                rows.extend({**row(v), "status": status, **env_fields} for v in variants)
                continue
            rows += [{**row(variant), **figures, **env_fields}
                     for variant, figures in zip(variants, _figures(measured, variants, floors, flops,
                                                                    images_per_epoch, batch_size))]
            first = measured["variants"][0]
            if first["status"] == "ok":
                times.append((tokens, first["step_s"]))
                memories.append((tokens, first["peak_mem_bytes"]))
    return rows


def _measure(kwargs: dict, isolate: bool, compile: bool, memory_budget: float) -> dict:
    """:func:`measure_step` with ``kwargs``: in a child process of its own (``isolate``: a timeout from the steps it
    runs, each allowed four times the time budget, 900 s more for compiling, and a memory limit) or in this one."""
    if not isolate:
        return run_in_process(measure_step, kwargs)
    variants, warmup, time_budget_s = kwargs["variants"], kwargs["warmup"], kwargs["budget_s"]
    timeout = len(variants) * ((warmup + 2) * time_budget_s * 4 + 120) + (900 if compile else 0)
    return run_isolated("medattn.bench.scaling_step:measure_step", kwargs, timeout,
                        memory_budget + RUNTIME_ALLOWANCE_BYTES)


def _figures(measured: dict, variants: list, floors: dict, flops: float, images_per_epoch: int,
             batch_size: int) -> list[dict]:
    """Per variant the status and figures of one :func:`measure_step` (``floors``: precision -> matmul floor in s,
    ``flops``: the matmuls' work); a failed variant has its status only."""
    reference = measured["variants"][0].get("step_s")
    figures = []
    for variant, result in zip(variants, measured["variants"]):
        if result["status"] != "ok":
            figures.append({"status": result["status"]})
            continue
        step = result["step_s"]
        figures.append({"status": "ok", "step_s": step, "vs_eager": step / reference if reference else None,
                        "compile_s": result["compile_s"], "epoch_s": step * images_per_epoch / batch_size,
                        "epoch_h": step * images_per_epoch / batch_size / 3600,
                        "floor_ratio": step / floors[variant[2]],
                        "floor_ratio_after": step * result["matmul_gflops_after"] * 1e9 / flops,
                        "floor_ratio_interleaved": step * result["matmul_gflops_interleaved"] * 1e9 / flops,
                        "counted_gflop": result.get("counted_gflop"),
                        "achieved_gflops": result["counted_gflop"] / step if "counted_gflop" in result else None,
                        "peak_mem_mb": result["peak_mem_bytes"] / 2**20, "memory_method": measured["memory_method"]})
    return figures


def _unsupported_reason(precision: str, device: str) -> str | None:
    """Why ``precision`` is not timed on this device (bf16 on a CPU without bf16 hardware), or None."""
    return cpu_bf16_support().unsupported_reason() if precision == "bf16" and device == "cpu" else None


def _check_arguments(mechanisms, resolutions, model: str, precisions: list[str]) -> list[int]:
    """Raise UserError on an unknown mechanism, model or precision; the resolutions as sorted ints."""
    for name in mechanisms:
        try:
            get_attention_class(name)
        except ValueError as error:  # an unknown name: the message lists the valid ones
            raise UserError(str(error)) from None
    if model not in available_models():
        raise UserError(f"unknown model {model!r}; available: {', '.join(available_models())}")
    for precision in precisions:
        if precision not in DTYPES:
            raise UserError(f"precision must be one of {sorted(DTYPES)}, got {precision!r}")
    if not precisions or len(set(precisions)) != len(precisions):
        raise UserError(f"precisions must be given once each, got {precisions}")
    resolutions = sorted(int(r) for r in resolutions)
    if not resolutions or resolutions[0] <= 0:
        raise UserError(f"resolutions must be positive integers, got {resolutions}")
    return resolutions


TABLE = [("mechanism", "mechanism", ""), ("resolution", "px", ""), ("tokens", "N", ""), ("variant", "variant", ""),
         ("step_s", "step s", ".3f"), ("vs_eager", "vs eager", ".2f"), ("compile_s", "compile s", ".1f"),
         ("epoch_h", "epoch h", ".2f"), ("matmul_floor_s", "floor s", ".3f"),
         ("floor_ratio", "step/floor", ".2f"), ("floor_ratio_interleaved", "step/floor (rounds)", ".2f"),
         ("peak_mem_mb", "peak MiB", ".0f"), ("status", "status", "")]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mechanisms", type=comma_list, default=list(DEFAULT_MECHANISMS),
                        help="comma-separated registry names (default: %(default)s)")
    parser.add_argument("--resolutions", type=comma_list, default=[str(r) for r in DEFAULT_RESOLUTIONS],
                        help="comma-separated image sizes in pixels (default: %(default)s)")
    parser.add_argument("--model", default="vit2d", help="model preset (default: vit2d; vit2d_small for a smoke run)")
    parser.add_argument("--batch-size", type=int, default=1, help="images per training step")
    parser.add_argument("--precision", type=comma_list, default=["fp32"],
                        help="fp32, bf16 (autocast) or both side by side, e.g. fp32,bf16 (default: fp32)")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per configuration (the median is kept)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before the timed ones")
    parser.add_argument("--time-budget", type=float, default=120.0,
                        help="seconds per training step before larger resolutions are skipped")
    parser.add_argument("--memory-budget-gb", type=float, default=8.0,
                        help="GiB of peak memory before larger resolutions are skipped")
    parser.add_argument("--images-per-epoch", type=int, default=15000,
                        help="images of the epoch whose time is reported")
    add_device_options(parser)
    parser.add_argument("--compile", action="store_true",
                        help="also measure each step with torch.compile(model, fullgraph=True), in the same process")
    parser.add_argument("--activation-checkpointing", action="store_true",
                        help="also measure each step with per-block activation checkpointing, in the same process")
    parser.add_argument("--out", default="reports/bench-scaling", help="output folder (default: %(default)s)")
    add_overwrite(parser)


def run(args: argparse.Namespace) -> int:
    device = run_device(args)
    _check_arguments(args.mechanisms, args.resolutions, args.model, args.precision)  # before measuring
    out = results_folder(args.out, ["scaling"], args.overwrite, ("scaling.png",))
    rates = measure_rates(device=device)
    print(f"matmul GFLOP/s: {rates.matmul_gflops}; bandwidth {rates.bandwidth_gbs:.1f} GB/s", flush=True)
    rows = run_scaling_bench(
        args.mechanisms, args.resolutions, args.model, args.batch_size, args.precision,
        args.repeats, args.warmup, args.time_budget, args.memory_budget_gb, args.images_per_epoch, device, rates,
        not args.no_isolate, args.threads, verbose=True, compile=args.compile,
        activation_checkpointing=args.activation_checkpointing,
    )
    env = {**environment(args.precision[0], device), "rates": rates.as_dict()}
    csv_path, json_path = write_results(rows, out, "scaling", env)
    print(format_table(rows, TABLE))
    print(f"wrote {csv_path} and {json_path}")
    from .plots import close, scaling_figure

    figure = scaling_figure(rows)
    if figure is None:
        print("matplotlib is not installed: no PNG written")
    else:
        print(f"wrote {out.save_figure('scaling.png', figure, dpi=figure.dpi)}")
        close(figure)
    return 0
