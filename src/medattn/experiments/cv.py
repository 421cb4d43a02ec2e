"""k-fold cross-validation by patient: ``medattn cv CONFIG --folds K``.

Fold k is a normal run (:func:`medattn.train.fit`) of the config with ``data.folds=K data.fold=k`` in
``DIR/fold_k``. Every patient is in the test part of exactly one fold (scikit-learn's
``StratifiedGroupKFold`` over patients, shuffled with the run seed, stratified by the label for
classification); inside a fold, ``data.val_fraction`` (default 0.15) of the *training* folds' patients,
drawn with seed + 1, is the validation set that picks the best epoch, so the test fold is never seen
before it is scored. Table kinds split their rows this way themselves; synthetic kinds pool their
train/val/test cases first (:mod:`medattn.data.cohort.folds`). Resumable per fold (:mod:`medattn.experiments.runs`).

The summary is read from the folds' ``results.json``: per fold the test metric (AUROC; segmentation:
the mean foreground Dice and each structure's Dice), then mean and sample standard deviation (ddof 1)
over folds; written as ``cv.csv``, ``cv.json`` and ``report.html`` in DIR and printed. A DIR that holds a ``cv.csv``
or ``report.html`` no earlier ``medattn cv`` wrote (no ``cv.json`` of it) is refused before any fold runs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

from medattn.errors import UserError, writing
from medattn.outputs import OutputFolder
from medattn.train.page import ABBREVIATIONS, number, write_page

from .runs import Job, check_summaries, ibs_of, learning_of, mean_std, mean_std_text, metric_of, run_jobs


def fold_jobs(config: dict, folds: int) -> list[Job]:
    """One job per fold: the config with ``data.folds`` and ``data.fold`` set, in ``fold_<k>``."""
    if not isinstance(folds, int) or isinstance(folds, bool) or folds < 2:
        raise UserError(f"--folds must be an int >= 2, got {folds!r}")
    for key in ("folds", "fold"):
        if config["data"].get(key) is not None:
            raise UserError(f"the config sets data.{key}; medattn cv sets data.folds and data.fold for every fold")
    jobs = []
    for fold in range(folds):
        fold_config = copy.deepcopy(config)
        fold_config["data"].update(folds=folds, fold=fold)
        jobs.append(Job(f"fold_{fold}", fold_config))
    return jobs


def summarise_folds(results: list[dict]) -> dict:
    """Per-fold test metrics and their mean (std) over folds, from the folds' results.json (in fold order).

    Rows: the metric (``AUROC``, ``C-index`` and the integrated Brier score, ``R^2``), or ``overall`` (the mean
    foreground Dice of the fold's test part) then one row per foreground structure (its Dice over the fold's test
    cases). ``did_not_learn``: fold -> the reasons its run did not learn (:mod:`medattn.train.verdict`); such folds
    are named under the table."""
    metric = results[0]["metric"]
    name = "overall" if metric == "dice" else ABBREVIATIONS.get(metric, metric)
    rows = [{"structure": name, "per_fold": [metric_of(r) for r in results]}]
    if metric == "dice":
        names = list(results[0]["test"]["dice_per_class"])[1:]  # background first, left out
        rows += [{"structure": name, "per_fold": [r["test"]["dice_per_class"].get(name) for r in results]}
                 for name in names]
    if metric == "c_index":  # and how wrong the predicted survival is over time (issue 51; lower is better)
        rows.append({"structure": "integrated Brier score", "per_fold": [ibs_of(r) for r in results]})
    for row in rows:
        row.update(mean_std(row["per_fold"]))
    first = results[0]
    failed = {fold: learning_of(r) for fold, r in enumerate(results) if learning_of(r)}
    return {"folds": len(results), "metric": metric, "synthetic": first["synthetic"], "data": first["data"],
            "model": first["model"], "attention": first["attention"], "std": "sample standard deviation over "
            "folds (ddof 1)", "rows": rows, "runs": [r["run_dir"] for r in results], "did_not_learn": failed}


def format_summary(summary: dict) -> str:
    """The printed table: one row per structure, one column per fold, then mean (std)."""
    from medattn.text import format_table

    label = ABBREVIATIONS.get(summary["metric"], summary["metric"])
    mechanism = f" ({summary['attention']})" if summary["attention"] else ""
    tag = "  [SYNTHETIC data]" if summary["synthetic"] else ""
    folds = [f"fold_{k}" for k in range(summary["folds"])]
    table = [{"structure": row["structure"], **dict(zip(folds, row["per_fold"])),
              "summary": mean_std_text(row)} for row in summary["rows"]]
    first = "structure" if summary["metric"] == "dice" else "metric"
    columns = [("structure", first, ""), *[(f, f, ".3f") for f in folds], ("summary", "mean (std)", "")]
    return "\n".join([f"{summary['folds']}-fold cross-validation of {summary['model']}{mechanism} on "
                      f"{summary['data']}{tag}: test {label} per fold, mean (std) over folds",
                      format_table(table, columns),
                      *[f"fold_{fold}: DID NOT LEARN, its figure is not a result: {'; '.join(reasons)}"
                        for fold, reasons in summary.get("did_not_learn", {}).items()]])


def cross_validate(config: dict, folds: int, root: str | Path, *, progress: bool = True,
                   log: Callable[[str], None] = print) -> dict:
    """Run (or resume) the ``folds`` fold runs of ``config`` under ``root``, write ``cv.csv`` and ``cv.json``
    there, print the table and return the summary (:func:`summarise_folds`)."""
    root = Path(root)
    jobs = fold_jobs(config, folds)
    check_summaries(root, "cv", "cv.json", ("folds", "rows"), ("cv.csv", "report.html"))  # before any fold runs
    results = run_jobs(jobs, root, progress=progress, log=log)
    summary = summarise_folds(results)
    out = OutputFolder(root, resume=True)  # its runs resume; the summaries are this command's, written again
    with writing(root):
        out.save_json("cv.json", summary)
        out.save_csv("cv.csv", ["structure", *[f"fold_{k}" for k in range(folds)], "mean", "std", "n_folds"],
                  [[row["structure"], *row["per_fold"], row["mean"], row["std"], row["n"]] for row in summary["rows"]])
        write_page(out, f"{folds}-fold cross-validation of {summary['model']} on {summary['data']}",
                   summary["synthetic"], [["structure", *[f"fold_{k}" for k in range(folds)], "mean", "std"],
                                          *[[r["structure"], *[number(v) for v in r["per_fold"]], number(r["mean"]),
                                             number(r["std"])] for r in summary["rows"]]],
                   [f"fold_{fold}: did not learn: {'; '.join(reasons)}"
                    for fold, reasons in summary["did_not_learn"].items()], [])
    log(format_summary(summary))
    return summary
