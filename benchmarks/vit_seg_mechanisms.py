"""Dice per attention mechanism for the ViT-S/8 segmenter's small twin on the SYNTHETIC 2D MRI-like task.

BinaryFormer's Table 1 compares softmax, sign + STE, sign with stop-gradient and Hamming attention by Dice on
2D MRI slices (§3.1); this runs the same comparison, plus SeqNorm, on the synthetic stand-in: every
mechanism trains ``vit_s8_seg_tiny`` through ``medattn train``'s training loop (:func:`medattn.train.fit`) with the
packaged ``synthetic_mri_slices`` config, the same data, seed, steps and schedule, and is scored on the same
test slices (mean foreground Dice with a 95 % bootstrap CI over test patients, Dice per class). Writes
``results.csv`` and ``results.json`` (with the machine, threads, load average and the command) under ``--out``
and one run folder per mechanism beside them::

    OMP_NUM_THREADS=1 python benchmarks/vit_seg_mechanisms.py --out reports/vit-seg-mechanisms \\
        --set train.epochs=3 --threads 1

``--set`` takes config overrides (``key=value``) applied to every mechanism. Synthetic data: the figures say
how the mechanisms compare on this task at this budget, not what they reach on AMOS, Spine or CrossModa.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

MECHANISMS = ["softmax", "binary-ste", "binary-sg", "binary-hamming", "seqnorm"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mechanisms", nargs="+", default=MECHANISMS)
    parser.add_argument("--config", default="synthetic_mri_slices")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides for every run")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True, type=Path)
    return parser.parse_args(argv)


def machine(threads: int) -> dict:
    import torch

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "threads": threads}


def run_one(mechanism: str, args, bundle) -> dict:
    from medattn.config import load_config
    from medattn.train import fit

    config = load_config(args.config, [*args.set, f"model.attention={mechanism}", f"train.threads={args.threads}"])
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    results = fit(config, bundle, args.out / mechanism, overwrite=True, progress=False, log=lambda m: None)
    seconds = time.perf_counter() - started
    test = results["test"]
    return {"mechanism": mechanism, "model": config["model"]["name"], "seed": config["seed"],
            "epochs": config["train"]["epochs"], "batch_size": config["train"]["batch_size"],
            "n_train_slices": len(bundle.train), "n_test_cases": test["n"],
            "test_dice": test["dice"], "ci_low": test["ci_low"], "ci_high": test["ci_high"],
            **{f"dice_{k}": v for k, v in list(test["dice_per_class"].items())[1:]},
            "best_epoch": results["best_epoch"], "seconds": round(seconds, 1),
            "load_average": round((load_before + os.getloadavg()[0]) / 2, 1)}


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from medattn.config import load_config
    from medattn.data import build_datasets

    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    config = load_config(args.config, args.set)
    bundle = build_datasets(config["data"], seed=config["seed"])  # one build: every mechanism sees the same slices
    rows = []
    for mechanism in args.mechanisms:
        rows.append(run_one(mechanism, args, bundle))
        row = rows[-1]
        print(f"{mechanism:15s} test Dice {row['test_dice']:.3f} (95% CI {row['ci_low']:.3f}-{row['ci_high']:.3f})  "
              f"{row['seconds']:.0f} s  load {row['load_average']}", flush=True)
    with open(args.out / "results.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    command = "OMP_NUM_THREADS=1 python " + shlex.join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    header = {"synthetic": True, "command": command, "config": args.config, "overrides": args.set,
              "machine": machine(args.threads), "results": rows}
    (args.out / "results.json").write_text(json.dumps(header, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
