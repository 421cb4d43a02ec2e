"""What checking every file before training costs, against one training epoch (issue 26's target: at most 5%).

Writes an image table of real-size PNGs (256 x 256, 8-bit; generated, SYNTHETIC) and a volume table of NIfTI
volumes, then for each: the time of :func:`medattn.data.validate.decode_all` (every file of every split decoded
once; then again, answered by its cache) and of one training epoch of the kind's CPU preset, in one process,
medians of ``--repeats``. The demo's data are generated in memory: nothing to check there.

    python benchmarks/validation_cost.py --out benchmarks/results/issue26_validation
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def image_table(root: Path, n: int) -> dict:
    from PIL import Image

    rng = np.random.default_rng(0)
    lines = ["path,label"]
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (256, 256), dtype=np.uint8)).save(root / f"{i}.png")
        lines.append(f"{i}.png,{i % 2}")
    (root / "images.csv").write_text("\n".join(lines) + "\n")
    return {"kind": "image_table", "csv": str(root / "images.csv"), "label_columns": ["label"], "image_size": 64,
            "in_chans": 1}


def volume_table(root: Path, n: int) -> dict:
    import nibabel as nib

    rng = np.random.default_rng(1)
    lines = ["path,label"]
    for i in range(n):
        nib.save(nib.Nifti1Image(rng.normal(size=(96, 96, 48)).astype(np.float32), np.eye(4)), root / f"{i}.nii.gz")
        lines.append(f"{i}.nii.gz,{i % 2}")
    (root / "volumes.csv").write_text("\n".join(lines) + "\n")
    return {"kind": "volume_table", "csv": str(root / "volumes.csv"), "label_columns": ["label"],
            "target_size": [32, 32, 16]}


def measure(data_cfg: dict, model: str, repeats: int, root: Path) -> dict:
    from medattn.bench.common import environment
    from medattn.config import load_config
    from medattn.data import build_datasets
    from medattn.data.validate import decode_all
    from medattn.train import fit

    bundle = build_datasets(data_cfg, seed=0)
    checks, repeated = [], []
    for r in range(repeats):
        os.environ["MEDATTN_CACHE_DIR"] = str(root / f"cache_{data_cfg['kind']}_{r}")  # a first run: nothing cached
        start = time.perf_counter()
        decode_all(bundle, progress=False)
        checks.append(time.perf_counter() - start)
        start = time.perf_counter()
        decode_all(bundle, progress=False)  # the same files again: answered by the cache
        repeated.append(time.perf_counter() - start)
    config = load_config(None, [f"data.kind={data_cfg['kind']}", f"model.name={model}", "train.epochs=1",
                                "train.threads=2", "eval.bootstrap=0", "train.skip_bad=true"])  # no check inside
    config["data"] = data_cfg
    epochs = []
    for r in range(repeats):
        results = fit(config, bundle, root / f"run_{model}_{r}", progress=False, log=lambda m: None)
        epochs.append(results["train_seconds"])
    check, again, epoch = statistics.median(checks), statistics.median(repeated), statistics.median(epochs)
    return {"data": data_cfg["kind"], "model": model, "files": sum(len(getattr(bundle, s)) for s in
                                                                     ("train", "val", "test")),
            "check_seconds": check, "repeated_check_seconds": again, "epoch_seconds": epoch,
            "ratio": check / epoch, "repeated_ratio": again / epoch, "repeats": repeats,
            "epoch": "one epoch of training and validation (results.json train_seconds)",
            "environment": environment()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--volumes", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "i").mkdir()
        (root / "v").mkdir()
        rows.append(measure(image_table(root / "i", args.images), "vit2d_small", args.repeats, root))
        rows.append(measure(volume_table(root / "v", args.volumes), "vit3d_small", args.repeats, root))
    for row in rows:
        print(f"{row['data']:13s} {row['files']:4d} files: check {row['check_seconds']:.2f} s (again: "
              f"{row['repeated_check_seconds']:.3f} s), one epoch ({row['model']}) {row['epoch_seconds']:.2f} s, "
              f"ratio {row['ratio']:.1%} (again: {row['repeated_ratio']:.2%})")
    (args.out / "validation_cost.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
