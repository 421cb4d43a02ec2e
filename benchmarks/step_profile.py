"""Where a ViT training step's time goes, by PyTorch operator: the matrix products of the linear layers
(the step's matmul floor) versus everything else (norms, GELU, residuals, copies, the attention core, the
optimizer).

Usage:  python benchmarks/step_profile.py seqnorm 512            # mechanism, image size (vit2d, batch 1)
        python benchmarks/step_profile.py sima 1024 --model vit2d_small
        python benchmarks/step_profile.py seqnorm 512 --bf16             # under bf16 autocast
        python benchmarks/step_profile.py seqnorm 1024 --compile --steps 3   # eager and compiled, in rounds

One warm-up step (two when compiled: the first compiles), then ``--steps`` profiled steps (forward, BCE loss,
backward, training's fused AdamW), with freed memory kept for reuse as training and ``medattn bench`` run
(``allocator.keep_freed_memory``). ``--compile`` adds the same model (same seed, same weights) under
``torch.compile(fullgraph=True)`` (inductor) and profiles one step of each in every round, so a change of the
machine's load falls on both alike. Prints the operator table of each variant's last step (self CPU time;
inductor's fused kernels by name) and, per variant, the median step's seconds in ``aten::mm``/``aten::addmm``
(the linear layers' GEMMs) and in everything else. Under compile the GEMMs stay these ATen calls (inductor's C++
GEMM template takes only constant weights, i.e. frozen inference), so the rest is what compile can fuse.
Threads: torch's setting (set OMP_NUM_THREADS=1 on a shared machine).
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch._inductor.config as inductor_config
from torch.profiler import ProfilerActivity, profile

from medattn.allocator import keep_freed_memory
from medattn.bench.scaling_step import training_step
from medattn.models import create_model

GEMMS = ("aten::mm", "aten::addmm")

parser = argparse.ArgumentParser()
parser.add_argument("mechanism")
parser.add_argument("resolution", type=int)
parser.add_argument("--model", default="vit2d")
parser.add_argument("--bf16", action="store_true", help="the forward under bf16 autocast, as train.precision=bf16")
parser.add_argument("--compile", action="store_true", help="also the model under torch.compile(fullgraph=True)")
parser.add_argument("--steps", type=int, default=1, help="profiled steps per variant (the median is reported)")
args = parser.parse_args()

keep_freed_memory()
inductor_config.cpp.enable_kernel_profile = True  # inductor's kernels appear in the table by name
with torch.device("meta"):
    in_chans = create_model(args.model, img_size=args.resolution).in_chans
images = torch.randn(1, in_chans, args.resolution, args.resolution, generator=torch.Generator().manual_seed(0))
targets = torch.zeros(1, 1)


def warmed_up_step(compiled: bool):
    """One variant's step function (``medattn.bench.scaling_step.training_step``: as ``bench scaling`` times it), after
    its warm-up (and compilation)."""
    step = training_step(args.model, args.mechanism, args.resolution, images, targets, compiled,
                         precision="bf16" if args.bf16 else "fp32")
    for _ in range(2 if compiled else 1):
        step()
    return step


variants = {"eager": warmed_up_step(False), **({"compiled": warmed_up_step(True)} if args.compile else {})}
seconds = {name: {"gemm": [], "rest": []} for name in variants}
tables = {}
for _ in range(args.steps):
    for name, step in variants.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events) / 1e6
        gemm = sum(e.self_cpu_time_total for e in events if e.key in GEMMS) / 1e6
        seconds[name]["gemm"].append(gemm)
        seconds[name]["rest"].append(total - gemm)
        tables[name] = events.table(sort_by="self_cpu_time_total", row_limit=20)
for name, table in tables.items():
    print(f"{name}, the last profiled step:\n{table}")
print(f"{args.model} {args.mechanism} {args.resolution} px{' bf16' if args.bf16 else ''}, "
      f"{torch.get_num_threads()} thread(s), median of {args.steps} profiled step(s) in rounds:")
for name, parts in seconds.items():
    gemm, rest = statistics.median(parts["gemm"]), statistics.median(parts["rest"])
    print(f"  {name:8s} linear-layer GEMMs (aten::mm + aten::addmm) {gemm:.2f} s, the rest {rest:.2f} s; "
          f"GEMMs {100 * gemm / (gemm + rest):.1f}% of {gemm + rest:.2f} CPU-s")
