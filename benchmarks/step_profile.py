"""Where a ViT training step's time goes, by PyTorch operator: the matrix products of the linear layers
(the step's matmul floor) versus everything else (norms, GELU, residuals, copies, the attention core, the
optimizer).

Usage:  python benchmarks/step_profile.py seqnorm 512            # mechanism, image size (vit2d, batch 1)
        python benchmarks/step_profile.py sima 1024 --model vit2d_small
        python benchmarks/step_profile.py seqnorm 512 --bf16             # under bf16 autocast

One warm-up step, then one profiled step (forward, BCE loss, backward, training's fused AdamW). Prints the
operator table (self CPU time) and the share of ``aten::mm``/``aten::addmm`` (the linear layers' GEMMs).
Threads: torch's setting (set OMP_NUM_THREADS=1 on a shared machine).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from medattn.config import DEFAULTS
from medattn.models import create_model
from medattn.train.optim import make_optimizer

parser = argparse.ArgumentParser()
parser.add_argument("mechanism")
parser.add_argument("resolution", type=int)
parser.add_argument("--model", default="vit2d")
parser.add_argument("--bf16", action="store_true", help="the forward under bf16 autocast, as train.precision=bf16")
args = parser.parse_args()

torch.manual_seed(0)
net = create_model(args.model, attention=args.mechanism, img_size=args.resolution, num_classes=1)
optimizer = make_optimizer(net, DEFAULTS["train"])
images = torch.randn(1, net.in_chans, args.resolution, args.resolution)
targets = torch.zeros(1, 1)


def step() -> None:
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
        logits = net(images)
    F.binary_cross_entropy_with_logits(logits.float(), targets).backward()
    optimizer.step()


step()
with profile(activities=[ProfilerActivity.CPU]) as prof:
    step()
events = prof.key_averages()
print(events.table(sort_by="self_cpu_time_total", row_limit=20))
total = sum(e.self_cpu_time_total for e in events)
gemm = sum(e.self_cpu_time_total for e in events if e.key in ("aten::mm", "aten::addmm"))
print(f"{args.model} {args.mechanism} {args.resolution} px{' bf16' if args.bf16 else ''}, "
      f"{torch.get_num_threads()} thread(s): "
      f"linear-layer GEMMs (aten::mm + aten::addmm) {100 * gemm / total:.1f}% of {total / 1e6:.2f} CPU-s")
