"""Survival and regression tasks from a table through train, eval, predict and export: bags whose hazard (survival)
or target (regression) rises with a planted feature, small enough for a few seconds of training."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
import yaml
from scipy.stats import pearsonr

from medattn.cli import main
from medattn.config import load_config
from medattn.data import build_datasets
from medattn.data.base import TaskInfo
from medattn.data.cohort.labels import LabelSpec, label_columns
from medattn.errors import UserError
from medattn.metrics_survival import concordance_index
from medattn.runtime.checkpoint import check_meta
from medattn.train.objectives import objective_for
from writers import write_csv, write_h5, write_pillow

FEATURES = 8


def _cohort(root, task: str, n: int = 90, seed: int = 0) -> dict:
    """``n`` patients, one bag each: tiles are noise, and feature 0 of a few tiles carries the patient's marker
    ``m`` ~ U(0, 2). Survival: Weibull times of shape 2 and hazard ratio exp(3 m) (time = 10 (E exp(-3 m))^(1/2),
    E ~ Exp(1)), censored at an independent U(0, 30) time (about 10% censored; the marker itself reaches a
    C-index near 0.82); regression: target 10 + 5 m + noise, plus a second target 3 - m."""
    rng = np.random.default_rng(seed)
    (root / "feats").mkdir(parents=True)
    slides, clinical = [], []
    for i in range(n):
        marker = rng.uniform(0, 2)
        tiles = rng.normal(0, 0.3, (6 + i % 5, FEATURES)).astype(np.float32)
        tiles[:3, 0] += marker
        write_h5(root / "feats" / f"s{i}.h5", tiles, rng.integers(0, 5000, (len(tiles), 2)).astype(np.float32))
        slides.append([f"P{i}", f"s{i}.h5"])
        if task == "survival":
            event_time = 10 * (rng.exponential(1) * np.exp(-3 * marker)) ** 0.5
            censor_time = rng.uniform(0, 30)
            clinical.append([f"P{i}", f"{min(event_time, censor_time):.4f}", int(event_time <= censor_time)])
        else:
            clinical.append([f"P{i}", f"{10 + 5 * marker + rng.normal(0, 0.5):.4f}", f"{3 - marker:.4f}"])
    header = ["PATIENT", "os_months", "os_event"] if task == "survival" else ["PATIENT", "psa", "score"]
    data = {"kind": "wsi_bags", "feature_dir": str(root / "feats"),
            "slide_table": str(write_csv(root / "slides.csv", ["PATIENT", "FILENAME"], slides)),
            "clinical_table": str(write_csv(root / "clinical.csv", header, clinical)), "task_type": task,
            "val_fraction": 0.2, "test_fraction": 0.3}
    data.update({"time_column": "os_months", "event_column": "os_event"} if task == "survival"
                else {"label_columns": ["psa", "score"]})
    return data


def _config(root, data: dict) -> str:
    config = {"name": "t", "seed": 0, "data": data, "model": {"name": "abmil_small", "attention": None},
              "train": {"epochs": 12, "batch_size": 16, "lr": 3e-3, "threads": 1, "warmup_epochs": 0},
              "eval": {"bootstrap": 50, "heatmaps": 0}}
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def _rows(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_a_survival_run_learns_the_hazard_and_every_command_serves_it(tmp_path, capsys):
    config = _config(tmp_path, _cohort(tmp_path, "survival"))
    run = tmp_path / "run"
    assert main(["train", config, "--out", str(run)]) == 0
    printed = capsys.readouterr().out
    results = json.loads((run / "results.json").read_text())
    assert results["metric"] == "c_index" and results["learning"]["learned"], results["learning"]
    assert results["test"]["c_index"] > 0.7 and "log-rank" in printed and "test C-index" in printed
    assert results["test"]["ci_low"] < results["test"]["c_index"] < results["test"]["ci_high"]
    rows = _rows(run / "predictions_test.csv")
    risk, time, event = (np.array([float(r[c]) for r in rows]) for c in ("risk", "time", "event"))
    assert concordance_index(risk, time, event.astype(bool)) == pytest.approx(results["test"]["c_index"], abs=1e-6)
    assert (run / "km_test.png").stat().st_size > 10_000
    assert main(["eval", str(run), config, "--out", str(tmp_path / "eval")]) == 0  # the same test split
    evaluated = json.loads(next((tmp_path / "eval").rglob("eval.json")).read_text())
    assert evaluated["c_index"] == pytest.approx(results["test"]["c_index"], abs=1e-6)
    bags = sorted((tmp_path / "feats").glob("s*.h5"))[:5]
    assert main(["predict", str(run), *map(str, bags), "--out", str(tmp_path / "p.csv")]) == 0
    predicted = _rows(tmp_path / "p.csv")
    assert "risk" in predicted[0] and all(np.isfinite(float(r["risk"])) for r in predicted)


def test_a_regression_run_predicts_in_the_targets_units(tmp_path, capsys):
    data = _cohort(tmp_path, "regression")
    config = _config(tmp_path, data)
    run = tmp_path / "run"
    assert main(["train", config, "--out", str(run)]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["metric"] == "r2" and results["learning"]["learned"], results["learning"]
    assert results["test"]["r2"] > 0.5 and "MAE, RMSE" in capsys.readouterr().out
    assert set(results["test"]["metrics"]) >= {"mae", "rmse", "r2", "pearson_r", "mae/psa", "r2/score"}
    rows = _rows(run / "predictions_test.csv")
    predicted, true = (np.array([float(r[c]) for r in rows]) for c in ("pred_psa", "true_psa"))
    assert abs(predicted.mean() - true.mean()) < 2.0 and 0.5 < predicted.std() / true.std() < 1.5  # in the units
    bundle = build_datasets({**data}, seed=0)
    train = torch.stack([r.label for r in bundle.train.records]).double()
    assert bundle.task.target_mean == pytest.approx(train.mean(0).tolist())
    assert bundle.task.target_std == pytest.approx(train.std(0, correction=0).tolist())
    bags = [tmp_path / "feats" / f"{r['id'].replace('P', 's')}.h5" for r in rows[:4]]
    assert main(["predict", str(run), *map(str, bags), "--out", str(tmp_path / "p.csv")]) == 0
    np.testing.assert_allclose([float(r["pred_psa"]) for r in _rows(tmp_path / "p.csv")], predicted[:4], rtol=1e-4)
    (run / "exported").mkdir()
    assert main(["export", str(run), "--format", "onnx", "--out", str(run / "exported" / "model.onnx")]) == 0


def test_survival_labels_are_checked_and_stratified_by_event():
    spec = LabelSpec("survival", [], 1)
    assert spec.tensor([12.5, 1.0]).tolist() == [12.5, 1.0] and spec.stratum(torch.tensor([3.0, 0.0])) == "0"
    with pytest.raises(ValueError, match="negative"):
        spec.tensor([-1.0, 1.0])
    with pytest.raises(ValueError, match="censored"):
        spec.tensor([3.0, 2.0])
    assert label_columns({"task_type": "survival", "time_column": "t", "event_column": "e"}, "k") == ["t", "e"]
    with pytest.raises(UserError, match="event_column"):
        label_columns({"task_type": "survival", "time_column": "t"}, "k")
    with pytest.raises(UserError, match="task_type: survival"):
        label_columns({"label_columns": "y", "time_column": "t"}, "k")


def test_a_survival_batch_of_one_is_refused(tmp_path):
    config = _config(tmp_path, _cohort(tmp_path, "survival", n=20))
    text = yaml.safe_load(open(config))
    text["train"]["batch_size"] = 1
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(text))
    assert main(["train", config, "--out", str(tmp_path / "run")]) != 0


def test_compare_cv_and_explain_serve_a_survival_task(tmp_path, capsys):
    """compare: the C-index per seed and the paired tests; cv: a C-index per fold; explain: what raises the risk,
    tile by tile, where the tiles carrying the marker should rank highest."""
    data = _cohort(tmp_path, "survival", n=60)
    config = _config(tmp_path, data)
    out = tmp_path / "compare"
    assert main(["compare", config, "--models", "abmil_small", "transmil_tiny", "--seeds", "0", "1",
                 "--out", str(out), "model.attention=null", "train.epochs=6"]) == 0
    summary = json.loads((out / "compare.json").read_text())
    assert summary["metric"] == "c_index" and "C-index" in capsys.readouterr().out
    assert all(0 <= v <= 1 for arm in summary["arms"] for v in arm["per_seed"] if v is not None)
    assert main(["cv", config, "--folds", "2", "--out", str(tmp_path / "cv"), "train.epochs=4",
                 "data.test_fraction=null", "data.val_fraction=0.2"]) == 0
    folds = json.loads((tmp_path / "cv" / "cv.json").read_text())
    assert folds["metric"] == "c_index" and folds["rows"][0]["structure"] == "C-index"
    run = next(out.glob("abmil_small/seed_0"))
    bag = tmp_path / "feats" / "s3.h5"
    assert main(["explain", str(run), str(bag), "--out", str(tmp_path / "explained")]) == 0
    tiles = _rows(tmp_path / "explained" / "s3_tiles.csv")
    scores = np.array([float(t["score"]) for t in tiles])
    assert np.isfinite(scores).all() and np.ptp(scores) > 0


def test_the_verdicts_floors_are_a_constant_risk_and_a_permuted_ranking():
    """With one batch of every case, a constant risk's Cox loss is the mean over events of log |risk set|; the
    chance interval of the C-index holds 0.5 and narrows as cases grow; regression's chance is R^2 <= 0."""
    survival = objective_for(TaskInfo("survival", "bag", 1, (8,)))
    time = torch.tensor([1.0, 2.0, 2.0, 3.0, 5.0, 8.0])
    event = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    at_risk = [6, 5, 3, 1]  # the events at 1, 2, 3 and 8 (Breslow: the case censored at 2 is at risk at 2)
    expected = float(np.mean(np.log(at_risk)))
    assert survival.constant_loss(torch.stack([time, event], 1), batch_size=6) == pytest.approx(expected, rel=1e-6)
    assert survival.constant_loss(torch.stack([time, event], 1), batch_size=2) < expected  # smaller risk sets
    rng = np.random.default_rng(0)
    small, large = (np.stack([rng.exponential(1, n), rng.random(n) < 0.7], 1) for n in (20, 200))
    low_s, high_s = survival.chance_interval(small, 0.95)
    low_l, high_l = survival.chance_interval(large, 0.95)
    assert low_s < 0.5 < high_s and low_l < 0.5 < high_l and high_l - low_l < high_s - low_s
    regression = objective_for(TaskInfo("regression", "bag", 1, (8,), target_mean=[10.0], target_std=[2.0]))
    assert regression.chance_interval(np.zeros((60, 1)), 0.95)[1] == pytest.approx(0.0645, abs=1e-3)
    rng = np.random.default_rng(1)  # the bound holds for predictions unrelated to the targets in 95% of draws
    draws = [pearsonr(rng.normal(size=60), rng.normal(size=60)).statistic ** 2 for _ in range(2000)]
    assert np.mean(np.array(draws) <= 0.0645) == pytest.approx(0.95, abs=0.015)
    outputs, _ = regression.outputs(torch.tensor([[0.0], [1.5]]), torch.zeros(2, 1))
    assert outputs[:, 0].tolist() == [10.0, 13.0]  # standardised logits back in the targets' units


def test_a_checkpoint_with_a_bad_target_scale_is_refused():
    task = {"task_type": "regression", "input_kind": "bag", "num_outputs": 1, "input_shape": [8],
            "target_mean": [1.0], "target_std": [0.0]}
    with pytest.raises(UserError, match="target_std"):
        check_meta({"config": load_config("synthetic_wsi"), "task": task}, "ck")


@pytest.mark.parametrize("task", ["survival", "regression"])
def test_image_tables_build_survival_and_regression_tasks(tmp_path, task):
    """The image and volume kinds read the same columns as bags: [time, event] or the targets, with the training
    targets' statistics recorded for regression and the event spread over the splits for survival."""
    rng = np.random.default_rng(1)
    rows = []
    for i in range(40):
        write_pillow(tmp_path / f"i{i}.png", rng.integers(0, 255, (16, 16), dtype=np.uint8))
        rows.append([f"i{i}.png", f"{rng.exponential(10):.3f}", i % 2])
    write_csv(tmp_path / "cases.csv", ["path", "t", "e"], rows)
    cfg = {"kind": "image_table", "csv": str(tmp_path / "cases.csv"), "task_type": task, "image_size": 16,
           "in_chans": 1, "val_fraction": 0.25, "test_fraction": 0.25}
    cfg.update({"time_column": "t", "event_column": "e"} if task == "survival" else {"label_columns": ["t"]})
    bundle = build_datasets(cfg, seed=0)
    assert bundle.task.task_type == task and bundle.task.num_outputs == 1
    if task == "survival":
        for part in (bundle.train, bundle.val, bundle.test):
            events = [float(r.label[1]) for r in part.records]
            assert 0 < sum(events) < len(events)  # stratified by the event flag
        assert bundle.preprocessing.target_mean == ()
    else:
        train = torch.stack([r.label for r in bundle.train.records]).double()
        assert bundle.preprocessing.target_mean == pytest.approx(tuple(train.mean(0).tolist()))
