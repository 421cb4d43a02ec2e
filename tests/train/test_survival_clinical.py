"""Issue 51, a survival run as a biostatistician reads it: Brier scores, the integrated Brier score and calibration
from the Breslow baseline of the training risks, risk groups cut on training data, in results.json, the summary,
report.html and medattn eval; medattn plan counts events per split and warns where a split cannot measure a
C-index."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
import yaml

from medattn.cli import main
from medattn.data.base import DataBundle, TaskInfo
from medattn.plan import describe, fingerprint, plan
from medattn.plan.rules import MIN_EVENTS, MIN_PAIRS
from writers import write_csv, write_h5


def _cohort(root, n: int = 90, seed: int = 0) -> dict:
    """``n`` patients with one bag each; feature 0 of three tiles carries a marker m ~ U(0, 2); Weibull event times
    with hazard ratio exp(3 m), censored at U(0, 30) (as tests/train/test_survival_regression.py)."""
    rng = np.random.default_rng(seed)
    (root / "feats").mkdir(parents=True)
    slides, clinical = [], []
    for i in range(n):
        marker = rng.uniform(0, 2)
        tiles = rng.normal(0, 0.3, (6 + i % 5, 8)).astype(np.float32)
        tiles[:3, 0] += marker
        write_h5(root / "feats" / f"s{i}.h5", tiles, rng.integers(0, 5000, (len(tiles), 2)).astype(np.float32))
        slides.append([f"P{i}", f"s{i}.h5"])
        event_time = 10 * (rng.exponential(1) * np.exp(-3 * marker)) ** 0.5
        censor_time = rng.uniform(0, 30)
        clinical.append([f"P{i}", f"{min(event_time, censor_time):.4f}", int(event_time <= censor_time)])
    return {"kind": "wsi_bags", "feature_dir": str(root / "feats"),
            "slide_table": str(write_csv(root / "slides.csv", ["PATIENT", "FILENAME"], slides)),
            "clinical_table": str(write_csv(root / "clinical.csv", ["PATIENT", "os_months", "os_event"], clinical)),
            "task_type": "survival", "time_column": "os_months", "event_column": "os_event",
            "val_fraction": 0.2, "test_fraction": 0.3}


def test_a_survival_run_reports_brier_calibration_and_training_cut_groups(tmp_path, capsys):
    config = {"name": "t", "seed": 0, "data": _cohort(tmp_path), "model": {"name": "abmil_small", "attention": None},
              "train": {"epochs": 12, "batch_size": 16, "lr": 3e-3, "threads": 1, "warmup_epochs": 0},
              "eval": {"bootstrap": 0, "heatmaps": 0}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    run = tmp_path / "run"
    assert main(["train", str(path), "--out", str(run)]) == 0
    printed = capsys.readouterr().out
    test = json.loads((run / "results.json").read_text())["test"]
    reference = json.loads((run / "survival_reference.json").read_text())
    assert set(test["brier"]) == set(test["time_auc"]) and all(0 <= v <= 1 for v in test["brier"].values())
    assert 0 < test["ibs"]["value"] < 0.25 and test["ibs"]["points"] == 50
    assert len(test["calibration"]["groups"]) == 4 and test["calibration"]["error"] is not None
    groups = test["risk_groups"]
    assert groups["cut"] == reference["cut"] and groups["quantile"] == 0.5
    with open(run / "predictions_test.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    high = [float(r["risk"]) > reference["cut"] for r in rows]  # the CSV's groups: the training cut, not the test's
    assert [r["risk_group"] == "high" for r in rows] == high and groups["high"]["n"] == sum(high)
    assert "Brier score    t=" in printed and "(IPCW; lower is better)" in printed
    assert "risk groups    cut at the training risks' median" in printed and "calibration    at t=" in printed
    assert (run / "calibration_test.png").stat().st_size > 10_000
    assert "calibration_test.png" in (run / "report.html").read_text()
    assert main(["eval", str(run), str(path), "--out", str(tmp_path / "eval")]) == 0  # the same test split
    assert "Brier score" in capsys.readouterr().out
    evaluated = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert evaluated["brier"] == pytest.approx(test["brier"], abs=1e-9)
    assert evaluated["ibs"]["value"] == pytest.approx(test["ibs"]["value"], abs=1e-9)
    assert (tmp_path / "eval" / "calibration_test.png").is_file()
    (run / "survival_reference.json").unlink()  # a run from before issue 51: the C-index alone, and why
    assert main(["eval", str(run), str(path), "--out", str(tmp_path / "eval_old")]) == 0
    assert "no Brier score or calibration" in capsys.readouterr().out
    assert "brier" not in json.loads((tmp_path / "eval_old" / "eval.json").read_text())


class _Split(list):
    """A split of samples ``{"input", "label"}`` (labels ``[time, event]``)."""


def _split(times, events) -> _Split:
    return _Split({"input": torch.zeros(1, 8, 8), "label": torch.tensor([t, e], dtype=torch.float32)}
                  for t, e in zip(times, events))


def test_plan_counts_events_per_split_and_warns_where_no_c_index_can_be_measured():
    rng = np.random.default_rng(0)
    train = _split(rng.exponential(10, 60).round(1), rng.random(60) < 0.7)
    bundle = DataBundle(train, _split([3.0, 5.0], [1, 0]), _split([2.0, 4.0, 6.0], [0, 0, 0]),
                        TaskInfo("survival", "image2d", 1, (1, 8, 8)))
    found = fingerprint(bundle)
    assert found["survival"]["val"] == {"cases": 2, "events": 1, "censored": 1, "pairs": 1}
    assert found["survival"]["test"] == {"cases": 3, "events": 0, "censored": 3, "pairs": 0}
    assert found["survival"]["train"]["events"] >= MIN_EVENTS and found["survival"]["train"]["pairs"] >= MIN_PAIRS
    config = {"train": {"epochs": 5, "batch_size": 4, "grad_accum": 1}, "model": {"name": "resnet2d_tiny"},
              "data": {"val_fraction": 0.2, "test_fraction": 0.3}}
    notes = {d.key: d for d in plan(config, found)}
    assert not notes["data.val_fraction"].applied and notes["data.val_fraction"].value == 0.2
    assert "validation split holds 2 cases, 1 event, 1 comparable pair" in notes["data.val_fraction"].reason
    reason = notes["data.val_fraction"].reason
    assert "steps of 0.5" in reason and "picks the kept epoch" in reason
    assert "no C-index can be measured" in notes["data.test_fraction"].reason
    text = describe(found, plan(config, found))
    assert "  survival val: 2 cases, 1 event, 1 censored, 1 comparable pair" in text
    assert "WARNING: the validation split" in text


def _results(c_index: float, ibs: float | None) -> dict:
    return {"metric": "c_index", "data": "wsi_bags", "synthetic": False, "model": "abmil_small", "attention": None,
            "run_dir": "r", "test": {"c_index": c_index, **({"ibs": {"value": ibs}} if ibs is not None else {})}}


def test_cv_and_compare_report_the_integrated_brier_score():
    from medattn.experiments.compare import format_summary, summarise
    from medattn.experiments.cv import summarise_folds

    folds = summarise_folds([_results(0.7, 0.15), _results(0.8, 0.11), _results(0.75, None)])
    row = next(r for r in folds["rows"] if r["structure"] == "integrated Brier score")
    assert row["per_fold"] == [0.15, 0.11, None] and row["mean"] == pytest.approx(0.13) and row["n"] == 2
    arms = {name: {"model": {"name": name, "attention": None}, "eval": {"bootstrap": 0, "ci": 0.95}, "seed": 0}
            for name in ("a", "b")}
    summary = summarise(arms, [0, 1, 2], [_results(0.7, 0.20), _results(0.72, 0.18), _results(0.71, 0.19),
                                          _results(0.75, 0.15), _results(0.74, 0.16), _results(0.78, 0.12)], None)
    assert summary["arms"][1]["ibs_per_seed"] == [0.15, 0.16, 0.12]
    test = next(t for t in summary["tests"] if t["test"].endswith("integrated Brier score"))
    assert test["difference"] == pytest.approx(-0.0466667, abs=1e-6) and test["p_value"] is not None
    assert "integrated Brier score (lower is better), mean (std) over seeds: a 0.190 (0.010)" in format_summary(summary)
