"""The realistic benchmark's table from its runs: probe, independent model, every medattn arm (mean (std) over
seeds, the did-not-learn status) and the paired bootstrap against the reference arm.

    python benchmarks/realistic_table.py TASK_FOLDER COMPARE_FOLDER [--reference-json FILE] [--csv OUT]

TASK_FOLDER is what ``medattn realistic`` wrote (probe.json, reference.json from realistic_reference.py);
COMPARE_FOLDER what ``medattn compare`` wrote (compare.json). Prints one markdown row per arm.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task_folder", type=Path)
    parser.add_argument("compare_folder", type=Path)
    parser.add_argument("--reference-json", type=Path, help="default: TASK_FOLDER/reference.json")
    parser.add_argument("--csv", type=Path, help="also write the rows as CSV")
    args = parser.parse_args()
    probe = json.loads((args.task_folder / "probe.json").read_text())["probe_auroc"]
    reference = json.loads((args.reference_json or args.task_folder / "reference.json").read_text())
    summary = json.loads((args.compare_folder / "compare.json").read_text())
    bootstrap = {t["arm"]: t for t in summary["tests"] if t["test"].startswith("paired bootstrap")}
    left_out = {t["arm"]: t for t in summary["tests"] if t["test"] == "left out"}
    rows = [["probe: " + ", ".join(probe), f"{max(probe.values()):.3f}", "", "", ""],
            [f"independent {reference['model']} ({reference['epochs']} epochs)",
             f"{reference['mean']:.3f} ({reference['std']:.3f})", "", "", ""]]
    for arm in summary["arms"]:
        test = bootstrap.get(arm["arm"])
        difference = "" if test is None or test.get("difference") is None else (
            f"{test['difference']:+.3f} ({test['ci_low']:+.3f} to {test['ci_high']:+.3f}), p {test['p_value']:.3g}")
        if arm["arm"] in left_out:
            difference = "left out (did not learn)"
        rows.append([arm["arm"], f"{arm['mean']:.3f} ({arm['std']:.3f})", " / ".join(f"{v:.3f}" for v in
                                                                                arm["per_seed"]),
                     arm["status"], difference])
    header = ["arm", "test AUROC mean (std)", "per seed", "status", f"vs {summary['reference']} (bootstrap)"]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            csv.writer(f).writerows([header, *rows])


if __name__ == "__main__":
    main()
