"""The end of a training run: the kept checkpoint on the test split, the verdict, the report files.

:func:`test_best` loads ``checkpoints/best``, scores the test split (:func:`medattn.train.predictions.predict`), judges
whether the run learned (:func:`learning_verdict`, :mod:`medattn.train.verdict`), writes predictions, ROC, curves,
the case heatmaps the caller hands in, results.json and report.html (:mod:`medattn.train.page`), and prints the
summary.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from medattn.data import input_kinds
from medattn.data.base import DataBundle, dataset_labels
from medattn.errors import UserError, writing
from medattn.outputs import OutputFolder
from medattn.runtime import checkpoint, distributed
from medattn.runtime.predictor import Predictor
from medattn.survival_plots import time_axis_label
from medattn.vocabulary import task_types

from . import report, verdict
from .objectives import objective_for
from .page import run_page
from .predictions import predict
from .sampling import class_keys, make_loader, positive_weight

#: What draws the report's case heatmaps, handed in by the caller (``medattn train``, cv and compare, the demo:
#: :func:`medattn.explain.cases.case_heatmaps`): ``(model, test set, probabilities, labels, ids, task, run folder,
#: title, count) -> (the PNGs written, relative to the run folder; warnings)``. Training itself draws no heatmaps.
CasePictures = Callable[..., tuple[list[str], list[str]]]


class LateDataError(UserError):
    """A bad test file found after training (it changed since :func:`medattn.data.validate.decode_all` read it)."""


def test_best(model: nn.Module, config: dict, bundle: DataBundle, run_dir: Path, results: dict,
              device: torch.device, progress: bool, log: Callable[[str], None], started: float,
              case_pictures: CasePictures | None = None) -> dict:
    """Load the best checkpoint, score the test split, write the report files (predictions, ROC, curves, the
    case heatmaps of ``case_pictures``, results.json, the learned-nothing warnings, report.html) and print the
    summary; returns ``results`` completed."""
    train_cfg, task = config["train"], bundle.task
    objective = objective_for(task, train_cfg["loss"])
    checkpoint.load_model(checkpoint.resolve(run_dir / "checkpoints" / "best"), model)
    eval_bs = train_cfg["eval_batch_size"] or train_cfg["batch_size"]
    test_loader = make_loader(bundle.test, eval_bs, False, config["seed"], train_cfg["num_workers"])
    try:
        test = predict(Predictor.for_run(model, config, task, device), test_loader, objective, "test", progress)
    except UserError as error:  # a file that changed since the check before training
        raise LateDataError(str(error)) from None
    survival = None  # the training split's Breslow baseline, censoring survival and risk cut (issue 51)
    kind = task_types.of(task.task_type)
    if kind.events:
        from .survival_report import training_reference

        survival = training_reference(model, config, bundle, objective, device, progress)
    if distributed.is_main():
        label = " ".join(str(v) for v in (config["model"]["name"], config["model"].get("attention")) if v)
        rows = report.read_metrics(run_dir / "metrics.csv")
        probabilities = test.outputs if objective.outputs_are_probabilities else None
        if results.get("learning") is None:  # judged already where the training task's results did
            results["learning"] = learning_verdict(config, bundle, rows, f"val_{objective.metric}",
                                                   results["best_epoch"])
        results["warnings"] += [f"did not learn: {reason}" for reason in results["learning"]["reasons"]]
        results["warnings"] += results["learning"]["warnings"]
        fitted = results.get("pooled_path") or {}
        results["warnings"] += report.learning_warnings([row["train_loss"] for row in rows], probabilities,
                                                        fitted.get("fitted_loss"))
        results["warnings"] += report.trivial_statistic_warnings(
            probabilities, test.statistic, input_kinds.of(task.input_kind).statistic_name)
        with writing(run_dir):
            folder = OutputFolder.within(run_dir)
            results["test"] = report.score_split(test, task, "test", folder, config["eval"], config["seed"], label,
                                                 survival, time_axis_label(config["data"].get("time_column")))
            if survival is not None:
                folder.save_json("survival_reference.json", survival)
            results.update(reader_facts(run_dir, task, test, config["eval"]["ci"]))
            if case_pictures is not None and kind.case_ends:
                try:  # the highest-scored test cases (a risk's, a value's lowest too); a segmentation's best, worst
                    labels = report.class_labels(test.labels, task) if objective.outputs_are_probabilities else \
                        test.labels
                    results["heatmaps"], drawn = case_pictures(model, bundle.test, test.outputs, labels, test.ids,
                                                               task, run_dir, label, config["eval"]["heatmaps"])
                    results["warnings"] += drawn  # e.g. a slide not found: that case drawn on a blank canvas
                except Exception as error:  # a picture for the page must never cost a finished run its results
                    results["warnings"].append(f"no heatmaps for report.html ({type(error).__name__}: {error})"[:300])
            report.plot_curves(rows, f"val_{objective.metric}", folder,
                               label + (" (SYNTHETIC data)" if task.synthetic else ""), results["best_epoch"])
            results["elapsed_seconds"] = time.time() - started  # the whole command: data, model, training, test
            folder.save_json("results.json", results)
            run_page(run_dir, results)  # report.html: the summary, warnings and pictures in one page
        log(report.summary(results, objective))
    distributed.barrier()
    return results


def reader_facts(run_dir: Path, task, test, ci: float) -> dict:
    """What a clinical reader of report.html needs beside the AUROC: ``provenance`` (the kept checkpoint's model
    id and weights SHA-256, the date, the medattn version) and, for binary and multi-label tasks, the
    ``operating_point`` on the test split at the thresholds chosen on validation (Youden's J, stored in the
    checkpoint), as ``medattn eval`` reports it."""
    import datetime

    import medattn
    from medattn.clinical_metrics import operating_point
    from medattn.runtime.threshold import stored_thresholds
    from medattn.runtime.trained import model_id, weights_sha256

    best = checkpoint.resolve(run_dir / "checkpoints" / "best")
    meta = checkpoint.load_meta(best)
    facts: dict = {"provenance": {
        "model_id": model_id(meta), "weights_sha256": weights_sha256(best),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "medattn_version": medattn.__version__}}
    thresholds = stored_thresholds(meta, task.num_outputs, str(best / checkpoint.META_FILE))
    if thresholds is not None and task_types.of(task.task_type).thresholds:
        facts["operating_point"] = operating_point(test.outputs, test.labels, thresholds, ci, task.class_names)
    return facts


def learning_verdict(config: dict, bundle: DataBundle, rows: list[dict], score_key: str,
                     best_epoch: int | None = None) -> dict:
    """:func:`medattn.train.verdict.judge` of a finished run (kept checkpoint: ``best_epoch``): the constant
    predictor under the run's own training objective (label smoothing, ``pos_weight``, class balance, batch size)
    and the validation labels."""
    task, train_cfg = bundle.task, config["train"]
    plain = objective_for(task, train_cfg["loss"])
    if plain.constant_name is None:  # segmentation: judged by its score alone
        return verdict.judge(rows, score_key, plain, best_epoch=best_epoch)
    labels = dataset_labels(bundle.train)
    weight = positive_weight(labels, task.task_type, train_cfg["pos_weight"])
    objective = objective_for(task, train_cfg["loss"], train_cfg["label_smoothing"], weight)
    if hasattr(objective, "fit"):  # survival's discrete_time: the intervals of the training labels
        objective.fit(labels, train_cfg["time_bins"])
    weights = None
    if train_cfg["class_balance"]:  # every class drawn with equal total weight
        keys = class_keys(labels)
        weights = 1.0 / torch.bincount(keys).double()[keys]
    return verdict.judge(rows, score_key, objective, best_epoch=best_epoch,
                         constant=objective.constant_loss(labels, weights, train_cfg["batch_size"]),
                         val_labels=dataset_labels(bundle.val).numpy(), ci=config["eval"]["ci"])
