"""Why the SeqNorm bag model can sit at a constant predictor's loss (issue 48's learning-dynamics finding), measured:
``vitwsi_small`` with a readout, with and without the running standardisation of its pooled vector
(``pool_norm``), trained for a few epochs on a realistic bag task, the train loss and the validation score per epoch.

The loop is the model's own training in miniature (batch 1, whole bags, AdamW with the bag models' own settings: lr
2e-4, weight decay 1e-4, constant rate; features standardised with the training split's statistics; regression
targets standardised, MSE / 2; binary labels, BCE), without medattn's run folder, so one epoch is only the model's
work. Validation: AUROC (binary) or Pearson r (regression) on the validation split.

    medattn realistic --out bench --tasks ihc_regression
    python benchmarks/bag_learning_dynamics.py bench/ihc_regression --readouts max attention --epochs 6

Writes ``--out`` (JSON: one row per readout, pool_norm and epoch; machine and versions).
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import time
from pathlib import Path

import h5py
import numpy as np
import torch
import yaml


def read_split(folder: Path, data: dict, split: str) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The bags of one split and their targets, from the task's clinical and slide tables."""
    column = data["label_columns"]
    with open(folder / "clinical.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["split"] == split]
    with open(folder / "slides.csv", newline="") as f:
        slides = {r["PATIENT"]: r["FILENAME"] for r in csv.DictReader(f)}
    bags = []
    for r in rows:
        with h5py.File(folder / "features" / f"{slides[r['PATIENT']]}.h5") as h5:
            bags.append(torch.from_numpy(np.asarray(h5["features"])))
    return bags, torch.tensor([float(r[column]) for r in rows])


def train(folder: Path, readout: str, pool_norm: bool, epochs: int, seed: int) -> list[dict]:
    from sklearn.metrics import roc_auc_score

    from medattn.models import create_model

    data = yaml.safe_load((folder / "config.yaml").read_text())["data"]
    (bags, y), (val_bags, val_y) = read_split(folder, data, "train"), read_split(folder, data, "val")
    binary = data.get("task_type", "binary") == "binary"
    mean, std = y.mean(), y.std()
    features = torch.cat(bags)
    torch.manual_seed(seed)
    model = create_model("vitwsi_small", attention="seqnorm", feature_dim=features.shape[1], readout=readout,
                         pool_norm=pool_norm)
    model.feature_norm.set_statistics(features.mean(0), features.std(0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=1e-4)
    order, rows = torch.Generator().manual_seed(seed), []
    for epoch in range(1, epochs + 1):
        started, total = time.time(), 0.0
        model.train()
        for i in torch.randperm(len(bags), generator=order).tolist():
            out = model(bags[i][None]).flatten()
            if binary:
                loss = torch.nn.functional.binary_cross_entropy_with_logits(out, y[i:i + 1])
            else:
                loss = 0.5 * ((out - (y[i:i + 1] - mean) / std) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        model.eval()
        with torch.no_grad():
            scores = torch.cat([model(b[None]).flatten() for b in val_bags]).numpy()
        val = roc_auc_score(val_y, scores) if binary else float(np.corrcoef(scores, val_y)[0, 1])
        rows.append({"readout": readout, "pool_norm": pool_norm, "epoch": epoch, "train_loss": total / len(bags),
                     "val_auroc" if binary else "val_pearson_r": float(val), "seconds": time.time() - started})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task", type=Path, help="a realistic bag task folder (medattn realistic)")
    parser.add_argument("--readouts", nargs="+", default=["max", "attention"])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bag_learning_dynamics.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [row for readout in args.readouts for pool_norm in (False, True)
            for row in train(args.task, readout, pool_norm, args.epochs, args.seed)]
    machine = {"processor": platform.processor() or platform.machine(), "torch": torch.__version__, "threads": 1}
    args.out.write_text(json.dumps({"task": str(args.task), "machine": machine, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
