"""Score a trained checkpoint on any data: the external-cohort evaluation behind ``medattn eval``.

:func:`evaluate` builds the data config's datasets (a table whose rows are all ``test``, or
``test_fraction: 1``, is an external cohort), checks that the data fits the checkpoint (task, outputs,
input, preprocessing), predicts one split exactly as training scored its test split (same predictor,
precision and sliding windows) and writes to ``out``:

* ``predictions_<split>.csv``, ``roc_<split>.png``: as a training run's test files;
* classification: the AUROC with its patient-level bootstrap interval, sensitivity and specificity at the
  checkpoint's stored thresholds (Youden's J on its validation split) with Wilson intervals, the expected
  calibration error and ``reliability_<split>.png`` (:mod:`medattn.clinical_metrics`);
* with ``per_patient`` (``mean`` or ``max`` of a patient's probabilities): the same per patient, in files
  named ``<split>_patients`` (a patient is positive if any of its samples is);
* survival: the Brier scores, integrated Brier score, calibration at a time (``calibration_<split>.png``) and
  risk groups of :mod:`medattn.train.survival_report`, scored with the run's ``survival_reference.json`` (the
  training split's Breslow baseline, censoring survival and risk cut);
* ``eval.json`` with all of it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from medattn import clinical_metrics
from medattn.errors import UserError, writing
from medattn.runtime import distributed
from medattn.runtime.checkpoint import task_from_dict, task_to_dict
from medattn.survival_plots import time_axis_label
from medattn.vocabulary import task_types

from .objectives import Predictions, objective_for
from .report import score_split, survival_lines
from .survival_report import load_reference


def evaluate(checkpoint: str | Path, config: dict, *, split: str = "test", out: str | Path | None = None,
             per_patient: str | None = None, batch_size: int | None = None, skip_bad: bool = False,
             progress: bool = True, overwrite: bool = False, accept_features: bool = False,
             device: str = "auto") -> dict:
    """Evaluate ``checkpoint`` (a run folder, checkpoint folder or model.safetensors) on split ``split`` of the
    data of ``config`` (a resolved run config; its ``data``, ``seed`` and ``eval`` sections are used);
    returns what ``eval.json`` holds (see the module docstring). ``out`` defaults to
    ``eval_<config name>_<split>`` in the checkpoint's run folder; files already there that this call did not
    write are replaced only with ``overwrite``, checked before any prediction. Bags whose features were made otherwise
    than the checkpoint's training features (:mod:`medattn.data.provenance`) are refused, unless ``accept_features``:
    then ``eval.json``'s ``features_accepted`` maps each such sample to how its features differ. ``device``: where the
    model runs (:func:`~medattn.runtime.device.inference_device`; ``auto``: the best this machine has), whatever
    ``train.device`` it was trained with."""
    from medattn.data import build_datasets
    from medattn.runtime.device import inference_device
    from medattn.runtime.trained import load_checkpoint

    from .predictions import predict
    from .sampling import make_loader

    if per_patient is not None and per_patient not in clinical_metrics.AGGREGATIONS:
        raise UserError(f"per-patient aggregation must be one of {', '.join(clinical_metrics.AGGREGATIONS)}, got "
                        f"{per_patient!r}")
    where = inference_device(device)  # a device this machine lacks: before any work
    trained = load_checkpoint(checkpoint)
    task, run_config, folder = trained.task, trained.config, trained.folder
    bundle = build_datasets(config["data"], seed=config["seed"], skip_bad=skip_bad)
    data_task = bundle.task
    accepted: dict = {}
    records = getattr(getattr(bundle, split), "records", None)
    if data_task.input_kind == task.input_kind and records is not None:  # bags made otherwise: refused here
        from medattn.data import input_kinds
        from medattn.data.provenance import check_bags

        accepted = check_bags(input_kinds.of(task.input_kind), trained.meta.get("features"), task.input_shape[0],
                              [record.paths for record in records], accept_features)
    _check_fits(data_task, task, bundle.preprocessing, trained.preprocessing)
    dataset = getattr(bundle, split)
    if len(dataset) == 0:
        raise UserError(f"the {split} split of this data is empty; for an external cohort give every row the split "
                        f"'test' (or data.test_fraction=1 data.val_fraction=0), or choose --split")
    default_root = folder.parent.parent if folder.parent.name == "checkpoints" else folder
    out = Path(out or default_root / f"eval_{config['name']}_{split}")
    target = _output_folder(out, trained, config["data"], overwrite)
    # regression: outputs in units by the checkpoint's training targets, never the evaluated table's (issue 49)
    objective = objective_for(replace(data_task, target_mean=task.target_mean, target_std=task.target_std),
                              run_config["train"]["loss"])
    names = [split, *([f"{split}_patients"] if per_patient else [])]
    for name in names:  # every output before any prediction (medattn.outputs: no file of the user's replaced)
        for file in [*objective.files.split(), "reliability_test.png", "calibration_test.png"]:
            target.path(file.replace("_test.", f"_{name}."))
    target.path("eval.json")
    batch_size = batch_size or run_config["train"]["eval_batch_size"] or run_config["train"]["batch_size"]
    loader = make_loader(dataset, batch_size, False, config["seed"])
    predictor = trained.predictor(where)  # as training scored its test
    pred = predict(predictor, loader, objective, split, progress)
    result: dict = {}
    if distributed.is_main():
        with writing(out):
            survival = load_reference(default_root) if task_types.of(data_task.task_type).events else None  # issue 51
            result = score_split(pred, data_task, split, target, config["eval"], config["seed"], survival=survival,
                                 time_label=time_axis_label(config["data"].get("time_column")))
            if objective.outputs_are_probabilities:  # classification: calibration, operating point, per patient
                ci = config["eval"]["ci"]
                result.update(clinical(pred, result, data_task, split, target, trained.thresholds, ci))
                if per_patient:
                    patients = aggregate(pred, data_task.task_type, per_patient)
                    name = f"{split}_patients"
                    scored = score_split(patients, data_task, name, target, config["eval"], config["seed"])
                    result["per_patient"] = {"aggregation": per_patient, **scored, **clinical(
                        patients, scored, data_task, name, target, trained.thresholds, config["eval"]["ci"])}
            result.update(checkpoint=str(folder), device=str(where), data=config["data"],
                          skipped_samples=bundle.skipped, synthetic=data_task.synthetic, split=split, out=str(out),
                          task=task_to_dict(data_task))
            if accept_features:
                result["features_accepted"] = {", ".join(map(str, paths)): note for paths, note in accepted.items()}
            target.save_json("eval.json", result)
    distributed.cleanup()
    return result


def _check_fits(data_task, task, data_prep, trained_prep) -> None:
    """The data fits the checkpoint: the same task type, input kind, number of outputs and input channels, and
    inputs prepared as for its training (``data_prep`` against ``trained_prep``, where both are known); else a
    UserError saying how they differ."""
    from medattn.data.preprocessing import differences

    if (data_task.task_type, data_task.input_kind, data_task.num_outputs) != \
            (task.task_type, task.input_kind, task.num_outputs) or data_task.input_shape[0] != task.input_shape[0]:
        raise UserError(f"the data ({data_task.task_type}, {data_task.input_kind}, {data_task.num_outputs} output(s), "
                        f"input {data_task.input_shape}) does not fit the checkpoint's task ({task.task_type}, "
                        f"{task.input_kind}, {task.num_outputs} output(s), input {task.input_shape})")
    changed = [] if None in (data_prep, trained_prep) else [  # the training targets' scale is the checkpoint's
        key for key in differences(trained_prep, data_prep) if key not in ("target_mean", "target_std")]
    if changed:  # the model would see inputs prepared unlike its training data
        key = changed[0]
        raise UserError(f"the data config prepares inputs unlike the checkpoint's training: {key} is "
                        f"{getattr(data_prep, key)!r}, the checkpoint's {getattr(trained_prep, key)!r} "
                        f"(differing: {', '.join(changed)})")


def _output_folder(out: Path, trained, data: dict, overwrite: bool):
    """The :class:`~medattn.outputs.OutputFolder` ``out`` of eval's files, whose inputs, never written over,
    are the checkpoint's files and the tables the data config ``data`` names."""
    from medattn.outputs import OutputFolder

    tables = [Path(data[k]) for k in ("csv", "slide_table", "clinical_table", "path") if isinstance(data.get(k), str)]
    return OutputFolder(out, [*trained.folder.iterdir(), *tables], overwrite)


def aggregate(pred: Predictions, task_type: str, how: str) -> Predictions:
    """One row per patient (:func:`medattn.clinical_metrics.aggregate_patients`); the loss stays the samples'."""
    patients, outputs, labels = clinical_metrics.aggregate_patients(pred.outputs, pred.labels, pred.patients, how,
                                                                   task_type)
    return replace(pred, ids=patients, patients=patients, outputs=outputs, labels=labels, statistic=None)


def clinical(pred: Predictions, scored: dict, task, split: str, folder, thresholds: list | None,
             ci: float) -> dict:
    """Operating point at the stored thresholds, ECE and the reliability diagram of one split (``scored``: its
    :func:`score_split` result; no ECE where it found the task's metric undefined, a class missing), the diagram
    saved in ``folder`` (eval's :class:`~medattn.outputs.OutputFolder`)."""
    found = {"thresholds": thresholds, "operating_point": [], "ece": None}
    if thresholds is not None and not task_types.of(task.task_type).class_index:
        found["operating_point"] = clinical_metrics.operating_point(pred.outputs, pred.labels, thresholds, ci,
                                                                    task.class_names)
    if scored.get(task_types.of(task.task_type).metric) is None:  # the split's metric undefined (a class missing)
        return found
    found["ece"] = clinical_metrics.expected_calibration_error(pred.outputs, pred.labels, task.task_type)
    title = f"{split}: ECE {found['ece']:.3f}, n={len(pred.ids)}" + (" (SYNTHETIC data)" if task.synthetic else "")
    figure = clinical_metrics.reliability_figure(pred.outputs, pred.labels, task.task_type, title,
                                                 names=task.class_names)
    folder.save_figure(f"reliability_{split}.png", figure, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(figure)
    return found


def format_result(result: dict) -> str:
    """The lines ``medattn eval`` prints: the metric with its interval, the operating point, the ECE, and the
    same per patient when aggregated."""
    objective = objective_for(task_from_dict(result["task"]))

    def metric(scored: dict, split: str) -> str:
        return objective.test_line(scored).replace("test ", f"{split} ", 1)

    def operating(scored: dict) -> list[str]:
        return [f"  at threshold {p['threshold']:.3f} ({p['output']}): sensitivity {_rate(p['sensitivity'])}, "
                f"specificity {_rate(p['specificity'])}" for p in scored.get("operating_point", [])]

    lines = [metric(result, result["split"]), *survival_lines(result), *result.get("survival_notes", [])[:1],
             *operating(result)]
    if result.get("ece") is not None:
        lines.append(f"  expected calibration error {result['ece']:.3f} (reliability_{result['split']}.png)")
    patients = result.get("per_patient")
    if patients:
        lines += [f"per patient ({patients['aggregation']} of each patient's probabilities):",
                  metric(patients, "patients"), *operating(patients)]
    return "\n".join(lines)


def _rate(rate: dict) -> str:
    if rate["value"] is None:
        return "undefined"
    return f"{rate['value']:.3f} ({rate['ci_low']:.3f}-{rate['ci_high']:.3f})"
