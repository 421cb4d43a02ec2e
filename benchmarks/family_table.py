"""The realistic family's table (issue 48): per bag task, each compare arm's test score with the candidate its recipe
search chose, beside an independent model on pooled features fitted here.

The independent model reads each bag as the mean and the maximum of its standardised tile features (2F numbers),
standardised over the training bags: a logistic regression (binary; C chosen by 5-fold cross-validation on the
training split, scikit-learn's LogisticRegressionCV) or a ridge regression (regression; RidgeCV, alphas 1e-3..1e3)
fitted on the training split and scored on the test split (AUROC; Pearson r and R^2). Survival tasks are scored by
``benchmarks/independent_survival.py``.

    medattn realistic --out bench --tasks ihc_rare retina_count
    medattn compare bench/ihc_rare/config.yaml --attention seqnorm --models abmil_small --seeds 0 --out cmp/ihc_rare
    python benchmarks/family_table.py bench cmp --tasks ihc_rare retina_count

Writes ``--out`` (JSON) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import h5py
import numpy as np
import yaml


def pooled_bags(folder: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict]:
    """split -> (bags, 2F) mean and max of the tile features (standardised with the training tiles' statistics),
    split -> targets, and the task's data section."""
    data = yaml.safe_load((folder / "config.yaml").read_text())["data"]
    with open(folder / "clinical.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    with open(folder / "slides.csv", newline="") as f:
        slides = {r["PATIENT"]: r["FILENAME"] for r in csv.DictReader(f)}
    bags = {}
    for r in rows:
        with h5py.File(folder / "features" / f"{slides[r['PATIENT']]}.h5") as h5:
            bags[r["PATIENT"]] = np.asarray(h5["features"], dtype=np.float64)
    train = np.concatenate([bags[r["PATIENT"]] for r in rows if r["split"] == "train"])
    mean, std = train.mean(0), train.std(0) + 1e-8
    pooled, targets = {}, {}
    for split in ("train", "test"):
        chosen = [r for r in rows if r["split"] == split]
        standard = [(bags[r["PATIENT"]] - mean) / std for r in chosen]
        pooled[split] = np.stack([np.concatenate([b.mean(0), b.max(0)]) for b in standard])
        targets[split] = np.array([float(r[data["label_columns"]]) for r in chosen])
    return pooled, targets, data


def independent(folder: Path) -> dict:
    """The pooled-feature model's test score on one task (module docstring)."""
    from sklearn.linear_model import LogisticRegressionCV, RidgeCV
    from sklearn.metrics import r2_score, roc_auc_score
    from sklearn.preprocessing import StandardScaler

    pooled, targets, data = pooled_bags(folder)
    scaler = StandardScaler().fit(pooled["train"])
    x_train, x_test = scaler.transform(pooled["train"]), scaler.transform(pooled["test"])
    if data.get("task_type", "binary") == "binary":
        model = LogisticRegressionCV(Cs=10, cv=5, max_iter=5000).fit(x_train, targets["train"])
        return {"model": "logistic on mean+max pooled features",
                "auroc": float(roc_auc_score(targets["test"], model.predict_proba(x_test)[:, 1]))}
    model = RidgeCV(alphas=np.logspace(-3, 3, 13)).fit(x_train, targets["train"])
    predicted = model.predict(x_test)
    return {"model": "ridge on mean+max pooled features", "pearson_r": float(np.corrcoef(predicted,
                                                                                           targets["test"])[0, 1]),
            "r2": float(r2_score(targets["test"], predicted))}


def arms(compare_folder: Path) -> dict[str, list[dict]]:
    """arm -> per seed: the test score, whether it learned and the recipe it chose, from each run's results.json."""
    out = {}
    for results_file in sorted(compare_folder.glob("*/seed_*/results.json")):
        results = json.loads(results_file.read_text())
        test, metric = results["test"], results["metric"]
        record = results.get("recipe") or {}
        out.setdefault(results_file.parent.parent.name, []).append({
            "seed": results_file.parent.name, "metric": metric, "test": test.get(metric),
            "pearson_r": test.get("pearson_r"), "learned": results.get("learning", {}).get("learned"),
            "recipe": record.get("chosen") or record.get("reason")})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tasks_root", type=Path, help="the folder medattn realistic wrote")
    parser.add_argument("compare_root", type=Path, help="a folder of compare folders, one per task")
    parser.add_argument("--tasks", nargs="+", required=True)
    parser.add_argument("--out", type=Path, default=Path("family_table.json"))
    args = parser.parse_args()
    table = {task: {"independent": independent(args.tasks_root / task), "arms": arms(args.compare_root / task)}
             for task in args.tasks}
    args.out.write_text(json.dumps(table, indent=1))
    print("| task | arm | test score | Pearson r | learned | recipe chosen |\n|---|---|---|---|---|---|")
    for task, found in table.items():
        ref = found["independent"]
        print(f"| {task} | {ref['model']} | {ref.get('auroc', ref.get('r2')):.3f} | "
              f"{ref.get('pearson_r', float('nan')):.3f} | | |")
        for arm, seeds in found["arms"].items():
            for s in seeds:
                r = "" if s["pearson_r"] is None else f"{s['pearson_r']:.3f}"
                print(f"| {task} | {arm} ({s['seed']}) | {s['metric']} {s['test']:.3f} | {r} | {s['learned']} | "
                      f"{s['recipe']} |")


if __name__ == "__main__":
    main()
