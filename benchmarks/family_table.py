"""The realistic family's table (issue 48): per bag task, each compare arm's test score over its seeds (mean and
SD) with the candidate its recipe search chose, the paired tests compare wrote, beside an independent model on pooled
features fitted here.

The independent model reads each bag as the mean and the maximum of its standardised tile features (2F numbers),
standardised over the training bags: a logistic regression (binary; C chosen by 5-fold cross-validation on the
training split by accuracy, scikit-learn's LogisticRegressionCV, the scoring named so that scikit-learn 1.11's
new default, the log loss, does not change the figures), a ridge regression (regression; RidgeCV, alphas 1e-3..1e3) or
a penalised Cox model (survival; lifelines' CoxPHFitter, penalizer 0.1) fitted on the training split and scored on
the test split (AUROC; Pearson r and R^2; C-index). The ridge and Cox models are ``independent_survival.py``'s
(features constant over the training bags dropped), given these pooled features. Beside it, the bag transformer's
pooled-feature path alone (``medattn.train.pooled_path``, fitted on the same features): what a model with
``model.kwargs.pooled_features=true`` starts from. And the independent model cross-validated on the training
split alone (5 folds): whether a choice made there, as the bag model's recipe makes its own, can see the signal
the test split shows.

    medattn realistic --out bench --tasks ihc_rare retina_count
    medattn compare bench/ihc_rare/config.yaml --models vitwsi_small abmil_small --seeds 0 1 2 --out cmp/ihc_rare
    python benchmarks/family_table.py bench cmp --tasks ihc_rare retina_count

Writes ``--out`` (JSON) and prints two Markdown tables: per seed, and per task (mean (SD) over seeds, the paired
t-test over seeds and the paired bootstrap over test patients from compare_tests.csv).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import h5py
import numpy as np
import yaml

from medattn.experiments.runs import mean_std, mean_std_text


def pooled_bags(folder: Path) -> tuple[dict[str, np.ndarray], dict[str, dict[str, np.ndarray]], dict,
                                       dict[str, list[str]]]:
    """-> split (train, val, test) -> (bags, 2F) mean and max of the tile features (standardised with the training
    tiles' statistics); split -> {target column: (bags,) values} (the label, or the time and event columns); the
    task's data section; split -> its patients, in the same order. The splits are the config's ``split_column``."""
    data = yaml.safe_load((folder / "config.yaml").read_text())["data"]
    split_column = data["split_column"]
    columns = ([data["time_column"], data["event_column"]] if data.get("task_type") == "survival"
               else [data["label_columns"]])
    with open(folder / "clinical.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    with open(folder / "slides.csv", newline="") as f:
        slides = {r["PATIENT"]: r["FILENAME"] for r in csv.DictReader(f)}
    bags = {}
    for r in rows:
        with h5py.File(folder / "features" / f"{slides[r['PATIENT']]}.h5") as h5:
            bags[r["PATIENT"]] = np.asarray(h5["features"], dtype=np.float64)
    train = np.concatenate([bags[r["PATIENT"]] for r in rows if r[split_column] == "train"])
    mean, std = train.mean(0), train.std(0) + 1e-8
    pooled, targets, patients = {}, {}, {}
    for split in ("train", "val", "test"):
        chosen = [r for r in rows if r[split_column] == split]
        patients[split] = [r["PATIENT"] for r in chosen]
        standard = [(bags[r["PATIENT"]] - mean) / std for r in chosen]
        pooled[split] = np.stack([np.concatenate([b.mean(0), b.max(0)]) for b in standard])
        targets[split] = {c: np.array([float(r[c]) for r in chosen]) for c in columns}
    return pooled, targets, data, patients


def independent(pooled: dict, targets: dict, data: dict) -> dict:
    """The pooled-feature model's test score on one task (:func:`pooled_bags`'s output; module docstring): the
    penalised Cox and ridge models are those of ``benchmarks/independent_survival.py``, fitted here on mean+max
    pooled features."""
    from independent_survival import cox_reference, ridge_reference
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.metrics import roc_auc_score
    from sklearn.preprocessing import StandardScaler

    task_type = data.get("task_type", "binary")
    if task_type == "survival":
        found = cox_reference(data, pooled, targets)
        return {"model": "Cox (penalizer 0.1) on mean+max pooled features", "metric": "c_index",
                "test": found["c_index"], "test_outputs": found["test_outputs"]}
    if task_type != "binary":
        found = ridge_reference(data, pooled, targets)
        return {"model": "ridge on mean+max pooled features", "metric": "r2", "test": found["r2"],
                "pearson_r": found["pearson_r"], "test_outputs": found["test_outputs"]}
    scaler = StandardScaler().fit(pooled["train"])
    label = targets["train"][data["label_columns"]], targets["test"][data["label_columns"]]
    model = LogisticRegressionCV(Cs=10, cv=5, scoring="accuracy", max_iter=5000)
    model.fit(scaler.transform(pooled["train"]), label[0])
    probability = model.predict_proba(scaler.transform(pooled["test"]))[:, 1]
    return {"model": "logistic on mean+max pooled features", "metric": "auroc",
            "test": float(roc_auc_score(label[1], probability)), "test_outputs": probability.tolist()}


def against_independent(compare_folder: Path, outputs: list[float], patients: list[str], n_boot: int = 1000) -> dict:
    """Per arm, the paired bootstrap over test patients of (arm - independent model), the mean over the arm's seeds
    (:func:`medattn.metrics.paired_bootstrap`, each seed's test split a stratum): each seed run's
    ``predictions_test.csv`` beside the independent model's ``outputs`` for the same ``patients``, scored by the
    run's own metric on the run's labels. Runs that did not learn are kept: the target is about every run."""
    from medattn import metrics
    from medattn.experiments.runs import Cases, read_cases

    by_patient = dict(zip(patients, outputs))
    found = {}
    for arm_folder in sorted(p for p in compare_folder.iterdir() if p.is_dir() and any(p.glob("seed_*"))):
        runs = [read_cases(seed) for seed in sorted(arm_folder.glob("seed_*")) if (seed / "results.json").is_file()]
        pairs = [(run, Cases(run.ids, run.patients, np.array([[by_patient[p]] for p in run.patients]), run.labels,
                             run.task_type)) for run in runs]

        def difference(index: list[np.ndarray], pairs: list = pairs) -> float | None:
            scores = [(run.score(i), reference.score(i)) for (run, reference), i in zip(pairs, index)]
            if any(a is None or b is None for a, b in scores):
                return None
            return float(np.mean([a - b for a, b in scores]))

        found[arm_folder.name] = {"seeds": len(runs), **metrics.paired_bootstrap(
            difference, [run.patients for run in runs], n_boot)}
    return found


def independent_on_training_folds(pooled: dict, targets: dict, data: dict, folds: int = 5) -> dict:
    """The same independent model cross-validated on the training split alone (``folds`` folds, a fixed permutation,
    seed 0): per fold, :func:`independent` fitted on the other folds and scored on it -> the mean and SD of the fold
    scores. What a choice made on the training split can see of the pooled signal (the test split is not read)."""
    n = len(pooled["train"])
    order = np.random.default_rng(0).permutation(n)
    scores = []
    for k in range(folds):
        held = np.zeros(n, dtype=bool)
        held[order[k::folds]] = True
        split = {"train": ~held, "test": held}
        folded = {name: {c: v[rows] for c, v in targets["train"].items()} for name, rows in split.items()}
        scores.append(independent({name: pooled["train"][rows] for name, rows in split.items()}, folded, data)["test"])
    return {"folds": folds, "mean": float(np.mean(scores)), "sd": float(np.std(scores, ddof=1)), "scores": scores}


def pooled_path_alone(pooled: dict, targets: dict, data: dict) -> dict:
    """The bag transformer's pooled-feature path alone (``medattn.train.pooled_path``: the run's loss, penalty C by
    5-fold cross-validation on the training bags) fitted on the same pooled features, and its test score: what a
    ``pooled_features=True`` model starts from."""
    import torch

    from medattn.data.base import TaskInfo
    from medattn.metrics_regression import pearson_r
    from medattn.train.objectives import objective_for
    from medattn.train.pooled_path import choose_penalty, fit_linear

    task_type = data.get("task_type", "binary")
    columns = list(targets["train"])
    x = {split: torch.tensor(pooled[split], dtype=torch.float32) for split in pooled}
    mean, std = x["train"].mean(0), x["train"].std(0) + 1e-8
    x = {split: (values - mean) / std for split, values in x.items()}
    labels = {split: torch.tensor(np.stack([targets[split][c] for c in columns], 1), dtype=torch.float32)
              for split in pooled}
    scale = ({"target_mean": [float(labels["train"][:, 0].mean())], "target_std": [float(labels["train"][:, 0].std())]}
             if task_type == "regression" else {})
    objective = objective_for(TaskInfo(task_type, "bag", 1, (x["train"].shape[1] // 2,), synthetic=True, **scale))
    c, _ = choose_penalty(x["train"], labels["train"], objective, task_type, 1)
    weight, bias = fit_linear(x["train"], labels["train"], objective, c, 1)
    found, truth = objective.outputs(x["test"] @ weight.T + bias, labels["test"])
    found, truth = found.numpy(), truth.numpy()
    return {"C": c, "test": float(objective.metric_of(found, truth, task_type)),
            "pearson_r": float(pearson_r(found[:, 0], truth[:, 0])) if task_type == "regression" else None}


def arms(compare_folder: Path) -> dict[str, list[dict]]:
    """arm -> per seed: the test score, whether it learned and the recipe it chose, from each run's results.json."""
    out = {}
    for results_file in sorted(compare_folder.glob("*/seed_*/results.json")):
        results = json.loads(results_file.read_text())
        test, metric = results["test"], results["metric"]
        record = results.get("recipe") or {}
        out.setdefault(results_file.parent.parent.name, []).append({
            "seed": results_file.parent.name, "metric": metric, "test": test.get(metric),
            "pearson_r": (test.get("metrics") or {}).get("pearson_r", [None])[0],
            "learned": results.get("learning", {}).get("learned"),
            "recipe": record.get("chosen") or record.get("reason")})
    return out


def paired_tests(compare_folder: Path) -> list[dict]:
    """compare_tests.csv's rows (each arm against the reference arm: the paired t-test over seeds and the paired
    bootstrap over test patients), [] where compare has not written it."""
    path = compare_folder / "compare_tests.csv"
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _tests_text(rows: list[dict]) -> str:
    """compare_tests.csv's rows on the task's metric (the integrated Brier score's t-test left out) in one cell:
    per pair, the difference and the p-values over seeds and over test patients, or why compare left it out."""
    by_pair: dict[str, dict] = {}
    for row in rows:
        if "Brier" in row["test"]:
            continue
        over = {"paired t": "seeds", "paired b": "patients"}.get(row["test"][:8], "note")
        by_pair.setdefault(f"{row['arm']} - {row['reference']}", {})[over] = row
    cells = []
    for pair, found in by_pair.items():
        if "note" in found:
            cells.append(f"{pair}: left out ({found['note']['note']})")
            continue
        difference = float(next(iter(found.values()))["difference"])
        cells.append(f"{pair}: {difference:+.3f}, p {_p(found.get('seeds', {}).get('p_value'))} / "
                     f"{_p(found.get('patients', {}).get('p_value'))}")
    return "; ".join(cells) or "-"


def _against_text(found: dict[str, dict]) -> str:
    """:func:`against_independent`'s result in one cell: per arm, the difference, its interval and p."""
    return "; ".join(f"{arm}: {t['difference']:+.3f} ({t['ci_low']:+.3f} to {t['ci_high']:+.3f}), p {t['p_value']:.3f}"
                     for arm, t in found.items()) or "-"


def _mean_sd(values: list[float]) -> str:
    """``0.912 (0.021)`` over seeds (medattn's compare summary), marked when one seed is all there is."""
    return mean_std_text(mean_std(values)) + (" (1 seed)" if len(values) == 1 else "")


def _p(value: str) -> str:
    return f"{float(value):.3f}" if value not in ("", None) else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tasks_root", type=Path, help="the folder medattn realistic wrote")
    parser.add_argument("compare_root", type=Path, help="a folder of compare folders, one per task")
    parser.add_argument("--tasks", nargs="+", required=True)
    parser.add_argument("--out", type=Path, default=Path("family_table.json"))
    args = parser.parse_args()
    table = {}
    for task in args.tasks:
        *read, patients = pooled_bags(args.tasks_root / task)  # every bag, read once for both pooled models
        reference = independent(*read)
        table[task] = {"independent": reference, "arms": arms(args.compare_root / task),
                       "on_training_folds": independent_on_training_folds(*read),
                       "pooled_path_alone": pooled_path_alone(*read), "tests": paired_tests(args.compare_root / task),
                       "against_independent": against_independent(args.compare_root / task,
                                                                  reference.pop("test_outputs"), patients["test"])}
    args.out.write_text(json.dumps(table, indent=1))
    print("| task | arm (seed) | test score | Pearson r | learned | recipe chosen |\n|---|---|---|---|---|---|")
    for task, found in table.items():
        for arm, seeds in found["arms"].items():
            for s in seeds:
                r = "" if s["pearson_r"] is None else f"{s['pearson_r']:.3f}"
                print(f"| {task} | {arm} ({s['seed']}) | {s['metric']} {s['test']:.3f} | {r} | {s['learned']} | "
                      f"{s['recipe']} |")
    print("\n| task | metric | arm: mean (SD) over seeds, runs learned | independent model | the same, 5-fold on the "
          "training split | the pooled-feature path alone | paired tests (arm - reference: difference, p over seeds / "
          "p over test patients) | arm - independent model (95% interval; paired bootstrap over test patients) |"
          "\n|---|---|---|---|---|---|---|---|")
    for task, found in table.items():
        ref = found["independent"]
        scores = "; ".join(f"{arm} {_mean_sd([s['test'] for s in seeds])}, {sum(bool(s['learned']) for s in seeds)}"
                           f"/{len(seeds)}" for arm, seeds in found["arms"].items())
        r = f" (Pearson r {ref['pearson_r']:.3f})" if "pearson_r" in ref else ""
        alone = found["pooled_path_alone"]
        alone_r = "" if alone["pearson_r"] is None else f" (Pearson r {alone['pearson_r']:.3f})"
        folds = found["on_training_folds"]
        print(f"| {task} | {ref['metric']} | {scores} | {ref['model']}: {ref['test']:.3f}{r} | "
              f"{folds['mean']:.3f} ({folds['sd']:.3f}) | {alone['test']:.3f}{alone_r}, C {alone['C']:g} | "
              f"{_tests_text(found['tests'])} | {_against_text(found['against_independent'])} |")


if __name__ == "__main__":
    main()
