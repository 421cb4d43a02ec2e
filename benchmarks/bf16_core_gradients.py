"""What the bf16 SeqNorm core adds to bf16 autocast's error, on a whole model: gradients and logits against fp32.

Usage:  python benchmarks/bf16_core_gradients.py [--seeds 0 1 2] [--resolution 128] [--batch 4] [--threads 1]

A ``vit2d_small`` SeqNorm classifier (one channel, random weights of the seed, its norms' affines moved off 1 and 0
by 0.2 x N(0, 1)) and a SYNTHETIC batch (N(0.5, 1) pixels, labels 0/1); one loss and backward in fp32, then under
bf16 autocast with the bf16 core (as shipped) and with the float32 core it had before
(:func:`medattn.bench.casts.float32_seqnorm_core`).
Prints, per seed and core, the relative error and the cosine of the whole gradient vector and the relative error of
the logits, each against fp32. Any CPU: without bf16 hardware the bf16 products are emulated (slow, same arithmetic).
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from medattn.bench.casts import float32_seqnorm_core
from medattn.models import create_model


def loss_and_gradients(net, images, labels, bf16: bool, bf16_core: bool):
    """Flattened parameter gradients and logits of one BCE loss, under bf16 autocast or in fp32."""
    net.zero_grad()
    with nullcontext() if bf16_core else float32_seqnorm_core():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = net(images).float()
        F.binary_cross_entropy_with_logits(logits, labels).backward()
    return torch.cat([p.grad.flatten() for p in net.parameters() if p.grad is not None]), logits.detach()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--resolution", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for seed in args.seeds:
        torch.manual_seed(seed)
        net = create_model("vit2d_small", attention="seqnorm", img_size=args.resolution, num_classes=1, in_chans=1)
        with torch.no_grad():
            for name, parameter in net.named_parameters():
                if "_norm." in name:
                    parameter.add_(0.2 * torch.randn_like(parameter))
        images = torch.randn(args.batch, 1, args.resolution, args.resolution) + 0.5
        labels = (torch.arange(args.batch) % 2).float().unsqueeze(1)
        reference, reference_logits = loss_and_gradients(net, images, labels, bf16=False, bf16_core=False)
        for core, bf16_core in (("float32 core", False), ("bf16 core", True)):
            grads, logits = loss_and_gradients(net, images, labels, bf16=True, bf16_core=bf16_core)
            print(f"seed {seed}, bf16 autocast, {core}: gradient relative error "
                  f"{((grads - reference).norm() / reference.norm()).item():.4f}, cosine "
                  f"{F.cosine_similarity(grads, reference, dim=0).item():.5f}; logits relative error "
                  f"{((logits - reference_logits).norm() / reference_logits.norm()).item():.4f}", flush=True)


if __name__ == "__main__":
    main()
