"""The survival losses for bags side by side (issue 51): per arm, the test C-index and integrated Brier score over
seeds (mean and SD, and each seed), the validation C-index, the verdict, the epoch whose checkpoint was kept and the
plateau epoch (the first whose validation C-index came within ``PLATEAU`` of the run's best, from metrics.csv).

Reads run folders laid out ``ROOT/ARM/seed_N/results.json`` (each a finished ``medattn train`` run), e.g.

    for s in 0 1 2; do
      medattn train bench/retina_survival/config.yaml --out rsurv/cox_b16/seed_$s seed=$s recipe.search=false \\
          train.epochs=30 train.batch_size=16
      medattn train ... --out rsurv/cox_b16_balanced/seed_$s ... train.batch_size=16 train.event_balance=true
      medattn train ... --out rsurv/discrete_b1/seed_$s ... train.batch_size=1 train.loss=discrete_time
    done
    python benchmarks/survival_loss_table.py rsurv

and prints a Markdown table (``--out``: its rows as JSON too). The paired comparison of two arms over the same test
patients is ``benchmarks/paired_arms.py``.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from medattn.experiments.runs import mean_std, mean_std_text

PLATEAU = 0.02


def arm_rows(root: Path) -> dict[str, list[dict]]:
    """arm -> per seed: test C-index, integrated Brier score, best validation C-index, learned, best epoch."""
    arms: dict[str, list[dict]] = {}
    for path in sorted(root.glob("*/seed_*/results.json")):
        results = json.loads(path.read_text())
        test = results["test"]
        arms.setdefault(path.parent.parent.name, []).append({
            "seed": path.parent.name, "c_index": test["c_index"], "ibs": (test.get("ibs") or {}).get("value"),
            "val_c_index": results.get("val_c_index"), "learned": results["learning"]["learned"],
            "best_epoch": results["best_epoch"], "epochs": results["epochs"], "plateau_epoch": plateau(path.parent)})
    return arms


def plateau(run: Path) -> int:
    """The first epoch whose validation C-index is within :data:`PLATEAU` of the run's best (metrics.csv)."""
    with open(run / "metrics.csv", newline="") as f:
        rows = [(int(r["epoch"]), float(r["val_c_index"])) for r in csv.DictReader(f)]
    best = max(score for _, score in rows)
    return next(epoch for epoch, score in rows if score >= best - PLATEAU)


def _mean_sd(values: list) -> str:
    """``0.688 (0.019)`` over the seeds that have the value (medattn's compare summary)."""
    return mean_std_text(mean_std(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="a folder of ARM/seed_N run folders")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args()
    arms = arm_rows(args.root)
    if args.out:
        args.out.write_text(json.dumps(arms, indent=1))
    print("| arm | test C-index mean (SD) | per seed | integrated Brier score mean (SD) | validation C-index per "
          "seed | learned | kept epoch per seed | plateau epoch per seed |\n|---|---|---|---|---|---|---|---|")
    for arm, seeds in arms.items():
        per_seed = ", ".join(format(s["c_index"], ".3f") for s in seeds)
        validation = ", ".join(format(s["val_c_index"], ".3f") for s in seeds)
        kept = ", ".join(f"{s['best_epoch']}/{s['epochs']}" for s in seeds)
        reached = ", ".join(str(s["plateau_epoch"]) for s in seeds)
        print(f"| {arm} | {_mean_sd([s['c_index'] for s in seeds])} | {per_seed} | "
              f"{_mean_sd([s['ibs'] for s in seeds])} | {validation} | "
              f"{sum(bool(s['learned']) for s in seeds)} of {len(seeds)} | {kept} | {reached} |")

if __name__ == "__main__":
    main()
