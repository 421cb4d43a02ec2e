"""Train the pixel-wise transformer (BinaryFormer Appendix B) once per binary mechanism, on CPU.

SYNTHETIC task (no download): ``size`` x ``size`` grey images (default 10) of unit Gaussian noise
whose left half is brighter by +-0.25 (class 1) or darker (class 0). No single pixel tells the class
(contrast 0.25 against noise 1), so the tokens must be averaged across the image by attention.
Every mechanism gets the same data, initial seed, optimiser and step budget; the report is test
accuracy and AUROC; the binary mechanisms' test forward runs on the bit kernel (eval + no_grad).

    .venv/bin/python benchmarks/binary_pixel_training.py            # a few minutes on 2 cores
    .venv/bin/python benchmarks/binary_pixel_training.py --steps 30  # quicker, noisier

The model is much smaller than the paper's (N = 100 tokens, D = 32, 2 blocks vs N = 1,024, D = 384,
8 blocks) so that it trains in minutes on a CPU; the figures are not comparable to the paper's Table 2.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from medattn.models.pixel import PixelTransformer

MECHANISMS = ["softmax", "binary-ste", "binary-sg", "binary-hamming", "binary-bernoulli"]


def halves(n: int, size: int = 10, contrast: float = 0.25, noise: float = 1.0, seed: int = 0):
    """(n, 1, size, size) images and (n,) labels: 1 if the left half is brighter, 0 if the right one is.

    Each pixel is ``noise * N(0, 1) +- contrast``, far below the noise, so no pixel tells the class:
    the tokens must be averaged across the image (attention) before the max pooling.
    """
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    sign = (2 * y - 1).float()[:, None, None, None]  # +1: left brighter
    side = torch.ones(size, size)
    side[:, size // 2 :] = -1
    return noise * torch.randn(n, 1, size, size, generator=g) + contrast * sign * side, y


def auroc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Mann-Whitney AUROC (ties count one half)."""
    pos, neg = scores[labels == 1], scores[labels == 0]
    greater = (pos[:, None] > neg[None, :]).float().sum() + 0.5 * (pos[:, None] == neg[None, :]).float().sum()
    return float(greater / (len(pos) * len(neg)))


def train_one(attention: str, data, args) -> dict:
    (xtr, ytr), (xte, yte) = data
    torch.manual_seed(args.seed)
    kwargs = {"value_dim": args.value_dim} if attention.startswith("binary") and args.value_dim else {}
    model = PixelTransformer(in_chans=1, num_classes=2, embed_dim=args.dim, depth=args.depth, num_heads=4,
                             mlp_dim=4 * args.dim, attention=attention, attention_kwargs=kwargs)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    g = torch.Generator().manual_seed(args.seed)
    started = time.perf_counter()
    model.train()
    for _ in range(args.steps):
        idx = torch.randint(0, len(xtr), (args.batch_size,), generator=g)
        loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    train_s = time.perf_counter() - started
    model.eval()
    started = time.perf_counter()
    with torch.no_grad():
        logits = torch.cat([model(xte[i : i + 100]) for i in range(0, len(xte), 100)])
    infer_s = time.perf_counter() - started
    prob = logits.softmax(-1)[:, 1]
    accuracy = float((logits.argmax(-1) == yte).float().mean())
    return dict(attention=attention, final_train_loss=loss.item(), accuracy=accuracy, auroc=auroc(prob, yte),
                train_s=train_s, infer_s=infer_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--size", type=int, default=10, help="image side (N = size^2 tokens)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--value-dim", type=int, default=8, help="per-head D_v of the binary mechanisms (0: head dim)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mechanisms", nargs="+", default=MECHANISMS)
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.size < 2:
        raise ValueError("--size must be at least 2")
    data = halves(2000, args.size, seed=1), halves(500, args.size, seed=2)
    print(f"SYNTHETIC brighter-half task, {args.size}x{args.size} pixels as tokens (N={args.size ** 2}); "
          f"{args.steps} steps x batch {args.batch_size}; test set 500 images")
    print(f"{'attention':18s} {'train loss':>10s} {'accuracy':>9s} {'AUROC':>7s} {'train s':>8s} {'infer s':>8s}")
    for name in args.mechanisms:
        r = train_one(name, data, args)
        print(f"{r['attention']:18s} {r['final_train_loss']:10.3f} {r['accuracy']:9.3f} {r['auroc']:7.3f} "
              f"{r['train_s']:8.1f} {r['infer_s']:8.2f}", flush=True)


if __name__ == "__main__":
    main()
