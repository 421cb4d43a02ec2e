"""Training-step time and memory of a ViT versus image resolution, per mechanism (the paper's Figure 2).

For each mechanism (default softmax, sima, seqnorm) and resolution (default 224, 512, 1024, 2048, i.e.
N = 196 ... 16,384 patches of 16 for ``vit2d``), one training step of the model preset at batch size
``--batch-size``: forward, binary cross-entropy loss, backward, AdamW step. Reported: the median step
time, the epoch time it implies for ``--images-per-epoch`` images, the peak memory, and the step's
matmul floor, i.e. the FLOPs of every ``nn.Linear`` and convolution (qkv and output projections, MLP,
patch embedding, head) forward and backward at the measured matmul rate, with the ratio
step time / floor. The attention cores are not in the floor: a ratio near 1 means attention is free.

Memory: each configuration runs in a fresh Python process (``--no-isolate``: in this one); the peak
RSS minus the RSS after imports, so it counts parameters, gradients, AdamW state, activations and
allocator overhead (on CUDA: ``torch.cuda.max_memory_allocated``). Configurations whose time or memory,
extrapolated from the smaller resolutions, exceed the budgets are skipped and recorded as such.
Writes ``scaling.csv``, ``scaling.json`` and ``scaling.png`` (time per epoch and memory vs resolution).

    medattn bench scaling --resolutions 224,512 --model vit2d --out reports/bench-scaling
"""

from __future__ import annotations

import argparse
import math
import time
from contextlib import nullcontext
from functools import partial

import torch
import torch.nn.functional as F

from medattn.attention import get_attention_class
from medattn.errors import UserError
from medattn.models import available_models, create_model
from medattn.threads import set_threads

from .attention import RUNTIME_ALLOWANCE_BYTES
from .common import (
    comma_list,
    current_rss_bytes,
    environment,
    extrapolate,
    format_table,
    median_time,
    peak_memory_bytes,
    reset_peak_memory,
    row_environment,
    run_in_process,
    run_isolated,
    write_results,
)
from .roofline import DTYPES, MachineRates, matmul_flops, measure_rates

DEFAULT_MECHANISMS = ("softmax", "sima", "seqnorm")
DEFAULT_RESOLUTIONS = (224, 512, 1024, 2048)


def measure_step(model: str, mechanism: str, resolution: int, batch_size: int = 1, precision: str = "fp32",
                 repeats: int = 3, warmup: int = 1, budget_s: float | None = None, device: str = "cpu",
                 seed: int = 0, threads: int | None = None) -> dict:
    """Median training-step time and peak memory of one configuration; meant for a fresh process.

    Returns ``{"step_s", "peak_mem_bytes", "memory_method"}``.
    """
    if threads:
        torch.set_num_threads(threads)
    baseline = current_rss_bytes() if device == "cpu" else 0
    torch.manual_seed(seed)
    reset_peak_memory(device)
    net = create_model(model, attention=mechanism, img_size=resolution, num_classes=1).to(device)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4)
    images = torch.randn(batch_size, net.in_chans, *(resolution,) * net.spatial_dims, device=device)
    targets = torch.zeros(batch_size, 1, device=device)
    autocast = torch.autocast(device, dtype=DTYPES[precision]) if precision != "fp32" else nullcontext()

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            logits = net(images)
        F.binary_cross_entropy_with_logits(logits.float(), targets).backward()
        optimizer.step()

    seconds = median_time(step, repeats=repeats, warmup=warmup, budget_s=budget_s)
    method = ("torch.cuda.max_memory_allocated" if device == "cuda"
              else "peak RSS of a fresh process minus its RSS after imports")
    return {"step_s": seconds, "peak_mem_bytes": peak_memory_bytes(device, baseline), "memory_method": method}


def run_scaling_bench(mechanisms=DEFAULT_MECHANISMS, resolutions=DEFAULT_RESOLUTIONS, model: str = "vit2d",
                      batch_size: int = 1, precision: str = "fp32", repeats: int = 3, warmup: int = 1,
                      time_budget_s: float = 120.0, memory_budget_gb: float = 8.0, images_per_epoch: int = 15000,
                      device: str | None = None, rates: MachineRates | None = None, isolate: bool = True,
                      threads: int | None = None, verbose: bool = False) -> list[dict]:
    """One row per (mechanism, resolution): step time, epoch time, peak memory, matmul floor; see module doc.

    ``time_budget_s`` bounds one training step; ``rates`` defaults to measuring them now. Skipped
    configurations are rows with a ``status`` starting with "skipped:".
    """
    resolutions = _check_arguments(mechanisms, resolutions, model, precision)
    if batch_size < 1 or repeats < 1 or images_per_epoch < 1 or time_budget_s <= 0 or memory_budget_gb <= 0:
        raise UserError("batch size, repeats, images per epoch and the budgets must be positive")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if threads:
        torch.set_num_threads(threads)
    env = environment(precision)
    env_fields = row_environment(env)
    rates = rates or measure_rates(device=device)
    memory_budget = memory_budget_gb * 2**30
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
            floor = flops / (rates.matmul_gflops[precision] * 1e9)
            row = dict(mechanism=mechanism, model=model, resolution=resolution, tokens=tokens, batch_size=batch_size,
                       precision=precision, matmul_gflop=flops / 1e9, matmul_floor_s=floor)
            status = _skip_reason(tokens, times, memories, time_budget_s, memory_budget)
            if status is None:
                kwargs = dict(model=model, mechanism=mechanism, resolution=resolution, batch_size=batch_size,
                              precision=precision, repeats=repeats, warmup=warmup, budget_s=time_budget_s,
                              device=device, threads=threads)
                started = time.perf_counter()
                if isolate:
                    timeout = (warmup + 2) * time_budget_s * 4 + 120
                    measured = run_isolated("medattn.bench.scaling:measure_step", kwargs, timeout,
                                            memory_budget + RUNTIME_ALLOWANCE_BYTES)
                else:
                    measured = run_in_process(measure_step, kwargs)
                if verbose:
                    print(f"  {mechanism} {resolution}px: {time.perf_counter() - started:.1f} s wall", flush=True)
                status = measured.get("status")
            if status is not None:
                rows.append({**row, "status": status, **env_fields})
                continue
            step = measured["step_s"]
            rows.append({**row, "status": "ok", "step_s": step, "epoch_s": step * images_per_epoch / batch_size,
                         "epoch_h": step * images_per_epoch / batch_size / 3600, "floor_ratio": step / floor,
                         "peak_mem_mb": measured["peak_mem_bytes"] / 2**20,
                         "memory_method": measured["memory_method"], **env_fields})
            times.append((tokens, step))
            memories.append((tokens, measured["peak_mem_bytes"]))
    return rows


def _check_arguments(mechanisms, resolutions, model: str, precision: str) -> list[int]:
    """Raise UserError on an unknown mechanism, model or precision; the resolutions as sorted ints."""
    for name in mechanisms:
        try:
            get_attention_class(name)
        except ValueError as error:  # an unknown name: the message lists the valid ones
            raise UserError(str(error)) from None
    if model not in available_models():
        raise UserError(f"unknown model {model!r}; available: {', '.join(available_models())}")
    if precision not in DTYPES:
        raise UserError(f"precision must be one of {sorted(DTYPES)}, got {precision!r}")
    resolutions = sorted(int(r) for r in resolutions)
    if not resolutions or resolutions[0] <= 0:
        raise UserError(f"resolutions must be positive integers, got {resolutions}")
    return resolutions


def _skip_reason(tokens, times, memories, budget_s, memory_budget) -> str | None:
    if times and times[-1][1] > budget_s:
        return f"skipped: over time budget ({times[-1][0]} tokens took {times[-1][1]:.1f} s)"
    predicted = extrapolate(times, tokens)
    if predicted is not None and predicted > budget_s:
        return f"skipped: over time budget (predicted {predicted:.1f} s per step)"
    predicted = extrapolate(memories, tokens, default_exponent=0.0, min_exponent=0.0)
    if predicted is not None and predicted > memory_budget:
        return f"skipped: over memory budget (predicted {predicted / 2**30:.1f} GiB)"
    return None


TABLE = [("mechanism", "mechanism", ""), ("resolution", "px", ""), ("tokens", "N", ""),
         ("step_s", "step s", ".3f"), ("epoch_h", "epoch h", ".2f"), ("matmul_floor_s", "floor s", ".3f"),
         ("floor_ratio", "step/floor", ".2f"), ("peak_mem_mb", "peak MiB", ".0f"), ("status", "status", "")]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mechanisms", type=comma_list, default=list(DEFAULT_MECHANISMS),
                        help="comma-separated registry names (default: %(default)s)")
    parser.add_argument("--resolutions", type=comma_list, default=[str(r) for r in DEFAULT_RESOLUTIONS],
                        help="comma-separated image sizes in pixels (default: %(default)s)")
    parser.add_argument("--model", default="vit2d", help="model preset (default: vit2d; vit2d_small for a smoke run)")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--precision", choices=sorted(DTYPES), default="fp32", help="bf16 = bf16 autocast")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--time-budget", type=float, default=120.0, help="seconds per training step")
    parser.add_argument("--memory-budget-gb", type=float, default=8.0)
    parser.add_argument("--images-per-epoch", type=int, default=15000)
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--no-isolate", action="store_true",
                        help="run every configuration in this process (faster, memory figures less clean)")
    parser.add_argument("--out", default="reports/bench-scaling", help="output folder (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.threads = set_threads(args.threads)  # isolated runs get the same count
    _check_arguments(args.mechanisms, args.resolutions, args.model, args.precision)  # before measuring
    rates = measure_rates(device=device)
    print(f"matmul GFLOP/s: {rates.matmul_gflops}; bandwidth {rates.bandwidth_gbs:.1f} GB/s", flush=True)
    rows = run_scaling_bench(
        args.mechanisms, args.resolutions, args.model, args.batch_size, args.precision,
        args.repeats, args.warmup, args.time_budget, args.memory_budget_gb, args.images_per_epoch, device, rates,
        not args.no_isolate, args.threads, verbose=True,
    )
    env = {**environment(args.precision), "rates": rates.as_dict()}
    csv_path, json_path = write_results(rows, args.out, "scaling", env)
    print(format_table(rows, TABLE))
    print(f"wrote {csv_path} and {json_path}")
    from .plots import plot_scaling

    png = plot_scaling(rows, csv_path.with_suffix(".png"))
    print(f"wrote {png}" if png else "matplotlib is not installed: no PNG written")
    return 0
