"""Short training of a 3D U-Net and U-PAM-Net on the synthetic vertebra task; prints per-class Dice.

Both networks see the same samples in the same order, from the same seed, with Adam and the soft Dice
loss; the U-Net without PAM has extra first-layer channels so that it has at least as many parameters.
Self-contained (a minimal loop, not ``medattn train``) and bounded to a few minutes on a laptop CPU::

    python benchmarks/pam_segmentation_training.py --steps 200 --threads 1

The default U-Net has one down-sampling, so its receptive field (about 18 voxels along the column) spans
about two blobs of the 64-voxel column: labelling a blob by its rank in the column then needs non-local
context. With ``--depth 2`` (about 40 voxels) the plain U-Net already solves the task.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from medattn.data.synthetic_vertebrae import SyntheticVertebrae
from medattn.models.segmentation import UNet3D, dice_per_class, soft_dice_loss
from medattn.models.segmentation.blocks import count_parameters


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--train-size", type=int, default=64)
    parser.add_argument("--val-size", type=int, default=16)
    parser.add_argument("--base-channels", type=int, default=8)
    parser.add_argument("--depth", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    return parser.parse_args(argv)


def batches(dataset, batch_size, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    epochs = steps * batch_size // len(dataset) + 1
    order = torch.cat([torch.randperm(len(dataset), generator=gen) for _ in range(epochs)])
    for step in range(steps):
        items = [dataset[int(i)] for i in order[step * batch_size:(step + 1) * batch_size]]
        yield torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])


def train_and_evaluate(use_pam: bool, args, train, val) -> dict:
    torch.manual_seed(args.seed)
    net = UNet3D(in_chans=1, num_classes=train.num_classes, base_channels=args.base_channels,
                 depth=args.depth, use_pam=use_pam)
    optimizer = torch.optim.Adam(net.parameters(), lr=args.lr)
    started = time.perf_counter()
    net.train()
    for step, (image, label) in enumerate(batches(train, args.batch_size, args.steps, args.seed)):
        loss = soft_dice_loss(net(image), label)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0 or step == args.steps - 1:
            name = "U-PAM-Net" if use_pam else "U-Net"
            print(f"  {name:9s} step {step:4d} loss {loss.item():.4f}", flush=True)
    train_seconds = time.perf_counter() - started
    net.eval()
    scores = []
    with torch.no_grad():
        for i in range(len(val)):
            image, label = val[i]
            prediction = net(image.unsqueeze(0)).argmax(1)[0]
            scores.append(dice_per_class(prediction, label, train.num_classes))
    per_class = torch.stack(scores).nanmean(0)[1:]  # foreground classes, mean over volumes
    return {"model": "U-PAM-Net" if use_pam else "U-Net", "parameters": count_parameters(net),
            "train_seconds": round(train_seconds, 1),
            "dice_per_class": [round(x, 4) for x in per_class.tolist()],
            "mean_dice": round(per_class.mean().item(), 4)}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    train = SyntheticVertebrae(args.train_size, seed=args.seed, split="train")
    val = SyntheticVertebrae(args.val_size, seed=args.seed, split="val")
    results = [train_and_evaluate(use_pam, args, train, val) for use_pam in (False, True)]
    header = " ".join(f"blob{k}" for k in range(1, train.num_classes))
    print(f"\n{'model':10s} {'params':>8s} {'train s':>8s}  {header}   mean")
    for r in results:
        print(f"{r['model']:10s} {r['parameters']:8d} {r['train_seconds']:8.1f}  "
              + " ".join(f"{d:5.3f}" for d in r["dice_per_class"]) + f"  {r['mean_dice']:5.3f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "results": results}, handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
