"""Train a segmentation network with and without the PAM on the SYNTHETIC vertebra task; per-seed Dice.

A pair is a network without PAM and its parameter-matched PAM twin (the one without PAM gets extra
first-layer channels so that it has at least as many parameters): ``unet`` = 3D U-Net vs U-PAM-Net
(the ``unet3d`` / ``upamnet`` presets), ``dilated`` = Dil.FCN vs Dil.FCN+PAM (``dilated_fcn`` /
``dilated_fcn_pam``). Both members of a pair see the same samples in the same order, from the same
seed, with the same steps, batch size, Adam learning rate and soft Dice loss. Each seed draws its own
data set (shared by the two members). A forward hook counts the PAM's calls, so a run whose PAM never
ran cannot pass for a PAM run. Self-contained (a minimal loop, not ``medattn train``)::

    OMP_NUM_THREADS=1 python benchmarks/pam_segmentation_training.py --model-pair unet dilated \\
        --seeds 0 1 2 --steps 200 --threads 1 --json pam_pairs.json

The presets' U-Net has one down-sampling, so its receptive field (about 18 voxels along the column) spans
about two blobs of the 64-voxel column: labelling a blob by its rank in the column then needs non-local
context. ``--depth 2`` (about 40 voxels) lets the plain U-Net solve the task on its own.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from medattn.generators.synthetic_vertebrae import SyntheticVertebrae
from medattn.models import create_model
from medattn.models.segmentation import dice_per_class, soft_dice_loss
from medattn.models.segmentation.blocks import count_parameters

PAIRS = {"unet": ("unet3d", "upamnet"), "dilated": ("dilated_fcn", "dilated_fcn_pam")}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-pair", nargs="+", choices=sorted(PAIRS), default=["unet"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--train-size", type=int, default=64)
    parser.add_argument("--val-size", type=int, default=16)
    parser.add_argument("--depth", type=int, default=None, help="U-Net depth (default: the preset's)")
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


def build(preset: str, num_classes: int, depth: int | None) -> torch.nn.Module:
    kwargs = {"num_classes": num_classes}
    if depth is not None and preset in PAIRS["unet"]:
        kwargs["depth"] = depth
    return create_model(preset, **kwargs)


def train_and_evaluate(preset: str, seed: int, args, train, val) -> dict:
    torch.manual_seed(seed)
    net = build(preset, train.num_classes, args.depth)
    pam_calls = []  # one entry per forward call of the PAM
    if net.pam is not None:
        net.pam.register_forward_hook(lambda module, inputs, output: pam_calls.append(1))
    optimizer = torch.optim.Adam(net.parameters(), lr=args.lr)
    started = time.perf_counter()
    net.train()
    for step, (image, label) in enumerate(batches(train, args.batch_size, args.steps, seed)):
        loss = soft_dice_loss(net(image), label)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"  seed {seed} {preset:15s} step {step:4d} loss {loss.item():.4f}", flush=True)
    train_seconds = time.perf_counter() - started
    train_pam_calls = len(pam_calls)
    net.eval()
    scores = []
    with torch.no_grad():
        for i in range(len(val)):
            image, label = val[i]
            prediction = net(image.unsqueeze(0)).argmax(1)[0]
            scores.append(dice_per_class(prediction, label, train.num_classes))
    per_class = torch.stack(scores).nanmean(0)[1:]  # foreground classes, mean over volumes
    return {"model": preset, "seed": seed, "parameters": count_parameters(net),
            "pam_calls_train": train_pam_calls, "pam_calls_eval": len(pam_calls) - train_pam_calls,
            "train_seconds": round(train_seconds, 1), "seconds_per_step": round(train_seconds / args.steps, 3),
            "dice_per_class": [round(x, 4) for x in per_class.tolist()],
            "mean_dice": round(per_class.mean().item(), 4)}


def machine() -> dict:
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as handle:
            model = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": model, "torch": torch.__version__, "threads": torch.get_num_threads()}


def summary(results: list[dict]) -> list[dict]:
    rows = []
    for preset in dict.fromkeys(r["model"] for r in results):
        dice = [r["mean_dice"] for r in results if r["model"] == preset]
        rows.append({"model": preset, "mean_dice": round(statistics.mean(dice), 4),
                     "std_dice": round(statistics.stdev(dice), 4) if len(dice) > 1 else None})
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    results = []
    for pair in args.model_pair:
        for seed in args.seeds:
            train = SyntheticVertebrae(args.train_size, seed=seed, split="train")
            val = SyntheticVertebrae(args.val_size, seed=seed, split="val")
            results += [train_and_evaluate(preset, seed, args, train, val) for preset in PAIRS[pair]]
    header = " ".join(f"blob{k}" for k in range(1, len(results[0]["dice_per_class"]) + 1))
    print(f"\n{'seed':>4s} {'model':15s} {'params':>8s} {'s/step':>7s} {'PAM calls':>10s}  {header}   mean")
    for r in results:
        print(f"{r['seed']:4d} {r['model']:15s} {r['parameters']:8d} {r['seconds_per_step']:7.3f} "
              f"{r['pam_calls_train']:5d}+{r['pam_calls_eval']:<4d}  "
              + " ".join(f"{d:5.3f}" for d in r["dice_per_class"]) + f"  {r['mean_dice']:5.3f}")
    rows = summary(results)
    for row in rows:
        print(f"mean {row['model']:15s} {row['mean_dice']:.4f} (std {row['std_dice']})")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "machine": machine(), "results": results, "summary": rows},
                      handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
