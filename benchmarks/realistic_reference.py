"""Independent simple models and one-number probes on a realistic benchmark task (docs/realistic.md).

Nothing of medattn's models, training loop or data loaders is used: files are read with Pillow, nibabel and
h5py directly, the models are written here in plain torch, so they check medattn's baselines from outside.

* 2D: a 4-layer CNN (16-32-64-64 channels, batch norm, max-pool, global average pool), flips and quarter
  turns; 3D: the same in 3D on volumes z-scored and resized to 32 x 32 x 16, flips;
* bags: gated attention-MIL (Ilse et al. 2018) in 30 lines, features standardised with the training split's
  statistics, Adam lr 2e-4, weight decay 1e-5, whole bags, as CLAM trains it.

Each: Adam, the epoch with the best validation AUROC is tested. Usage:

    python benchmarks/realistic_reference.py TASK_FOLDER [--seeds 0 1 2] [--epochs 30] [--threads 1] [--out F]

writes TASK_FOLDER/reference.json (or F) (test AUROC per seed, mean, std; the probe's AUROC; machine and budget).
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from sklearn.metrics import roc_auc_score
from torch import nn


def read_images(folder: Path, data: dict) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """split -> (inputs, labels) of an image or volume table as the files hold them."""
    import nibabel as nib
    from PIL import Image

    splits: dict[str, tuple[list, list]] = {}
    for row in csv.DictReader(open(data["csv"])):
        path = Path(data["csv"]).parent / row["path"]
        if data["kind"] == "image_table":
            x = torch.from_numpy(np.asarray(Image.open(path), dtype=np.float32) / 255.0)[None]  # (1, H, W)
        else:
            v = torch.from_numpy(np.asarray(nib.load(path).get_fdata(), dtype=np.float32))
            v = (v - v.mean()) / (v.std() + 1e-6)
            x = nn.functional.interpolate(v[None, None], size=(32, 32, 16), mode="trilinear")[0]  # (1, 32, 32, 16)
        xs, ys = splits.setdefault(row["split"], ([], []))
        xs.append(x)
        ys.append(float(row["label"]))
    return {s: (torch.stack(xs), torch.tensor(ys)) for s, (xs, ys) in splits.items()}


def read_bags(data: dict) -> dict[str, tuple[list[torch.Tensor], torch.Tensor]]:
    import h5py

    files = {r["PATIENT"]: r["FILENAME"] for r in csv.DictReader(open(data["slide_table"]))}
    splits: dict[str, tuple[list, list]] = {}
    for row in csv.DictReader(open(data["clinical_table"])):
        with h5py.File(Path(data["feature_dir"]) / f"{files[row['PATIENT']]}.h5") as f:
            bag = torch.from_numpy(f["features"][:])
        bags, ys = splits.setdefault(row["split"], ([], []))
        bags.append(bag)
        ys.append(float(row["label"]))
    return {s: (bags, torch.tensor(ys)) for s, (bags, ys) in splits.items()}


def cnn(dims: int) -> nn.Module:
    conv, norm, pool = (nn.Conv2d, nn.BatchNorm2d, nn.MaxPool2d) if dims == 2 else (nn.Conv3d, nn.BatchNorm3d,
                                                                                    nn.MaxPool3d)
    layers, width = [], 1
    for out in (16, 32, 64, 64):
        layers += [conv(width, out, 3, padding=1), norm(out), nn.ReLU(), pool(2)]
        width = out
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1) if dims == 2 else nn.AdaptiveAvgPool3d(1), nn.Flatten(),
                         nn.Linear(width, 1))


class GatedABMIL(nn.Module):
    def __init__(self, features: int, hidden: int = 128, attn: int = 64) -> None:
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Dropout(0.25))
        self.v, self.u, self.w = nn.Linear(hidden, attn), nn.Linear(hidden, attn), nn.Linear(attn, 1)
        self.head = nn.Linear(hidden, 1)

    def forward(self, bag: torch.Tensor) -> torch.Tensor:  # (N, F) -> (1,)
        h = self.embed(bag)
        a = torch.softmax(self.w(torch.tanh(self.v(h)) * torch.sigmoid(self.u(h))), dim=0)  # (N, 1)
        return self.head((a * h).sum(0))


def augment(x: torch.Tensor, dims: int) -> torch.Tensor:
    for axis in range(2, 2 + dims):
        if torch.rand(()) < 0.5:
            x = x.flip(axis)
    if dims == 2:
        x = torch.rot90(x, int(torch.randint(4, ())), (2, 3))
    return x


def scores_of(model: nn.Module, inputs, bags: bool) -> np.ndarray:
    model.eval()
    with torch.no_grad():
        if bags:
            return np.array([float(model(b)) for b in inputs])
        return torch.cat([model(inputs[i:i + 64]).squeeze(1) for i in range(0, len(inputs), 64)]).numpy()


def train_once(data: dict, kind: str, seed: int, epochs: int) -> float:
    torch.manual_seed(seed)
    bags = kind == "wsi_bags"
    if bags:
        train_bags = data["train"][0]
        stacked = torch.cat(train_bags)
        mean, std = stacked.mean(0), stacked.std(0).clamp_min(1e-6)
        data = {s: ([(b - mean) / std for b in bs], y) for s, (bs, y) in data.items()}
        model = GatedABMIL(stacked.shape[1])
        optimizer = torch.optim.Adam(model.parameters(), lr=2e-4, weight_decay=1e-5)
    else:
        dims = 2 if kind == "image_table" else 3
        model = cnn(dims)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-4)
    loss_fn = nn.BCEWithLogitsLoss()
    x_train, y_train = data["train"]
    best_val, best_state = -1.0, None
    for _ in range(epochs):
        model.train()
        order = torch.randperm(len(y_train))
        if bags:
            for i in order.tolist():
                optimizer.zero_grad()
                loss_fn(model(x_train[i]), y_train[i:i + 1]).backward()
                optimizer.step()
        else:
            for start in range(0, len(order), 16):
                index = order[start:start + 16]
                optimizer.zero_grad()
                loss_fn(model(augment(x_train[index], dims)).squeeze(1), y_train[index]).backward()
                optimizer.step()
        val = roc_auc_score(data["val"][1].numpy(), scores_of(model, data["val"][0], bags))
        if val > best_val:
            best_val, best_state = val, {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(best_state)
    return float(roc_auc_score(data["test"][1].numpy(), scores_of(model, data["test"][0], bags)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task_folder", type=Path)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="result file (default: TASK_FOLDER/reference.json)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = yaml.safe_load((args.task_folder / "config.yaml").read_text())
    kind = config["data"]["kind"]
    data = read_bags(config["data"]) if kind == "wsi_bags" else read_images(args.task_folder, config["data"])
    started, results = time.time(), []
    for seed in args.seeds:
        results.append(train_once(data, kind, seed, args.epochs))
        print(f"seed {seed}: test AUROC {results[-1]:.3f}", flush=True)
    probe = json.loads((args.task_folder / "probe.json").read_text())["probe_auroc"]
    summary = {"task": args.task_folder.name, "model": "gated attention-MIL" if kind == "wsi_bags" else
               f"{'2D' if kind == 'image_table' else '3D'} 4-layer CNN", "per_seed": results,
               "mean": float(np.mean(results)), "std": float(np.std(results, ddof=1)) if len(results) > 1 else None,
               "probe_auroc": probe, "epochs": args.epochs, "threads": args.threads, "seconds": time.time() - started,
               "machine": platform.processor() or platform.machine(), "torch": torch.__version__}
    (args.out or args.task_folder / "reference.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
