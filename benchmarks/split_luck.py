"""How much a bag task's split decides the independent model's score (issue 48): the pooled-feature model of
``family_table.py`` (logistic, ridge or penalised Cox on each bag's mean and maximum feature) fitted on the task's
own training split and scored on its test split, beside the same model over random re-splits of the same patients
(as many training and test patients as the task's split; as many set aside as its validation split).

A test score far out in the re-splits' distribution says that one split's score is that split's luck, not what the
pooled features carry for patients of this kind; a bag model's distance to it is then measured against luck.

    python benchmarks/split_luck.py bench --tasks ihc_survival ihc_bags --resplits 100
    python benchmarks/split_luck.py bench --tasks ihc_survival --write-tables 5 --out luck/split_luck.json
    medattn train bench/ihc_survival/config.yaml data.clinical_table=luck/ihc_survival_resplits/resplit_0.csv \
        --out luck/runs/resplit_0                                       # and so on for each table written
    python benchmarks/split_luck.py bench --tasks ihc_survival --out luck/split_luck.json --runs luck/runs
    ... --runs luck/runs/seed_0 luck/runs/seed_1 luck/runs/seed_2      # several seeds: a folder each

Writes ``--out`` (JSON) and prints one Markdown row per task: the task's split, the re-splits' mean (SD), 5th and
95th percentiles, and the share of re-splits scoring at least the task's split; with ``--runs``, the bag model's test
score on each re-split it ran on (the mean over seeds, a folder each) beside the independent model's on the same
re-split (paired t-test over re-splits).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np
from family_table import independent, pooled_bags

SPLITS = ("train", "val", "test")


def partitions(sizes: dict[str, int], resplits: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``resplits`` random partitions of the patients, numbered as the task's splits are concatenated (train, val,
    test), into as many of each as ``sizes`` holds (``numpy.random.default_rng(seed)``) -> split -> row numbers."""
    rng = np.random.default_rng(seed)
    bounds = np.cumsum([0] + [sizes[s] for s in SPLITS])
    found = []
    for _ in range(resplits):
        order = rng.permutation(bounds[-1])
        found.append({s: order[bounds[i]:bounds[i + 1]] for i, s in enumerate(SPLITS)})
    return found


def resplit_scores(pooled: dict, targets: dict, data: dict, resplits: int, seed: int = 0) -> list[float]:
    """The independent model's test score over :func:`partitions` of the task's patients (the validation part
    unused, as the runs leave their validation split out of training)."""
    every = np.concatenate([pooled[s] for s in SPLITS])
    columns = list(targets["train"])
    values = {c: np.concatenate([targets[s][c] for s in SPLITS]) for c in columns}
    scores = []
    for rows in partitions({s: len(pooled[s]) for s in SPLITS}, resplits, seed):
        rows = {s: rows[s] for s in ("train", "test")}
        scores.append(independent({s: every[r] for s, r in rows.items()},
                                  {s: {c: values[c][r] for c in columns} for s, r in rows.items()}, data)["test"])
    return scores


def write_tables(folder: Path, split_column: str, patients: dict[str, list[str]], count: int, out: Path,
                 seed: int = 0) -> list[Path]:
    """The task's clinical table with its ``split_column`` set by each of the first ``count`` :func:`partitions`
    (those whose independent-model scores come first in the JSON) -> ``out/resplit_K.csv``: a bag model is trained
    on re-split K with ``medattn train TASK/config.yaml data.clinical_table=out/resplit_K.csv``."""
    with open(folder / "clinical.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    every = [p for s in SPLITS for p in patients[s]]
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for k, parts in enumerate(partitions({s: len(patients[s]) for s in SPLITS}, count, seed)):
        split_of = {every[i]: s for s, numbers in parts.items() for i in numbers}
        path = out / f"resplit_{k}.csv"
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows({**r, split_column: split_of[r["PATIENT"]]} for r in rows)
        written.append(path)
    return written


def paired_over_resplits(runs: list[Path], scores: list[float]) -> dict:
    """The bag model's test score on each re-split it ran on beside the independent model's on the same re-split.

    ``runs`` holds one folder per seed, each with ``resplit_K/results.json``; the re-splits that every seed ran on
    are kept, and on each the seeds' mean is the bag model's score (the re-split is the unit of the paired t-test,
    scipy's ``ttest_rel``; the seeds only steady each re-split's score) -> re-splits, the seeds' scores
    (``per_seed``: seed -> re-split), their means, the independent model's scores, the mean difference with its 95%
    t interval and p, and how many runs learned (results.json's ``learning.learned``)."""
    from scipy.stats import ttest_rel

    found = [{int(path.parent.name.split("_")[1]): json.loads(path.read_text())
              for path in folder.glob("resplit_*/results.json")} for folder in runs]
    ran = sorted(set.intersection(*(set(seed) for seed in found))) if found else []
    per_seed = [[seed[k]["test"][seed[k]["metric"]] for k in ran] for seed in found]
    model = [float(np.mean(column)) for column in zip(*per_seed)]
    reference = [scores[k] for k in ran]
    learned = [seed[k].get("learning", {}).get("learned", True) for seed in found for k in ran]
    test = ttest_rel(model, reference) if len(ran) >= 2 else None
    return {"resplits": ran, "per_seed": per_seed, "model": model, "independent": reference,
            "difference": float(np.mean(np.subtract(model, reference))) if ran else None,
            "interval": [float(x) for x in test.confidence_interval()] if test is not None else None,
            "p_value": float(test.pvalue) if test is not None else None,
            "runs_learned": int(sum(learned)), "runs": len(learned)}


def paired_text(paired: dict) -> str:
    """:func:`paired_over_resplits` in one line (saying so where no run was found, or one: no test)."""
    if not paired["resplits"]:
        return ("bag model vs independent model on re-splits: no re-split that every --runs folder holds "
                "(resplit_K/results.json)")
    rows = ", ".join(f"{k}: {m:.3f} vs {r:.3f}" for k, m, r in
                     zip(paired["resplits"], paired["model"], paired["independent"]))
    tested = "" if paired["p_value"] is None else (
        f" ({paired['interval'][0]:+.3f} to {paired['interval'][1]:+.3f}), paired t p {paired['p_value']:.3f}")
    return (f"bag model (mean of {len(paired['per_seed'])} seed(s)) vs independent model on re-splits ({rows}): "
            f"mean difference {paired['difference']:+.3f}{tested}; "
            f"{paired['runs_learned']} of {paired['runs']} runs learned")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tasks_root", type=Path, help="the folder medattn realistic wrote")
    parser.add_argument("--tasks", nargs="+", required=True)
    parser.add_argument("--resplits", type=int, default=100)
    parser.add_argument("--out", type=Path, default=Path("split_luck.json"))
    parser.add_argument("--write-tables", type=int, default=0, metavar="K",
                        help="also write the first K re-splits' clinical tables beside --out (TASK_resplits/)")
    parser.add_argument("--runs", type=Path, nargs="+", metavar="DIR",
                        help="bag model runs on those re-splits, one folder per seed (DIR/resplit_K/results.json): "
                             "paired with the independent model on each (one task)")
    args = parser.parse_args()
    found = {}
    print("| task | metric | independent model, the task's split | the same over re-splits: mean (SD) | 5th-95th "
          "percentile | re-splits scoring at least the task's split |\n|---|---|---|---|---|---|")
    for task in args.tasks:
        pooled, targets, data, patients = pooled_bags(args.tasks_root / task)
        if args.write_tables:
            write_tables(args.tasks_root / task, data["split_column"], patients, args.write_tables,
                         args.out.parent / f"{task}_resplits")
        own = independent(pooled, targets, data)
        scores = resplit_scores(pooled, targets, data, args.resplits)
        found[task] = {"model": own["model"], "metric": own["metric"], "split": own["test"], "resplits": scores}
        low, high = np.percentile(scores, [5, 95])
        print(f"| {task} | {own['metric']} | {own['model']}: {own['test']:.3f} | {np.mean(scores):.3f} "
              f"({np.std(scores, ddof=1):.3f}) | {low:.3f} to {high:.3f} | "
              f"{np.mean(np.asarray(scores) >= own['test']):.0%} of {args.resplits} |", flush=True)
        if args.runs:
            found[task]["paired"] = paired_over_resplits(args.runs, scores)
            print(paired_text(found[task]["paired"]))
    args.out.write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
