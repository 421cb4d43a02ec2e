"""How much a bag task's split decides the independent model's score (issue 48): the pooled-feature model of
``family_table.py`` (logistic, ridge or penalised Cox on each bag's mean and maximum feature) fitted on the task's
own training split and scored on its test split, beside the same model over random re-splits of the same patients
(as many training and test patients as the task's split; as many set aside as its validation split).

A test score far out in the re-splits' distribution says that one split's score is that split's luck, not what the
pooled features carry for patients of this kind; a bag model's distance to it is then measured against luck.

    python benchmarks/split_luck.py bench --tasks ihc_survival ihc_bags --resplits 100

Writes ``--out`` (JSON) and prints one Markdown row per task: the task's split, the re-splits' mean (SD), 5th and
95th percentiles, and the share of re-splits scoring at least the task's split.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from family_table import independent, pooled_bags


def resplit_scores(pooled: dict, targets: dict, data: dict, resplits: int, seed: int = 0) -> list[float]:
    """The independent model's test score over ``resplits`` random partitions of the task's patients into as many
    training, validation (unused) and test patients as its own split (``numpy.random.default_rng(seed)``)."""
    splits = ("train", "val", "test")
    every = np.concatenate([pooled[s] for s in splits])
    columns = list(targets["train"])
    values = {c: np.concatenate([targets[s][c] for s in splits]) for c in columns}
    n_train, n_test = len(pooled["train"]), len(pooled["test"])
    rng = np.random.default_rng(seed)
    scores = []
    for _ in range(resplits):
        order = rng.permutation(len(every))
        rows = {"train": order[:n_train], "test": order[len(every) - n_test:]}
        scores.append(independent({s: every[r] for s, r in rows.items()},
                                  {s: {c: values[c][r] for c in columns} for s, r in rows.items()}, data)["test"])
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tasks_root", type=Path, help="the folder medattn realistic wrote")
    parser.add_argument("--tasks", nargs="+", required=True)
    parser.add_argument("--resplits", type=int, default=100)
    parser.add_argument("--out", type=Path, default=Path("split_luck.json"))
    args = parser.parse_args()
    found = {}
    print("| task | metric | independent model, the task's split | the same over re-splits: mean (SD) | 5th-95th "
          "percentile | re-splits scoring at least the task's split |\n|---|---|---|---|---|---|")
    for task in args.tasks:
        pooled, targets, data, _ = pooled_bags(args.tasks_root / task)
        own = independent(pooled, targets, data)
        scores = resplit_scores(pooled, targets, data, args.resplits)
        found[task] = {"model": own["model"], "metric": own["metric"], "split": own["test"], "resplits": scores}
        low, high = np.percentile(scores, [5, 95])
        print(f"| {task} | {own['metric']} | {own['model']}: {own['test']:.3f} | {np.mean(scores):.3f} "
              f"({np.std(scores, ddof=1):.3f}) | {low:.3f} to {high:.3f} | "
              f"{np.mean(np.asarray(scores) >= own['test']):.0%} of {args.resplits} |", flush=True)
    args.out.write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
