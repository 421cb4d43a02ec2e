"""The demo behind `medattn demo`: a baseline and softmax, SimA and seqnorm ViTs trained on the three SYNTHETIC
tasks, and a Table-2-style table of their test AUROCs.

The built-in benchmark (generated from a seed, no download; not real patients): chest-radiograph
phantoms (cardiomegaly), breast-MRI-like volumes (enhancing lesion) and whole-slide feature bags
(tumour instances). The baseline column is what a user would pick instead of a transformer: a small
2D / tiny 3D ResNet for images and volumes, gated attention-MIL for bags. Each task is rendered once per
worker process (the synthetic kinds' ``cache``) and shared by the runs there, with the kinds' default training
augmentation drawn afresh on every access; each run is a full `medattn train` run (best validation epoch
tested, bootstrap CI) at CPU-sized settings with the same budget (the baselines with their own optimiser
settings, :mod:`medattn.train.defaults`). Runs train ``jobs`` at a time, each in a process of its own with
``threads`` threads, to the same numbers as one after the other (:func:`run_demo`).
A run that did not learn (:mod:`medattn.train.verdict`) shows as such, not as a number.
The report folder gets table.csv, table.json, roc_<task>_<mechanism>.png and the runs; the scaling section
(scaling.csv/json/png: why one would pick linear attention) is measured by the bench code the caller hands in
(:func:`medattn.bench.demo_scaling.scaling_section`: ``bench`` sits on this package's floor, so this module does
not import it). What a demo writes there is recorded in ``.medattn-demo.json``; a later demo replaces only that
(:meth:`OutputFolder.claim`): a user's file or run in the folder stays, and one in the way of a demo output is
refused, named.
"""

from __future__ import annotations

import functools
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from medattn.config import load_config
from medattn.outputs import OutputFolder

MECHANISMS = {"softmax": "ViT (softmax)", "sima": "SimA", "seqnorm": "SeqNorm (ours)"}
#: The table's columns: the baseline, then the mechanisms.
COLUMNS = {"baseline": "Baseline (CNN / MIL)", **MECHANISMS}
#: task -> (baseline preset at demo size, at --quick size); trained with the task's budget, no attention. The 3D
#: ResNet is the tiny one (widths 8-32): resnet3d_small's full-resolution 3D convolutions take 2.6 s per batch of
#: 32 on one CPU thread (tiny: 1.0 s, vit3d_small with early convolutions: 0.2 s), 85 s of a demo meant to take
#: about two minutes. For the same reason the demo's 3D ViTs keep early convolutions, the class token and no
#: LayerScale (``stem=conv``, ``global_pool=token``, ``init_values=null``: the preset before issue 40's hybrid) where
#: the vit3d_small preset is a hybrid on resnet3d_small's trunk.
BASELINES = {"synthetic_cxr": ("resnet2d_small", "resnet2d_tiny"),
             "synthetic_breast_mri": ("resnet3d_tiny", "resnet3d_tiny"),
             "synthetic_wsi": ("abmil_small", "abmil_tiny")}
# task -> (label, config overrides at demo size, extra overrides for --quick)
TASKS = {
    "synthetic_cxr": ("CXR phantom 64x64, cardiomegaly", [
        "data.image_size=64", "data.num_samples={train: 256, val: 96, test: 128}", "model.name=vit2d_small",
        "train.epochs=4", "train.batch_size=32", "train.lr=1e-3",
    ], ["data.image_size=32", "model.name=vit2d_tiny"]),
    "synthetic_breast_mri": ("breast MRI 32x32x16, lesion", [
        "data.volume_size=[32, 32, 16]", "data.num_samples={train: 192, val: 96, test: 128}",
        "model.name=vit3d_small", "model.kwargs.stem=conv", "model.kwargs.global_pool=token",
        "model.kwargs.init_values=null", "train.epochs=5", "train.batch_size=32", "train.lr=1e-3",
    ], ["data.volume_size=[16, 16, 8]", "model.name=vit3d_tiny", "model.kwargs={}"]),
    "synthetic_wsi": ("WSI bags 100-300 x 64, tumour 10-30%", [
        "data.num_instances=[100, 300]", "data.tumour_fraction=[0.1, 0.3]",
        "data.num_samples={train: 120, val: 48, test: 64}", "model.name=vitwsi_small", "train.epochs=4",
        "train.batch_size=1", "train.lr=2e-4", "recipe.search=false",  # the demo keeps its two minutes (docs/recipe.md)
    ], ["data.num_instances=[10, 30]", "data.feature_dim=16", "model.name=vitwsi_tiny"]),
}
#: The tasks by their runs' training time, longest first.
LONGEST_FIRST = ("synthetic_breast_mri", "synthetic_cxr", "synthetic_wsi")
QUICK = ["data.num_samples={train: 24, val: 16, test: 16}", "train.epochs=1", "train.batch_size=8",
         "eval.bootstrap=100"]
#: The file in --out that records what demos wrote there (the only entries a later demo replaces).
MANIFEST = ".medattn-demo.json"
#: The files of every demo besides its runs and ROC figures.
REPORT_FILES = ("table.csv", "table.json", "table.txt", "scaling.csv", "scaling.json", "scaling.png")
#: table.json's "data" value: it marks a folder written by a demo from before the manifest.
DATA_NOTE = "SYNTHETIC (medattn built-in benchmark; not real patients)"


def demo_jobs(tasks: list[str], quick: bool, seed: int, threads: int) -> list[dict]:
    """One job per (task, column): the config a run trains with, longest first (volumes, then images, then
    bags; the baseline first within a task), so that parallel workers finish together."""
    from medattn.train.defaults import AUTO_KEYS

    jobs = []
    for task_name in sorted(tasks, key=LONGEST_FIRST.index):
        label, overrides, quick_overrides = TASKS[task_name]
        overrides = [*overrides, *(QUICK + quick_overrides if quick else []), f"seed={seed}",
                     f"train.threads={threads}"]
        for mechanism in COLUMNS:
            config = load_config(task_name, overrides)
            baseline = mechanism == "baseline"
            if baseline:
                config["model"].update(name=BASELINES[task_name][quick], attention=None, kwargs={})
                for key in AUTO_KEYS:  # a baseline trains with its own optimiser settings (medattn.train.defaults)
                    config["train"][key] = None
            else:
                config["model"]["attention"] = mechanism
            jobs.append({"task": task_name, "label": label, "mechanism": mechanism, "config": config})
    return jobs


@functools.cache
def _bundle(data: str, seed: int):
    """A task's data, rendered once per process (the synthetic kinds' cache) and shared by the runs there;
    training augmentation is drawn afresh on every access."""
    from medattn.data import build_datasets

    return build_datasets(json.loads(data), seed=seed)


def demo_outputs(jobs: list[dict]) -> list[str]:
    """What a demo of ``jobs`` (or of table.json's rows) writes into --out, as paths relative to it."""
    runs = [f"{job['task']}_{job['mechanism']}" for job in jobs]
    return [*(f"runs/{run}" for run in runs), *(f"roc_{run}.png" for run in runs), *REPORT_FILES]


def report_folder(folder: Path) -> OutputFolder:
    """--out, holding what earlier demos wrote there (its manifest; a folder written before the manifest existed
    is recognised by its table.json, and its runs and files recorded as a demo's)."""
    out = OutputFolder(folder, manifest=MANIFEST)
    if not out.recorded and (folder / "table.json").is_file():
        try:
            table = json.loads((folder / "table.json").read_text())
            rows = table["rows"] if table.get("data") == DATA_NOTE else []
            out.recorded = demo_outputs([{"task": r["task"], "mechanism": r["mechanism"]} for r in rows])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # not a demo's table: nothing in the folder is the demo's to replace
    return out


def train_job(job: dict, run_dir: Path, progress: bool) -> dict:
    """Train one demo run (a full `medattn train` run: best validation epoch tested, bootstrap CI) -> its row."""
    import torch

    from medattn.experiments.runs import learning_of
    from medattn.explain.cases import case_heatmaps
    from medattn.train import fit

    config = job["config"]
    config["out"] = str(run_dir)
    torch.set_num_threads(config["train"]["threads"])
    bundle = _bundle(json.dumps(config["data"]), config["seed"])
    result = fit(config, bundle, run_dir, overwrite=True, progress=progress, log=lambda message: None,
                 case_pictures=case_heatmaps)
    test = result["test"]
    return {"task": job["task"], "task_label": job["label"], "mechanism": job["mechanism"], "auroc": test["auroc"],
            "ci_low": test["ci_low"], "ci_high": test["ci_high"], "n_test": test["n"],
            "val_auroc": result["val_auroc"], "best_epoch": result["best_epoch"], "epochs": result["epochs"],
            "model": result["model"], "parameters": result["parameters"],
            "train_seconds": round(result["train_seconds"], 1), "note": test.get("note", ""),
            "did_not_learn": "; ".join(learning_of(result))}


def default_jobs(threads: int) -> int:
    """Runs at once: the cores this process may use (or the user's ``OMP_NUM_THREADS``) divided by each run's
    threads, at least one. Unlike a training run's threads (:func:`medattn.threads.default_threads`) the load
    average is not consulted: right after ``make demo`` installs the environment it still counts pip's work."""
    from medattn.threads import available_cores, user_threads

    return max(1, (user_threads() or available_cores()) // max(1, threads))


def run_demo(folder: Path, tasks: list[str], *, quick: bool = False, seed: int = 0, threads: int = 1,
             jobs: int | None = None, progress: bool = True,
             scaling: Callable[[OutputFolder, bool, int], str] | None = None,
             environment: Callable[[], dict] = dict, log: Callable[[str], None] = print) -> list[dict]:
    """Train the demo's runs of ``tasks`` into ``folder`` (``jobs`` at a time, each in a process of its own with
    ``threads`` threads; None: :func:`default_jobs`), write its table and report and return the table's rows.
    ``scaling(out, quick, threads)`` measures and writes the scaling section and returns its text (None: none);
    ``environment()`` is the machine record of table.json; ``log`` gets each line the command prints."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    job_list = demo_jobs(tasks, quick, seed, threads)
    out = report_folder(Path(folder))
    out.claim(demo_outputs(job_list))  # refuses a user's file or run in the way before any training
    started = time.time()
    workers = min(len(job_list), jobs or default_jobs(threads))
    log(f"training {len(job_list)} runs, {workers} at a time with {threads} thread(s) each")
    rows = {}

    def run_folder(job: dict) -> Path:
        return out.entry(f"runs/{job['task']}_{job['mechanism']}")

    def done(job: dict, row: dict) -> None:
        rows[job["task"], job["mechanism"]] = row
        png = run_folder(job) / "roc_test.png"
        if png.exists():
            with out.write(f"roc_{job['task']}_{job['mechanism']}.png") as tmp:
                shutil.copyfile(png, tmp)
        log(f"[{time.time() - started:6.0f} s] {job['task']}: {job['mechanism']} ({job['config']['model']['name']}) "
            f"trained in {row['train_seconds']:.0f} s")

    if workers == 1:
        for job in job_list:
            done(job, train_job(job, run_folder(job), progress))
    else:  # each run in a process of its own; bars would interleave, so none
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(train_job, job, run_folder(job), False): job for job in job_list}
            for future in as_completed(futures):
                done(futures[future], future.result())
    rows = [rows[task, mechanism] for task in tasks for mechanism in COLUMNS]
    runtime = time.time() - started
    table = format_table(rows, tasks, quick)
    log(table)
    log(f"AUROC runs {runtime:.0f} s; report in {out.folder}")
    out.save_dicts("table.csv", rows, list(rows[0]))
    with out.write("table.json") as tmp:
        tmp.write_text(json.dumps({
            "data": DATA_NOTE, "quick": quick, "seed": seed, "runtime_seconds": round(runtime, 1),
            "jobs": workers, "threads_per_run": threads, "environment": environment(), "rows": rows,
            "table": table}, indent=1))
    with out.write("table.txt") as tmp:
        tmp.write_text(table + "\n")
    if scaling is not None:
        log(scaling(out, quick, threads))
    out.settle(demo_outputs(job_list))  # an earlier demo's runs of other tasks go
    log(f"total runtime {time.time() - started:.0f} s")
    return rows


def _rounded(value: float | None) -> str:
    return "undefined" if value is None else f"{value:.3f}"


def format_table(rows: list[dict], tasks: list[str], quick: bool = False) -> str:
    """Rows: tasks; columns: the baseline and the mechanisms; cells: test AUROC (95% CI)."""
    width = 22
    quick_note = " [--quick smoke run: tiny models and data, numbers mean nothing]" if quick else ""
    title = "SYNTHETIC DATA (medattn built-in benchmark, not real patients): test AUROC (95% bootstrap CI)"
    lines = [title + quick_note,
             f"{'task':<34}" + "".join(f"{COLUMNS[m]:>{width}}" for m in COLUMNS)]
    for task in tasks:
        cells = []
        for mechanism in COLUMNS:
            row = next(r for r in rows if r["task"] == task and r["mechanism"] == mechanism)
            if row["did_not_learn"]:
                cells.append("did not learn")
            elif row["auroc"] is None:
                cells.append("undefined")
            elif row["ci_low"] is None:
                cells.append(f"{row['auroc']:.2f}")
            else:
                cells.append(f"{row['auroc']:.2f} ({row['ci_low']:.2f}-{row['ci_high']:.2f})")
        label = next(r["task_label"] for r in rows if r["task"] == task)
        lines.append(f"{label:<34}" + "".join(f"{c:>{width}}" for c in cells))
    lines += [f"{r['task']} {r['mechanism']}: did not learn ({r['did_not_learn']}); its AUROC {_rounded(r['auroc'])} "
              f"is not a result" for r in rows if r["did_not_learn"]]
    return "\n".join(lines)
