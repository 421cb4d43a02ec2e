"""Independent references for the realistic burden tasks: mean-pooled bags, a penalised Cox model and ridge regression.

Nothing of medattn's models, training or data loaders is used: the tables are read with csv, the bags (CLAM HDF5)
with h5py. Each bag becomes the mean of its tiles' features (64 IHC, 96 fundus), standardised with the training
split's mean and SD (a feature constant over the training bags is dropped); the model is fitted on the training
split (the table's split column) and scored on the test split:

* ``ihc_survival``, ``retina_survival``: ``lifelines.CoxPHFitter(penalizer=0.1)``; the test C-index of its log
  partial hazard, with medattn's ``concordance_index`` and with lifelines' (they must agree; lifelines takes
  survival times, so -risk);
* ``ihc_regression``, ``retina_count``: scikit-learn's ``RidgeCV`` (alphas 10^-3 ... 10^3, efficient leave-one-out);
  test R^2, MAE, RMSE and Pearson r with medattn's ``metrics_regression``, and scikit-learn's R^2 beside them.

The probe (bag size) and the true burden's score are copied from the task's probe.json. Usage:

    python benchmarks/independent_survival.py TASK_FOLDER... [--out DIR]
    python benchmarks/independent_survival.py --write TRAIN VAL TEST --out DIR   # writes both tasks to DIR/tasks first

writes DIR/independent_survival.csv and .json (default DIR: the first task folder's parent), one row per task, with
the machine and the versions. The tasks are real anatomy with SYNTHETIC findings and outcomes.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np
import yaml

ALPHAS = np.logspace(-3, 3, 13)
PENALIZER = 0.1


def read_task(folder: Path) -> tuple[dict, dict[str, np.ndarray], dict[str, dict]]:
    """-> (the config's data section, split -> mean-pooled features (N, F), split -> {column: (N,) values})."""
    import h5py

    data = yaml.safe_load((folder / "config.yaml").read_text())["data"]
    columns = ([data["time_column"], data["event_column"]] if data["task_type"] == "survival"
               else [data["label_columns"]])
    files = {row["PATIENT"]: row["FILENAME"] for row in csv.DictReader(open(data["slide_table"], newline=""))}
    pooled: dict[str, list] = {}
    targets: dict[str, dict[str, list]] = {}
    for row in csv.DictReader(open(data["clinical_table"], newline="")):
        with h5py.File(Path(data["feature_dir"]) / f"{files[row['PATIENT']]}.h5") as f:
            pooled.setdefault(row["split"], []).append(f["features"][:].astype(np.float64).mean(0))
        for column in columns:
            targets.setdefault(row["split"], {}).setdefault(column, []).append(float(row[column]))
    return (data, {s: np.stack(x) for s, x in pooled.items()},
            {s: {c: np.array(v) for c, v in by.items()} for s, by in targets.items()})


def standardised(pooled: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) features standardised with the training split's statistics, constant features dropped."""
    mean, std = pooled["train"].mean(0), pooled["train"].std(0)
    keep = std > 1e-12
    return ((pooled["train"][:, keep] - mean[keep]) / std[keep], (pooled["test"][:, keep] - mean[keep]) / std[keep])


def cox_reference(data: dict, pooled: dict[str, np.ndarray], targets: dict[str, dict]) -> dict:
    """Penalised Cox model on the training bags -> the test C-index (medattn's and lifelines') and the train one,
    and its test risks (``test_outputs``, in the test split's order)."""
    import pandas as pd
    from lifelines import CoxPHFitter
    from lifelines.utils import concordance_index as lifelines_c_index

    from medattn.metrics_survival import concordance_index

    x_train, x_test = standardised(pooled)
    names = [f"f{i}" for i in range(x_train.shape[1])]
    time_column, event_column = data["time_column"], data["event_column"]
    frame = pd.DataFrame(x_train, columns=names).assign(time=targets["train"][time_column],
                                                         event=targets["train"][event_column])
    model = CoxPHFitter(penalizer=PENALIZER).fit(frame, duration_col="time", event_col="event")
    risk = model.predict_log_partial_hazard(pd.DataFrame(x_test, columns=names)).to_numpy()
    times, event = targets["test"][time_column], targets["test"][event_column].astype(bool)
    return {"model": f"CoxPHFitter(penalizer={PENALIZER}) on mean-pooled features",
            "c_index": float(concordance_index(risk, times, event)),
            "c_index_lifelines": float(lifelines_c_index(times, -risk, event)),
            "train_c_index": float(model.concordance_index_), "test_events": int(event.sum()),
            "test_outputs": risk.tolist()}


def ridge_reference(data: dict, pooled: dict[str, np.ndarray], targets: dict[str, dict]) -> dict:
    """Ridge regression on the training bags -> the test R^2, MAE, RMSE and Pearson r (medattn's), sklearn's
    R^2 and its test predictions (``test_outputs``, in the test split's order)."""
    from sklearn.linear_model import RidgeCV
    from sklearn.metrics import r2_score

    from medattn import metrics_regression

    x_train, x_test = standardised(pooled)
    column = data["label_columns"]
    model = RidgeCV(alphas=ALPHAS).fit(x_train, targets["train"][column])
    pred, true = model.predict(x_test), targets["test"][column]
    return {"model": "RidgeCV on mean-pooled features", "alpha": float(model.alpha_),
            **{m: float(getattr(metrics_regression, m)(pred, true)) for m in metrics_regression.METRICS},
            "r2_sklearn": float(r2_score(true, pred)), "test_outputs": pred.tolist()}


def reference(folder: Path) -> dict:
    """One task folder's row: the reference's test scores, the split sizes, the probe and the true burden."""
    started = time.perf_counter()
    data, pooled, targets = read_task(folder)
    fit = cox_reference if data["task_type"] == "survival" else ridge_reference
    found = fit(data, pooled, targets)
    found.pop("test_outputs")  # per-case outputs: the family table's paired tests read them, a row does not
    probe = json.loads((folder / "probe.json").read_text())
    known = {}  # probe.json's scores, one column each ("probe_c_index/bag size")
    for key, value in probe.items():
        if key.startswith(("probe_", "burden_", "censored")):
            known.update({f"{key}/{k}": v for k, v in value.items()} if isinstance(value, dict) else {key: value})
    return {"task": probe["task"], "cohort": probe["cohort"], "seed": probe["seed"], "folder": str(folder),
            "n_train": len(pooled["train"]), "n_test": len(pooled["test"]), **found,
            **known,
            "seconds": round(time.perf_counter() - started, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tasks", type=Path, nargs="*", help="folders written by medattn realistic (ihc_survival, "
                                                            "ihc_regression)")
    parser.add_argument("--write", type=int, nargs=3, metavar=("TRAIN", "VAL", "TEST"),
                        help="first write ihc_survival and ihc_regression with these cases per split to OUT/tasks")
    parser.add_argument("--out", type=Path, help="result folder (default: the first task folder's parent)")
    args = parser.parse_args()
    if args.write:
        if not args.out:
            parser.error("--write needs --out")
        from medattn.generators.realistic import make_task

        sizes = dict(zip(("train", "val", "test"), args.write))
        args.tasks += [make_task(name, args.out / "tasks", sizes=sizes) for name in ("ihc_survival", "ihc_regression")]
    if not args.tasks:
        parser.error("name a task folder or --write")
    from medattn.bench.common import environment, write_results

    env = {**environment(), **{package: version(package) for package in
                               ("medattn", "numpy", "pandas", "scikit-learn", "lifelines", "h5py")}}
    rows = []
    for folder in args.tasks:
        rows.append({**reference(folder), "machine": env["machine"], "processor": env["processor"]})
        row = rows[-1]
        scores = (f"test C-index {row['c_index']:.3f} (lifelines {row['c_index_lifelines']:.3f}), train "
                  f"{row['train_c_index']:.3f}, {row['test_events']} events" if "c_index" in row else
                  f"test R^2 {row['r2']:.3f} (scikit-learn {row['r2_sklearn']:.3f}), MAE {row['mae']:.3f}, RMSE "
                  f"{row['rmse']:.3f}, Pearson r {row['pearson_r']:.3f}, alpha {row['alpha']:g}")
        print(f"{row['task']} ({row['n_train']} train / {row['n_test']} test, SYNTHETIC outcomes): {row['model']}: "
              f"{scores}", flush=True)
    paths = write_results(rows, args.out or args.tasks[0].resolve().parent, "independent_survival", env)
    print("wrote " + ", ".join(map(str, paths)))


if __name__ == "__main__":
    main()
