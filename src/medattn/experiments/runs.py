"""Many runs as one experiment: the machinery shared by cross-validation (:mod:`medattn.experiments.cv`) and
comparisons over seeds (:mod:`medattn.experiments.compare`).

A :class:`Job` is one normal training run (the same :func:`medattn.train.fit` as ``medattn train``) in its
own folder under the experiment's folder. :func:`run_jobs` runs them in order and is resumable: a job
whose folder holds ``results.json`` is finished and skipped (its saved config must equal the job's, else
a UserError names the keys); one with a checkpoint resumes from it (``fit(resume=True)``, which checks the
config too); any other starts afresh (files of a run killed before its first checkpoint are replaced). A finished
or resumed job must also have started from the checkpoint the job names (``--init-from``, or none), recorded in
its ``start.json``: else a UserError says which start each has.
Everything aggregated afterwards is read back from the run folders (``results.json`` and the per-case
``predictions_test.csv``), so a finished job and a job run now are treated alike.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from medattn import metrics
from medattn.config import flatten, read_config_file, with_defaults
from medattn.errors import UserError
from medattn.outputs import OutputFolder
from medattn.runtime.build import check_model_config
from medattn.train.defaults import resolve_training
from medattn.train.rundir import config_diff
from medattn.vocabulary import task_types

#: Beside each job's run: ``{"init_from": the checkpoint it started from, or null}``, written when it starts.
START_FILE = "start.json"

@dataclass
class Job:
    """One run: ``name`` is its folder below the experiment's folder, ``config`` its resolved config,
    ``init_from`` the checkpoint a new run starts from (``medattn train --init-from``), if any."""

    name: str
    config: dict
    init_from: str | None = None


def job_state(run_dir: Path, config: dict, init_from: str | Path | None = None) -> str:
    """``done`` (results.json, same config, same start), ``resume`` (a checkpoint, same start) or ``new``; a UserError
    names what differs from the request."""
    if (run_dir / "results.json").is_file() or _resumable(run_dir):
        recorded = recorded_start(run_dir)
        if recorded is not UNKNOWN and not same_start(recorded, init_from):
            what = "finished" if (run_dir / "results.json").is_file() else "started"
            raise UserError(f"{run_dir} holds a {what} run that starts from {recorded or 'scratch (no --init-from)'}, "
                            f"this one from {init_from or 'scratch (no --init-from)'}: choose another --out or remove "
                            f"that folder")
    if (run_dir / "results.json").is_file():  # saved resolved (medattn.train.defaults): compare it so
        requested = resolve_training(config)[0]
        planned = {k for k, v in flatten(requested).items() if v is None}  # null: the run's plan chose it
        written = with_defaults(read_config_file(run_dir / "config.yaml"), str(run_dir / "config.yaml"))
        record = (written.get("recipe") or {}).get("record") or {}
        decisions = json.loads((run_dir / "results.json").read_text()).get("plan", {}).get("decisions", [])
        chosen = {*record.get("values", {}), *(d["key"] for d in decisions if d.get("applied"))}  # search, plan
        changed = [k for k in config_diff(_no_empty(written), _no_empty(requested)) if k not in planned
                   and k not in chosen and not k.startswith("recipe.record")]
        if changed:
            raise UserError(f"{run_dir} holds a finished run whose config differs in {', '.join(changed)}; "
                            f"choose another --out or remove that folder")
        return "done"
    return "resume" if _resumable(run_dir) else "new"


def _no_empty(config: dict) -> dict:
    """``config`` without its empty sections (``model.kwargs: {}`` and an absent ``model.kwargs`` ask the same; the
    search's ``model.kwargs.readout`` fills the section in the run's config.yaml)."""
    return {k: _no_empty(v) if isinstance(v, dict) else v for k, v in config.items() if v != {}}


def _resumable(run_dir: Path) -> bool:
    """Whether the run in ``run_dir`` has a checkpoint to resume from."""
    checkpoints = Path(run_dir) / "checkpoints"
    return (checkpoints / "last").exists() or (checkpoints / "last.old").exists()


#: :func:`recorded_start` of a run that records none (started before runs recorded it).
UNKNOWN = object()


def recorded_start(run_dir: Path):
    """The checkpoint the run in ``run_dir`` started from (its :data:`START_FILE`, else its results.json's
    ``init_from``), None for none, :data:`UNKNOWN` when it records nothing."""
    for name, read in ((START_FILE, lambda data: data["init_from"]),
                       ("results.json", lambda data: (data.get("init_from") or {}).get("from"))):
        try:
            start = read(json.loads((Path(run_dir) / name).read_text()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        if start is None or isinstance(start, str):
            return start
    return UNKNOWN


def same_start(a: str | Path | None, b: str | Path | None) -> bool:
    """Whether two starts name the same checkpoint (both none, or the same path once made absolute)."""
    if a is None or b is None:
        return a is None and b is None
    return os.path.realpath(a) == os.path.realpath(b)


def check_summaries(root: Path, command: str, marker: str, keys: tuple[str, ...], names: tuple[str, ...]) -> None:
    """Refuse ``root`` when it holds one of the summary files ``command`` writes there (``marker``, its JSON summary
    with ``keys``, and ``names``) that no earlier ``command`` wrote: the user's own ``report.html`` or ``cv.csv`` are
    not replaced. The files are ``command``'s when ``marker`` is one of its summaries (written first)."""
    root = Path(root)
    if (root / marker).exists():
        try:
            summary = json.loads((root / marker).read_text())
            ours = isinstance(summary, dict) and all(key in summary for key in keys)
        except (OSError, UnicodeDecodeError, ValueError):
            ours = False
        if ours:
            return
        found = marker
    else:
        found = next((name for name in names if (root / name).exists()), None)
    if found is not None:
        raise UserError(f"{root / found} was not written by medattn {command}: refusing to replace it; choose another "
                        f"--out or move it")


def run_jobs(jobs: list[Job], root: Path, *, progress: bool = True, log: Callable[[str], None] = print) -> list[dict]:
    """Run every job in ``root / job.name`` (see the module docstring); returns each job's results.json.

    Every job's config is checked (schema, model section), and every finished or started job against its config and
    start (:func:`job_state`), before the first one starts, so a typo in the last arm fails at once instead of after
    hours."""
    from medattn.config import validate
    from medattn.data import build_datasets
    from medattn.explain.cases import case_pictures_for
    from medattn.train.loop import fit

    from .recipe import recipe_for

    for job in jobs:
        job.config["out"] = str(root / job.name)
        validate(job.config, job.name)
        check_model_config(job.config["model"])
    for job in jobs:  # a finished or started run of another config or start: refused before any job runs
        job_state(root / job.name, job.config, job.init_from)
    results = []
    for number, job in enumerate(jobs, 1):
        run_dir = root / job.name
        state = job_state(run_dir, job.config, job.init_from)
        log(f"[{number}/{len(jobs)}] {job.name}: " + {"done": "finished, skipped", "resume": "resuming",
                                                      "new": "training"}[state])
        if state == "new":  # the start, kept beside the run (a resumed run's results.json records none)
            OutputFolder.within(run_dir).save_json(START_FILE, {"init_from": None if job.init_from is None
                                                                else str(job.init_from)})
        if state != "done":
            config = job.config
            bundle = build_datasets(config["data"], seed=config["seed"], skip_bad=config["train"]["skip_bad"])
            config = recipe_for(config, bundle, run_dir, resume=state == "resume", init_from=job.init_from, log=log)
            fit(config, bundle, run_dir, resume=state == "resume", overwrite=state == "new", progress=progress,
                log=log, init_from=job.init_from if state == "new" else None,
                case_pictures=case_pictures_for(config))
        results.append(json.loads((run_dir / "results.json").read_text()))
    return results


#: Text columns of ``predictions_test.csv`` that share a numeric column's prefix (the risk group beside the risks).
TEXT_COLUMNS = ("risk_group",)


@dataclass
class Cases:
    """A run's per-case test outputs read back from ``predictions_test.csv``.

    Classification: ``outputs`` probabilities (N, K), ``labels`` (N,) class indices (multi-class) or (N, K)
    0/1; segmentation: ``outputs`` Dice per class (N, K) with NaN where undefined, ``labels`` None; survival:
    ``outputs`` risk scores (N, 1), ``labels`` ``[time, event]`` (N, 2); regression: ``outputs`` predicted and
    ``labels`` true values (N, K)."""

    ids: list[str]
    patients: list[str]
    outputs: np.ndarray
    labels: np.ndarray | None
    task_type: str

    def score(self, index: np.ndarray) -> float | None:
        """The run's test metric on the cases ``index`` (AUROC, mean foreground Dice, C-index or R^2); None if
        undefined."""
        try:
            objective = task_types.of(self.task_type).objective_class()  # its validation metric
            labels = None if self.labels is None else self.labels[index]
            return objective.metric_of(self.outputs[index], labels, self.task_type)
        except metrics.UndefinedMetricError:
            return None


def read_cases(run_dir: Path) -> Cases:
    """Read ``predictions_test.csv`` as written by :mod:`medattn.train.report`: ``label`` (multi-class) or
    ``label_<name>`` (binary: one, multi-label: several) and ``prob_<name>`` columns, ``dice_<name>``
    columns (segmentation), ``time``, ``event`` and ``risk`` (survival) or ``risk_<cause>`` per cause (competing
    risks; both with a text column ``risk_group``, not read) or ``true_<name>`` and ``pred_<name>`` (regression)."""
    path = Path(run_dir) / "predictions_test.csv"
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as error:
        raise UserError(f"{path}: cannot read the run's test predictions ({error.strerror})") from None
    if not rows:
        raise UserError(f"{path}: no test cases")
    columns = list(rows[0])

    def matrix(prefix: str) -> np.ndarray:
        return np.array([[float(r[c]) if r[c] != "" else math.nan for c in columns
                          if c.startswith(prefix) and c not in TEXT_COLUMNS] for r in rows])

    ids, patients = [r["id"] for r in rows], [r["patient"] for r in rows]
    if any(c.startswith("dice_") for c in columns):
        return Cases(ids, patients, matrix("dice_"), None, "segmentation")
    if "time" in columns and "event" in columns:  # one risk (survival) or one per cause (competing risks)
        kind = "survival" if "risk" in columns else "competing_risks"
        return Cases(ids, patients, matrix("risk"), np.hstack([matrix("time"), matrix("event")]), kind)
    if any(c.startswith("true_") for c in columns):
        return Cases(ids, patients, matrix("pred_"), matrix("true_"), "regression")
    probs = matrix("prob_")
    if "label" in columns:
        return Cases(ids, patients, probs, np.array([int(r["label"]) for r in rows]), "multiclass")
    labels = matrix("label_").astype(int)
    return Cases(ids, patients, probs, labels, "binary" if labels.shape[1] == 1 else "multilabel")


def metric_of(results: dict) -> float | None:
    """The test metric of a results.json (``test.auroc``, ``test.dice``, ``test.c_index`` or ``test.r2``)."""
    return results["test"].get(results["metric"])


def ibs_of(results: dict) -> float | None:
    """The integrated Brier score of a survival run's results.json (``test.ibs.value``; None where it was not
    measured, :mod:`medattn.train.survival_report`)."""
    return (results["test"].get("ibs") or {}).get("value")


def learning_of(results: dict) -> list[str]:
    """Why a run did not learn (:mod:`medattn.train.verdict`), from its results.json; empty when it learned
    (or was written before runs were judged)."""
    learning = results.get("learning") or {}
    return [] if learning.get("learned", True) else list(learning.get("reasons", ["did not learn"]))


def mean_std(values: list[float | None]) -> dict:
    """Mean and sample standard deviation (ddof = 1; None for fewer than two values) of the defined values."""
    defined = [v for v in values if v is not None and not math.isnan(v)]
    if not defined:
        return {"mean": None, "std": None, "n": 0}
    std = float(np.std(defined, ddof=1)) if len(defined) > 1 else None
    return {"mean": float(np.mean(defined)), "std": std, "n": len(defined)}


def mean_std_text(summary: dict, digits: int = 3) -> str:
    """``0.912 (0.021)``; ``-`` when undefined; the std left out for a single value."""
    if summary["mean"] is None:
        return "-"
    std = "" if summary["std"] is None else f" ({summary['std']:.{digits}f})"
    return f"{summary['mean']:.{digits}f}{std}"
