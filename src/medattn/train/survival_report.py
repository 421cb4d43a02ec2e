"""What a biostatistician checks of a survival model beside the C-index: calibrated survival probabilities and how
wrong they are over time, and risk groups cut before the test split was seen.

A Cox model's risk ``r`` ranks patients but gives no probability; the Breslow estimator fitted on the *training*
split's risks gives the baseline cumulative hazard H_0 and so ``S(t | r) = exp(-H_0(t) exp(r))``
(:func:`medattn.metrics_survival_brier.breslow`). The training split also gives the censoring survival G of the
inverse probability of censoring weights (Kaplan-Meier of the censorings, as scikit-survival) and the cut into risk
groups (its risks' median, or ``eval.risk_quantile``). :func:`reference` holds the three, JSON-able; a run writes it
to ``survival_reference.json`` in its folder, where ``medattn eval`` finds it for an external cohort.

:func:`score` adds to a split's result: ``brier`` (the IPCW Brier score at each of the split's times, those of the
time-dependent AUC), ``ibs`` (the integrated Brier score over :func:`~medattn.metrics_survival_brier.ibs_grid`),
``calibration`` (at the middle time: predicted survival against Kaplan-Meier observed per quarter of predicted
survival) and ``risk_groups`` (the training cut, group sizes and events on this split, the log-rank test).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from medattn import metrics_survival
from medattn import metrics_survival_brier as brier
from medattn.metrics import UndefinedMetricError

from .predictions import Predictions

#: The file in a run folder that holds :func:`reference`.
REFERENCE_FILE = "survival_reference.json"
#: Groups of predicted survival in the calibration at a time.
CALIBRATION_GROUPS = 4


def _columns(pred: Predictions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(risk, time, event) of a survival split's predictions; time keeps its dtype (float32 labels)."""
    return pred.outputs[:, 0], pred.labels[:, 0], pred.labels[:, 1].astype(bool)


def reference(train: Predictions, quantile: float = 0.5) -> dict:
    """What the training split fixes for scoring any other split: the Breslow baseline, the censoring survival G
    and the risk cut (the ``quantile`` of the training risks) -> JSON-able dict."""
    risk, time, event = _columns(train)
    found = {"n": len(risk), "events": int(event.sum()), "max_time": float(np.max(time)),
             "cut_quantile": quantile, "cut": brier.training_cut(risk, quantile),
             "censoring": brier.censoring(time, event).to_dict()}
    if train.outputs.shape[1] == 1:  # one risk (competing risks: K, the cut is the first's, no baseline)
        found["baseline"] = brier.breslow(risk, time, event).to_dict()
    return found


def plain_training_set(bundle):
    """The training split as evaluation reads it: a table's records with the validation split's loader (no
    augmentation, whole bags); a dataset of another kind as it is."""
    from medattn.data.tables import RecordDataset

    train, val = bundle.train, bundle.val
    if isinstance(train, RecordDataset) and isinstance(val, RecordDataset):
        return RecordDataset(train.records, val.load)
    return train


def training_reference(model, config: dict, bundle, objective, device, progress: bool = False) -> dict:
    """:func:`reference` of the kept model's risks on the training split (:func:`plain_training_set`), predicted as
    the test split is (every rank takes part; ``config["eval"].get("risk_quantile", 0.5)`` cuts the groups)."""
    from medattn.runtime.predictor import Predictor

    from .predictions import predict
    from .sampling import make_loader

    train_cfg = config["train"]
    loader = make_loader(plain_training_set(bundle), train_cfg["eval_batch_size"] or train_cfg["batch_size"], False,
                         config["seed"], train_cfg["num_workers"])
    train = predict(Predictor.for_run(model, config, bundle.task, device), loader, objective, "train", progress)
    return reference(train, config["eval"].get("risk_quantile") or 0.5)


def load_reference(folder: Path) -> dict | None:
    """``survival_reference.json`` of a run folder, or None (a run from before it was written)."""
    path = Path(folder) / REFERENCE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def score(pred: Predictions, ref: dict, times: list[float]) -> dict:
    """Brier scores at ``times``, the integrated Brier score, calibration at the middle time and the risk groups of
    one split, scored with the training ``ref`` (:func:`reference`); an undefined part is None with a note in
    ``survival_notes``."""
    risk, time, event = _columns(pred)
    baseline = brier.Baseline.from_dict(ref["baseline"])
    censoring = brier.Steps.from_dict(ref["censoring"])
    found: dict = {"brier": {}, "ibs": None, "calibration": None, "risk_groups": groups(risk, time, event, ref)}
    notes = found["survival_notes"] = []
    for t in times:
        try:
            found["brier"][f"{t:g}"] = float(brier.brier_score(baseline.survival(risk, [t]), time, event, [t],
                                                               censoring)[0])
        except UndefinedMetricError as error:
            found["brier"][f"{t:g}"] = None
            notes.append(str(error))
    grid = brier.ibs_grid(time, [ref["max_time"]])
    try:
        value = brier.integrated_brier_score(baseline.survival(risk, grid), time, event, grid, censoring)
        found["ibs"] = {"value": value, "from": float(grid[0]), "to": float(grid[-1]), "points": len(grid)}
    except UndefinedMetricError as error:
        notes.append(str(error))
    if times:
        t = sorted(times)[len(times) // 2]
        found["calibration"] = brier.calibration_at(baseline.survival(risk, [t])[:, 0], time, event, t,
                                                    CALIBRATION_GROUPS)
    return found


def times_of(pred: Predictions, eval_cfg: dict) -> list[float]:
    """The times of the Brier scores: ``eval.times``, else those of the time-dependent AUC (the quartiles of the
    split's event times, :mod:`medattn.train.survival_objective`)."""
    from .survival_objective import _default_times

    _, time, event = _columns(pred)
    return [float(t) for t in eval_cfg.get("times") or _default_times(time, event)]


def groups(risk: np.ndarray, time: np.ndarray, event: np.ndarray, ref: dict) -> dict:
    """The split cut at the training ``ref["cut"]``: sizes and events per group and the log-rank test (None where
    one group is empty or it is undefined)."""
    high = metrics_survival.risk_groups(risk, ref["cut"])
    found = {"cut": ref["cut"], "quantile": ref["cut_quantile"], "high": {"n": int(high.sum()),
             "events": int(event[high].sum())}, "low": {"n": int((~high).sum()), "events": int(event[~high].sum())},
             "logrank": None}
    if high.any() and not high.all():
        try:
            statistic, p_value = metrics_survival.logrank_test(time, event, high)
            found["logrank"] = {"statistic": float(statistic), "p": float(p_value)}
        except UndefinedMetricError:
            pass
    return found


def lines(result: dict) -> list[str]:
    """The lines a summary and ``medattn eval`` print under the C-index (none without a training reference)."""
    if "brier" not in result:
        return []
    out = []
    shown = [f"t={t} {'-' if v is None else f'{v:.3f}'}" for t, v in result["brier"].items()]
    ibs = result.get("ibs")
    if shown or ibs:
        out.append("Brier score    " + ", ".join(shown) + (f"; integrated {ibs['value']:.3f} over "
                                                          f"{ibs['from']:.3g} to {ibs['to']:.3g}" if ibs else "")
                   + " (IPCW; lower is better)")
    calibration = result.get("calibration")
    if calibration and calibration["error"] is not None:
        pairs = ", ".join(f"{g['predicted']:.2f}/{'-' if g['observed'] is None else format(g['observed'], '.2f')}"
                          for g in calibration["groups"])
        out.append(f"calibration    at t={calibration['time']:g}, predicted/observed survival per risk quarter: "
                   f"{pairs}; mean |difference| {calibration['error']:.3f}")
    g = result["risk_groups"]
    p = "" if g["logrank"] is None else f", log-rank p {g['logrank']['p']:.3g}"
    out.append(f"risk groups    cut at the training risks' {_quantile(g['quantile'])} ({g['cut']:.3g}): high "
               f"n={g['high']['n']} ({_events(g['high']['events'])}), low n={g['low']['n']} "
               f"({_events(g['low']['events'])}){p}")
    return out


def _quantile(q: float) -> str:
    return "median" if q == 0.5 else f"{q:g} quantile"


def _events(count: int) -> str:
    return f"{count} event" if count == 1 else f"{count} events"


def write(result: dict, folder, split: str, heading: str, synthetic: bool, time_label: str) -> None:
    """``calibration_<split>.png`` (:func:`medattn.survival_plots.calibration_figure`) in ``folder`` (an
    :class:`~medattn.outputs.OutputFolder`) where calibration was measured."""
    calibration = result.get("calibration")
    if not calibration or calibration["error"] is None:
        return
    from medattn.survival_plots import calibration_figure

    figure = calibration_figure(calibration, heading + (" (SYNTHETIC data)" if synthetic else ""), time_label)
    folder.save_figure(f"calibration_{split}.png", figure, dpi=100)
