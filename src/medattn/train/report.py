"""What a run writes for people: per-epoch metrics, training curves, per-sample predictions, ROC curves, the
summary and the warnings that a run learned nothing. The objectives compute (:mod:`medattn.train.objectives`);
this module writes."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from medattn import metrics
from medattn.data.base import TaskInfo
from medattn.outputs import OutputFolder
from medattn.runtime import distributed
from medattn.vocabulary import task_types

from .objectives import Objective, Predictions, objective_for, output_names


def score_split(pred: Predictions, task: TaskInfo, split: str, folder: OutputFolder, eval_cfg: dict, seed: int,
                label: str = "", survival: dict | None = None, time_label: str = "time") -> dict:
    """Score one split as the task's objective does (:func:`objective_for`) and write its files
    (:func:`write_split`) in ``folder``; -> the objective's result. ``survival``: the training split's reference
    (:func:`medattn.train.survival_report.reference`) adds Brier scores, calibration and risk groups cut on
    training data (``calibration_<split>.png``); ``time_label`` names the time axis of the figures."""
    result = objective_for(task).score(pred, split, eval_cfg, seed)
    kind = task_types.of(task.task_type)
    events = kind.events
    if kind.causes and survival is not None:  # competing risks: the cause-1 risk groups cut on training data
        result["risk_groups"] = {"cut": survival["cut"], "quantile": survival["cut_quantile"]}
    elif events and survival is not None and result.get("c_index") is not None:
        from . import survival_report

        result.update(survival_report.score(pred, survival, survival_report.times_of(pred, eval_cfg)))
        heading = f"{label + ', ' if label else ''}{split}"
        survival_report.write(result, folder, split, heading, task.synthetic, time_label)
    elif events and result.get("c_index") is not None:
        result["survival_notes"] = ["no Brier score or calibration: the run folder has no survival_reference.json "
                                    "(the training split's baseline hazard; runs from before issue 51)"]
    write_split(pred, task, split, folder, result, label, time_label)
    return result


def write_split(pred: Predictions, task: TaskInfo, split: str, folder: OutputFolder, result: dict, label: str = "",
                time_label: str = "time") -> None:
    """``predictions_<split>.csv`` and the split's figure, by the task type's writer
    (:attr:`~medattn.vocabulary.task_types.TaskType.writer`: :func:`write_classes`, :func:`write_segmentation`,
    :func:`write_survival`, :func:`write_regression`)."""
    heading = f"{label + ', ' if label else ''}{split}"
    task_types.of(task.task_type).component("writer")(pred, task, split, folder, result, heading, time_label)


def write_segmentation(pred: Predictions, task: TaskInfo, split: str, folder: OutputFolder, result: dict, heading: str,
                       time_label: str) -> None:
    """Segmentation: ``predictions_<split>.csv`` of the Dice per case and class."""
    write_cases(pred, output_names(task, pred.outputs.shape[1]), folder, f"predictions_{split}.csv")


def write_survival(pred: Predictions, task: TaskInfo, split: str, folder: OutputFolder, result: dict, heading: str,
                   time_label: str) -> None:
    """Survival: ``predictions_<split>.csv`` of the risks and groups, and ``km_<split>.png`` where the C-index is
    defined."""
    cut = result.get("risk_groups", {}).get("cut")
    write_risks(pred, folder, f"predictions_{split}.csv", cut)
    if result.get("c_index") is not None:
        plot_kaplan_meier(pred, result, folder, f"km_{split}.png", heading, task.synthetic, time_label)


def write_regression(pred: Predictions, task: TaskInfo, split: str, folder: OutputFolder, result: dict, heading: str,
                     time_label: str) -> None:
    """Regression: ``predictions_<split>.csv`` of the values, and ``predicted_<split>.png`` where R^2 is defined."""
    names = output_names(task, pred.outputs.shape[1])
    write_values(pred, names, folder, f"predictions_{split}.csv")
    if result.get("r2") is not None:
        plot_predicted(pred, names, folder, f"predicted_{split}.png", heading, task.synthetic)


def write_classes(pred: Predictions, task: TaskInfo, split: str, folder: OutputFolder, result: dict, heading: str,
                  time_label: str) -> None:
    """Classification: ``predictions_<split>.csv`` of the probabilities and, where the AUROC is defined,
    ``roc_<split>.png`` titled with the model, n and the AUROC with its CI."""
    write_predictions(pred, task, folder, f"predictions_{split}.csv")
    if result.get("auroc") is None:
        return
    ci = "" if result["ci_low"] is None else f" (95% CI {span(result['ci_low'], result['ci_high'])})"
    title = f"{heading}: AUROC {result['auroc']:.3f}{ci}, n={result['n']}"
    title += " (SYNTHETIC data)" if task.synthetic else ""
    figure = metrics.roc_figure(pred.outputs, pred.labels, task.task_type, title, task.class_names)
    folder.save_figure(f"roc_{split}.png", figure, dpi=100)
    _close(figure)


def span(low: float, high: float) -> str:
    """An interval of rates (AUROC, sensitivity, a chance interval) as ``"a to b"``, both clipped to [0, 1]: no
    bound outside what a rate can be, and no minus sign that reads as a dash ("-0.480-1.480")."""
    return f"{min(max(low, 0.0), 1.0):.3f} to {min(max(high, 0.0), 1.0):.3f}"


def class_labels(labels: np.ndarray, task: TaskInfo) -> list[str]:
    """Each case's label (N,) or (N, K) by its class name(s): binary with one name ``"cardiomegaly"`` /
    ``"no cardiomegaly"``, multi-class the class's name, multi-label the present labels' names (``"none"``);
    the number where the task names no classes."""
    names, kind = list(task.class_names), task_types.of(task.task_type)
    return [kind.label_text([int(round(float(v))) for v in row], names)
            for row in np.asarray(labels).reshape(len(labels), -1)]


def write_predictions(pred: Predictions, task: TaskInfo, folder: OutputFolder, name: str) -> None:
    """Classification CSV: id, patient, the label(s) and one probability column per output."""
    names = output_names(task, pred.outputs.shape[1])
    index = task_types.of(task.task_type).class_index
    label_cols = ["label"] if index else [f"label_{n}" for n in names]
    rows = []
    for i, sample_id in enumerate(pred.ids):
        label = [int(pred.labels[i])] if index else [int(v) for v in pred.labels[i]]
        rows.append([sample_id, pred.patients[i], *label, *[f"{p:.6f}" for p in pred.outputs[i]]])
    folder.save_csv(name, ["id", "patient", *label_cols, *[f"prob_{n}" for n in names]], rows)



def write_risks(pred: Predictions, folder: OutputFolder, name: str, cut: float | None = None) -> None:
    """Survival CSV: id, patient, time, event, the risk score (log relative risk; higher = earlier event) and
    the risk group (``high`` above ``cut``, the training risks' median, else the split's own median,
    :func:`medattn.metrics_survival.risk_groups`)."""
    from medattn.metrics_survival import risk_groups

    high = risk_groups(pred.outputs[:, 0], cut)
    rows = [[sample_id, pred.patients[i], f"{pred.labels[i, 0]:.9g}", int(pred.labels[i, 1]),
             f"{pred.outputs[i, 0]:.6f}", "high" if high[i] else "low"] for i, sample_id in enumerate(pred.ids)]
    folder.save_csv(name, ["id", "patient", "time", "event", "risk", "risk_group"], rows)


def write_values(pred: Predictions, names: list[str], folder: OutputFolder, name: str) -> None:
    """Regression CSV: id, patient, the true and the predicted value of every target (9 significant digits: float32's
    round trip, so a target of seven digits is written as it was scored)."""
    rows = [[sample_id, pred.patients[i], *[f"{v:.9g}" for v in pred.labels[i]], *[f"{v:.9g}" for v in pred.outputs[i]]]
            for i, sample_id in enumerate(pred.ids)]
    folder.save_csv(name, ["id", "patient", *[f"true_{n}" for n in names], *[f"pred_{n}" for n in names]], rows)


def plot_kaplan_meier(pred: Predictions, result: dict, folder: OutputFolder, name: str, heading: str,
                      synthetic: bool, time_label: str = "time") -> None:
    """``km_<split>.png``: Kaplan-Meier curves of the predicted high- and low-risk groups (cut at the training
    risks' median where ``result["risk_groups"]`` holds it, else at this split's median), titled with the C-index
    and the log-rank p-value; the x axis reads ``time_label``."""
    from medattn.metrics_survival import risk_groups
    from medattn.survival_plots import kaplan_meier_figure

    ci = "" if result["ci_low"] is None else f" (95% CI {span(result['ci_low'], result['ci_high'])})"
    title = f"{heading}: C-index {result['c_index']:.3f}{ci}, n={result['n']}"
    title += " (SYNTHETIC data)" if synthetic else ""
    cut = result.get("risk_groups", {}).get("cut")
    figure = kaplan_meier_figure(pred.labels[:, 0], pred.labels[:, 1].astype(bool),
                                 risk_groups(pred.outputs[:, 0], cut), title, time_label=time_label)
    folder.save_figure(name, figure, dpi=100)
    _close(figure)


def plot_predicted(pred: Predictions, names: list[str], folder: OutputFolder, name: str, heading: str,
                   synthetic: bool) -> None:
    """``predicted_<split>.png``: predicted against true values of the first target, with the identity line."""
    from medattn.survival_plots import predicted_vs_true_figure

    title = heading + (" (SYNTHETIC data)" if synthetic else "")
    figure = predicted_vs_true_figure(pred.outputs[:, 0], pred.labels[:, 0], f"{names[0]} ({title})")
    folder.save_figure(name, figure, dpi=100)
    _close(figure)


def _close(figure) -> None:
    import matplotlib.pyplot as plt

    plt.close(figure)


def write_cases(pred: Predictions, names: list[str], folder: OutputFolder, name: str) -> None:
    """Segmentation CSV: id, patient, mean foreground Dice, Dice per class (empty where undefined), label voxels
    per class."""
    def cell(value: float) -> str:
        return "" if np.isnan(value) else f"{value:.6f}"

    rows = []
    for i, sample_id in enumerate(pred.ids):
        foreground = pred.outputs[i, 1:]
        mean = float(np.nanmean(foreground)) if not np.isnan(foreground).all() else float("nan")
        rows.append([sample_id, pred.patients[i], cell(mean), *[cell(v) for v in pred.outputs[i]],
                     *[int(v) for v in pred.labels[i]]])
    folder.save_csv(name, ["id", "patient", "mean_dice", *[f"dice_{n}" for n in names],
                           *[f"voxels_{n}" for n in names]], rows)


#: A train loss that never went below this fraction of its first epoch's "never left its start"; one that went below
#: it and ended above it again "rose back".
FLAT_LOSS_FRACTION = 0.95
#: Test probabilities whose 5th-95th percentile spread is below this, for every output, "collapsed".
NARROW_BAND = 0.05


def learning_warnings(train_losses: list[float], probabilities: np.ndarray | None,
                      fitted_start: float | None = None) -> list[str]:
    """Signs that a run learned nothing, as sentences for the summary (empty when none).

    ``train_losses``: mean train loss per epoch, in order; ``probabilities``: test outputs (N, K) of a
    classification task, or None; ``fitted_start``: the training loss the model started from when its pooled-feature
    path was fitted before training (:mod:`medattn.train.pooled_path`), else None (the start is epoch 1's loss). The
    signs: no epoch's train loss went below ``FLAT_LOSS_FRACTION`` of the start's (over at least two epochs: "never
    left its start"; from a fitted start: the transformer added nothing to the pooled model); it went below and the
    last epoch's is above it again (training fell back: the kept checkpoint is the best validation epoch, from
    before); the test probabilities of every output lie within a 5th-95th percentile band narrower than
    ``NARROW_BAND`` (the model tells the cases apart barely or not at all, whatever the AUROC says).
    """
    found = []
    if len(train_losses) >= 2:
        start = train_losses[0] if fitted_start is None else fitted_start
        flat, lowest = FLAT_LOSS_FRACTION * start, int(np.argmin(train_losses))
        if train_losses[lowest] > flat and fitted_start is not None:
            found.append(f"the train loss never went below the pooled-feature path's fit ({start:.4f} before "
                         f"training, lowest {train_losses[lowest]:.4f}): the transformer added little to the "
                         f"pooled model")
        elif train_losses[lowest] > flat:
            found.append(f"the train loss never left its start ({train_losses[0]:.4f} in epoch 1, lowest "
                         f"{train_losses[lowest]:.4f}): the model may have learned nothing")
        elif train_losses[-1] > flat:
            found.append(f"the train loss fell to {train_losses[lowest]:.4f} (epoch {lowest + 1}) and rose back to "
                         f"{train_losses[-1]:.4f} by epoch {len(train_losses)} (start {start:.4f}): "
                         f"training became unstable; the checkpoint kept is the best validation epoch")
    if probabilities is not None and len(probabilities) >= 2:
        low, high = np.percentile(probabilities, [5, 95], axis=0)
        if float((high - low).max()) < NARROW_BAND:
            found.append(f"the test probabilities collapse to a band {float((high - low).max()):.3f} wide "
                         f"(5th-95th percentile): the model barely tells the cases apart")
    return found


#: |Spearman rho| between a test output and a trivial statistic at or above this: "follows the statistic".
TRIVIAL_RHO = 0.9


def trivial_statistic_warnings(probabilities: np.ndarray | None, statistic: np.ndarray | None,
                               name: str) -> list[str]:
    """A sentence for each output whose test probabilities (N, K) follow a trivial per-sample ``statistic``
    (N,) (``name``: "image mean intensity" or "bag size") with ``|Spearman rho| >= TRIVIAL_RHO``
    (``scipy.stats.spearmanr``, ties averaged). 0.9 means the ranking the AUROC scores is nearly the
    statistic's own (the issue's fundus ViTs had rho -1.00 with the image mean); a finding that truly moves
    the statistic can reach it too, so the sentence asks the user to check, it does not judge. Nothing when
    either side is constant or there are fewer than 3 samples."""
    if probabilities is None or statistic is None or len(statistic) < 3 or np.ptp(statistic) == 0:
        return []
    from scipy.stats import spearmanr

    found = []
    for k in range(probabilities.shape[1]):
        if np.ptp(probabilities[:, k]) == 0:
            continue
        rho = float(spearmanr(probabilities[:, k], statistic).statistic)
        if abs(rho) >= TRIVIAL_RHO:
            which = "the test probabilities" if probabilities.shape[1] == 1 else f"test output {k}"
            found.append(f"{which} follow the {name} (Spearman rho {rho:+.2f}): the model may have learned "
                         f"that statistic rather than the finding; check it against a baseline")
    return found


def recipe_text(record: dict | None) -> str | None:
    """The recipe search's record (``recipe.record``, :mod:`medattn.experiments.recipe`) in one line: the choice,
    every candidate's validation score per round and the cost; None for a run without one."""
    if not record:
        return None
    if not record.get("searched"):
        return f"the defaults, no search ({record.get('reason')})"
    scores = "; ".join(f"{c['name']} " + " / ".join("failed" if t["val_score"] is None else f"{t['val_score']:.4f}"
                                                    for t in c["trials"]) for c in record["candidates"])
    cost = (record["trial_epochs"] + record["single_run_epochs"]) / record["single_run_epochs"]
    chooser = record.get("by", "the validation split")  # records before inner cross-validation have no "by"
    simpler = record.get("simpler_kept")  # the one-standard-error rule (medattn.experiments.recipe)
    rule = (f", the simpler model within one standard error ({record['standard_error']:.4f}) of {simpler}'s best,"
            if simpler else ", no candidate learned in its trial," if record.get("none_learned") else "")
    return (f"chose {record['chosen']}{rule} by the score on {chooser} ({scores}; rounds of {record['rounds']} "
            f"epochs); {cost:.2f} single runs, budget {record['budget']:g}")


def summary(results: dict, objective: Objective) -> str:
    """The one-screen summary printed at the end of a run."""
    test = results["test"]
    tag = "  [SYNTHETIC data]" if results["synthetic"] else ""
    mechanism = f" with {results['attention']} attention" if results["attention"] else ""
    lines = [
        "=" * 72,
        f"run            {results['run_dir']}{tag}",
        f"data           {results['data']}  (train {results['n_train']}, val {results['n_val']}, "
        f"test {test['n']}; skipped {results['skipped_samples']})",
        f"model          {results['model']}{mechanism} ({results['parameters'] / 1e6:.2f} M parameters)",
        f"best epoch     {results['best_epoch']} of {results['epochs']}  "
        f"(val {objective.metric_label} {results[f'val_{objective.metric}']:.4f})",
        objective.test_line(test),
        *survival_lines(test),
        f"time           {results['elapsed_seconds']:.1f} s in all ({results['train_seconds']:.1f} s training and "
        f"validation; the rest reading data, building the model, testing)" if "elapsed_seconds" in results else
        f"time           {results['train_seconds']:.1f} s training and validation",
        *(["defaults       " + ", ".join(f"{k}={v}" for k, v in results["defaults"].items())]
          if results.get("defaults") else []),
        *([f"recipe         {recipe_text(results['recipe'])}"] if results.get("recipe") else []),
        f"files          config.yaml metrics.csv training_curves.png checkpoints/best {objective.files} results.json "
        f"report.html" + (" calibration_test.png survival_reference.json" if test.get("calibration") else ""),
        *([f"VERDICT        did not learn: this run is not a result ({len(results['learning']['reasons'])} "
           f"reason(s) below)"] if not results.get("learning", {}).get("learned", True) else []),
        *(f"WARNING        {warning}" for warning in results.get("warnings", [])),
        "=" * 72,
    ]
    return "\n".join(lines)


def survival_lines(test: dict) -> list[str]:
    """Brier scores, calibration and training-cut risk groups of a survival split (none for other tasks)."""
    from .survival_report import lines

    return lines(test)


def append_metrics(folder: OutputFolder, row: dict, fields: tuple[str, ...]) -> None:
    """Add one epoch's ``row`` to ``metrics.csv`` in the run folder ``folder``."""
    folder.append_csv("metrics.csv", [row], fields)


class TensorBoardScalars:
    """Each epoch's metrics.csv row as TensorBoard scalars (tag = column, step = epoch) in ``run_dir/tensorboard``
    (``train.tensorboard=true``). A resumed run starts its events at ``first_epoch``: TensorBoard drops the
    steps a previous attempt wrote after the checkpoint resumed from, as :func:`truncate_metrics` does."""

    def __init__(self, run_dir: Path, first_epoch: int = 1) -> None:
        from medattn.extras import require

        require("tensorboard", "train.tensorboard=true")
        from .rundir import tensorboard_writer  # the run folder's own sub-folder (train.rundir)

        self.writer = tensorboard_writer(run_dir, first_epoch)

    def add(self, row: dict) -> None:
        for key, value in row.items():
            if key != "epoch" and isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, row["epoch"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def truncate_metrics(folder: OutputFolder, last_epoch: int, fields: tuple[str, ...]) -> None:
    """Drop the rows of ``metrics.csv`` in the run folder ``folder`` written after the checkpoint a run resumes from."""
    path = folder.folder / "metrics.csv"
    if not path.exists() or not distributed.is_main():
        return
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if int(r["epoch"]) <= last_epoch]
    folder.save_dicts("metrics.csv", rows, fields)


def read_metrics(path: Path) -> list[dict]:
    """metrics.csv as a list of rows (numbers as floats)."""
    with open(path, newline="") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def plot_curves(rows: list[dict], score_key: str, folder: OutputFolder, title: str, best_epoch: int | None = None,
                name: str = "training_curves.png"):
    """``name`` in ``folder`` (training_curves.png): train and validation loss (left) and the validation score
    (right) per epoch, the kept (best validation) epoch marked by a dashed line in both; -> the figure's axes
    (closed), for tests."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    epochs = [int(row["epoch"]) for row in rows]
    fig, (ax_loss, ax_score) = plt.subplots(1, 2, figsize=(9, 3.5))
    ax_loss.plot(epochs, [row["train_loss"] for row in rows], "o-", label="train")
    ax_loss.plot(epochs, [row["val_loss"] for row in rows], "o-", label="validation")
    ax_loss.set(xlabel="epoch", ylabel="loss")
    ax_loss.legend()
    ax_score.plot(epochs, [row[score_key] for row in rows], "o-", color="C2")
    ax_score.set(xlabel="epoch", ylabel=score_key.replace("_", " "))
    if best_epoch is not None:
        for axis in (ax_loss, ax_score):
            axis.axvline(best_epoch, color="0.4", linestyle="--", linewidth=1, label=f"kept: epoch {best_epoch}")
        ax_score.legend()
    for axis in (ax_loss, ax_score):  # epochs are whole: no 1.2, 1.4 ... on a short run
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    heading = fig.suptitle(title)
    fig.tight_layout()
    metrics.fit_title(fig, heading)
    folder.save_figure(name, fig, dpi=100)
    plt.close(fig)
    return ax_loss, ax_score
