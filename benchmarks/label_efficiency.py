"""Pretraining's label-efficiency curve (issue 48): test AUROC of a model trained from scratch and of the same
model started from a ``medattn pretrain`` run, at several numbers of labelled training cases, over seeds.

    medattn realistic --out bench --tasks brain_mri_2d --pool 3000
    medattn pretrain bench/brain_mri_2d/config.yaml --out pre/brain train.threads=1 pretrain.epochs=25
    python benchmarks/label_efficiency.py bench/brain_mri_2d pre/brain train.epochs=60 --out curve
    python benchmarks/label_efficiency.py bench/brain_mri_2d pre/brain train.epochs=60 --out curve_ld --sizes 50 100 \
        --fine-tune train.layer_decay=0.75
    medattn pretrain bench/ihc_bags/config.yaml --out pre/ihc_bags train.threads=1     # bags: two views of a bag
    python benchmarks/label_efficiency.py bench/ihc_bags pre/ihc_bags --out curve_bags --sizes 50 180

For each size n and seed s a class-balanced subset of n training cases is drawn (seeded by s; the validation and
test cases are always the task's own) from the table that lists the cases with their split (an image task's
``data.csv``, a bag task's ``data.clinical_table``), written as ``OUT/tables/n<n>_s<s>.csv``, and
trained twice with ``medattn train`` (``seed=s``, one thread): from scratch and with ``--init-from PRETRAIN``. Every
(size, seed, arm) run is its own folder under ``OUT/runs`` and is skipped when finished, so the script resumes.
Per size: the mean (std) of each arm, the paired t-test over seeds and the paired bootstrap over the test patients
(``medattn.experiments.compare``), written to ``OUT/label_efficiency.json`` and drawn as ``OUT/label_efficiency.png``.
Runs that learned nothing are counted, never hidden (results.json's verdict). ``--fine-tune KEY=VALUE ...`` overrides
the pretrained arm alone (how it is fine-tuned: a layer-wise learning-rate decay, a lower rate); the scratch arm is
trained as without it.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

ARMS = ("scratch", "pretrained")


def table_key(data: dict) -> str:
    """The ``data`` key of the table listing the cases and their split: ``csv`` (image and volume tables) or
    ``clinical_table`` (feature bags, whose slide table joins the patients it keeps)."""
    return "csv" if "csv" in data else "clinical_table"


def subset_table(data: dict, out: Path, size: int, seed: int) -> Path:
    """The table of the config's ``data`` section with only ``size`` of its training cases (half of each label
    where it can), seeded."""
    with open(data[table_key(data)], newline="") as f:
        rows = list(csv.DictReader(f))
    label = data["label_columns"]
    rng = np.random.default_rng(seed)
    train = [r for r in rows if r["split"] == "train"]
    chosen = []
    for value in sorted({r[label] for r in train}):
        group = [r for r in train if r[label] == value]
        chosen += [group[i] for i in rng.permutation(len(group))[:size // 2]]
    kept = {id(r) for r in chosen}
    table = out / "tables" / f"n{size}_s{seed}.csv"
    table.parent.mkdir(parents=True, exist_ok=True)
    with open(table, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(r for r in rows if r["split"] != "train" or id(r) in kept)
    return table


def run(task: Path, pretrain: Path, out: Path, size: int, seed: int, arm: str, extra: list[str],
        fine_tune: list[str] = ()) -> Path:
    """One ``medattn train`` run (skipped when its results.json exists) -> its folder. ``extra``: overrides of
    both arms; ``fine_tune``: of the pretrained arm alone."""
    folder = out / "runs" / f"n{size}" / arm / f"seed_{seed}"
    if (folder / "results.json").exists():
        return folder
    data = yaml.safe_load((task / "config.yaml").read_text())["data"]
    table = subset_table(data, out, size, seed)
    key = table_key(data)
    where = [f"data.{key}={table}"] + ([f"data.data_root={Path(data[key]).parent}"] if key == "csv" else [])
    command = [sys.executable, "-m", "medattn", "train", str(task / "config.yaml"), "--out", str(folder),
               "--no-progress", "--overwrite", *where, f"seed={seed}", "train.threads=1", *extra]
    if arm == "pretrained":
        command += ["--init-from", str(pretrain), *fine_tune]
    subprocess.run(command, check=True)
    return folder


def summarise(out: Path, sizes: list[int], seeds: list[int], resamples: int) -> dict:
    """size -> each arm's per-seed test AUROC, mean (std), runs that did not learn, and the paired tests."""
    from medattn.experiments.compare import bootstrap_test, t_test
    from medattn.experiments.runs import mean_std, metric_of

    table = {}
    for size in sizes:
        folders = {arm: [out / "runs" / f"n{size}" / arm / f"seed_{s}" for s in seeds] for arm in ARMS}
        results = {arm: [json.loads((d / "results.json").read_text()) for d in dirs] for arm, dirs in folders.items()}
        row = {arm: {"per_seed": [metric_of(r) for r in rs], "mean_std": mean_std([metric_of(r) for r in rs]),
                     "did_not_learn": sum(1 for r in rs if (r.get("learning") or {}).get("learned") is False)}
               for arm, rs in results.items()}
        row["paired_t"] = t_test(row["scratch"]["per_seed"], row["pretrained"]["per_seed"])
        row["paired_bootstrap"] = bootstrap_test(folders["scratch"], folders["pretrained"], resamples, 0.95, 0)
        table[str(size)] = row
    return table


def draw(table: dict, path: Path) -> None:
    """Mean test AUROC (+- std over seeds) against labelled cases, one line per arm."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [int(s) for s in table]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for arm in ARMS:
        mean = [table[str(s)][arm]["mean_std"]["mean"] for s in sizes]
        std = [table[str(s)][arm]["mean_std"]["std"] or 0.0 for s in sizes]
        ax.errorbar(sizes, mean, yerr=std, marker="o", capsize=3, label=arm)
    ax.set_xscale("log")
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("labelled training cases")
    ax.set_ylabel("test AUROC (mean +- std over seeds)")
    ax.set_title("label efficiency (SYNTHETIC findings)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", type=Path, help="a medattn realistic image or bag task folder (config.yaml inside)")
    parser.add_argument("pretrain", type=Path, help="the medattn pretrain run folder")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sizes", type=int, nargs="+", default=[25, 50, 100, 180])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--fine-tune", nargs="+", default=[], metavar="KEY=VALUE",
                        help="config overrides of the pretrained arm alone, e.g. train.layer_decay=0.75")
    parser.add_argument("overrides", nargs="*", help="config overrides for every run, e.g. train.epochs=30")
    args = parser.parse_args()
    for size in args.sizes:
        for seed in args.seeds:
            for arm in ARMS:
                run(args.task, args.pretrain, args.out, size, seed, arm, args.overrides, args.fine_tune)
    from medattn.experiments.runs import mean_std_text

    table = summarise(args.out, args.sizes, args.seeds, args.resamples)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "label_efficiency.json").write_text(json.dumps(table, indent=1, default=float))
    draw(table, args.out / "label_efficiency.png")
    for size, row in table.items():
        boot = row["paired_bootstrap"]
        print(f"n={size}: scratch {mean_std_text(row['scratch']['mean_std'])}, "
              f"pretrained {mean_std_text(row['pretrained']['mean_std'])}; "
              f"paired t p {row['paired_t']['p_value']}, "
              f"bootstrap difference {boot.get('difference', float('nan')):+.3f} "
              f"p {boot.get('p_value')}; did not learn {row['scratch']['did_not_learn']} / "
              f"{row['pretrained']['did_not_learn']}")


if __name__ == "__main__":
    main()
