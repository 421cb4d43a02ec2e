"""Competing risks as a task type (issue 51): a table whose event column holds the cause (0 censored, 1..K) through
plan, train, predict, explain and eval; bags where a planted feature raises cause 1's hazard only, small enough for
a minute."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import yaml

from medattn import metrics_competing
from medattn.cli import main
from medattn.data import build_datasets
from medattn.errors import UserError
from writers import write_csv, write_h5

FEATURES = 8


def _cohort(root, n: int = 150, seed: int = 0, events: list | None = None) -> dict:
    """``n`` patients, one bag each: noise tiles, feature 0 of three tiles carrying the marker ``m`` ~ U(0, 2).
    Latent times: cause 1 (``cancer``) Weibull of shape 2 with hazard ratio exp(3 m), time = 10 (E1 exp(1.5 - 3
    m))^(1/2); cause 2 (``other``) Weibull without the marker, time = 12 E2^(1/2); censoring U(0, 30); the first ends
    follow-up (seed 0: 90 of cancer, 38 other, 22 censored; the marker's own cause-specific C-index 0.83 for cancer,
    0.52 for other).
    ``events``: the event cells to write instead (a bad table)."""
    rng = np.random.default_rng(seed)
    (root / "feats").mkdir(parents=True)
    slides, clinical = [], []
    for i in range(n):
        marker = rng.uniform(0, 2)
        tiles = rng.normal(0, 0.3, (6 + i % 5, FEATURES)).astype(np.float32)
        tiles[:3, 0] += marker
        write_h5(root / "feats" / f"s{i}.h5", tiles, rng.integers(0, 5000, (len(tiles), 2)).astype(np.float32))
        slides.append([f"P{i}", f"s{i}.h5"])
        times = [10 * (rng.exponential(1) * np.exp(1.5 - 3 * marker)) ** 0.5, 12 * rng.exponential(1) ** 0.5,
                 rng.uniform(0, 30)]
        first = int(np.argmin(times))
        cause = (first + 1) % 3  # censoring (index 2) -> 0
        clinical.append([f"P{i}", f"{times[first]:.4f}", events[i] if events else cause])
    return {"kind": "wsi_bags", "feature_dir": str(root / "feats"),
            "slide_table": str(write_csv(root / "slides.csv", ["PATIENT", "FILENAME"], slides)),
            "clinical_table": str(write_csv(root / "clinical.csv", ["PATIENT", "os_months", "status"], clinical)),
            "task_type": "competing_risks", "time_column": "os_months", "event_column": "status",
            "cause_names": ["cancer", "other"], "val_fraction": 0.2, "test_fraction": 0.3}


def _config(root, data: dict) -> str:
    config = {"name": "t", "seed": 0, "data": data, "model": {"name": "abmil_small", "attention": None},
              "train": {"epochs": 12, "batch_size": 16, "lr": 3e-3, "threads": 1, "warmup_epochs": 0,
                        "event_balance": True},
              "eval": {"bootstrap": 50, "heatmaps": 1}}
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def _rows(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_a_competing_risks_run_learns_cause_1_and_every_command_serves_it(tmp_path, capsys):
    data = _cohort(tmp_path)
    config = _config(tmp_path, data)
    assert main(["plan", config]) == 0
    planned = capsys.readouterr().out
    assert "(cancer " in planned and ", other " in planned  # events per cause per split
    run = tmp_path / "run"
    assert main(["train", config, "--out", str(run)]) == 0
    printed = capsys.readouterr().out
    results = json.loads((run / "results.json").read_text())
    test = results["test"]
    print("C-indices", {name: (c["c_index"], c["wolbers_c_index"], c["events"]) for name, c in test["causes"].items()})
    assert results["metric"] == "cause_c_index" and results["learning"]["learned"], results["learning"]
    assert test["causes"]["cancer"]["c_index"] > 0.7 and abs(test["causes"]["other"]["c_index"] - 0.5) < 0.15
    assert test["cause_c_index"] == test["causes"]["cancer"]["c_index"] and "cause cancer" in printed
    rows = _rows(run / "predictions_test.csv")
    assert list(rows[0]) == ["id", "patient", "time", "event", "risk_cancer", "risk_other", "risk_group"]
    time, cause = np.array([float(r["time"]) for r in rows]), np.array([int(r["event"]) for r in rows])
    for k, name in enumerate(("cancer", "other"), 1):  # results.json = metrics_competing on the saved predictions
        risk = np.array([float(r[f"risk_{name}"]) for r in rows])
        entry = test["causes"][name]
        cause_specific = metrics_competing.cause_specific_c_index(risk, time, cause, k)
        assert entry["c_index"] == pytest.approx(cause_specific, abs=1e-6)
        wolbers = metrics_competing.competing_c_index(risk, time, cause, k)
        assert entry["wolbers_c_index"] == pytest.approx(wolbers, abs=1e-6)
        assert entry["ci_low"] <= entry["c_index"] <= entry["ci_high"] and entry["events"] == int((cause == k).sum())
    reference = json.loads((run / "survival_reference.json").read_text())
    assert test["risk_groups"]["cut"] == reference["cut"] and "baseline" not in reference  # the training median
    high = np.array([r["risk_group"] == "high" for r in rows])
    assert np.array_equal(high, np.array([float(r["risk_cancer"]) for r in rows]) > reference["cut"])
    assert (run / "cif_test.png").stat().st_size > 10_000
    assert sorted(results["heatmaps"]) == ["heatmaps/highest_1.png", "heatmaps/lowest_1.png"]  # cause 1's risk
    assert "cif_test.png" in (run / "report.html").read_text()
    bags = [tmp_path / "feats" / f"{r['id'].replace('P', 's')}.h5" for r in rows[:4]]
    assert main(["predict", str(run), *map(str, bags), "--out", str(tmp_path / "p.csv")]) == 0
    predicted = _rows(tmp_path / "p.csv")
    assert {"risk_cancer", "risk_other"} <= set(predicted[0])
    np.testing.assert_allclose([float(r["risk_cancer"]) for r in predicted],
                               [float(r["risk_cancer"]) for r in rows[:4]], rtol=1e-4, atol=1e-5)
    assert main(["explain", str(run), *map(str, bags[:2]), "--out", str(tmp_path / "explained")]) == 0
    explained = _rows(tmp_path / "explained" / "summary.csv")
    np.testing.assert_allclose([[float(r[c]) for c in ("risk_cancer", "risk_other")] for r in explained],
                               [[float(r[c]) for c in ("risk_cancer", "risk_other")] for r in predicted[:2]], atol=2e-6)
    assert main(["eval", str(run), config, "--out", str(tmp_path / "eval")]) == 0  # the same test split, its cut
    evaluated = json.loads(next((tmp_path / "eval").rglob("eval.json")).read_text())
    assert evaluated["causes"]["cancer"]["c_index"] == pytest.approx(test["causes"]["cancer"]["c_index"], abs=1e-6)
    assert evaluated["risk_groups"]["cut"] == reference["cut"] and (tmp_path / "eval" / "cif_test.png").is_file()


@pytest.mark.parametrize("cell, why", [("-1", "event -1 is not 0"), ("1.5", "event 1.5 is not 0"),
                                       ("3", r"event 3 is not 0 \(censored\) or a cause 1..2")])
def test_bad_event_values_are_refused_in_one_line_naming_the_file_and_row(tmp_path, cell, why):
    events = [1, 2, 0] * 10
    events[4] = cell
    data = _cohort(tmp_path, n=30, events=events)
    with pytest.raises(UserError, match=f"^clinical.csv row 6: {why}") as error:
        build_datasets(data, seed=0)
    assert "\n" not in str(error.value)


def test_cause_names_need_the_competing_risks_type(tmp_path):
    data = {**_cohort(tmp_path, n=30), "task_type": "survival"}
    with pytest.raises(UserError, match="cause_names names the causes"):
        build_datasets(data, seed=0)


def test_event_values_map_words_to_causes(tmp_path):
    """data.event_values maps a cause column of words (0 censored, 1..K the causes); a cause code that is not an
    integer, and a word left unmapped, are refused naming the competing-risks codes."""
    causes = [1, 2, 0] * 10
    words = [{0: "alive", 1: "cancer", 2: "other"}[c] for c in causes]
    data = {**_cohort(tmp_path / "words", n=30, events=words),
            "event_values": yaml.safe_load("{alive: 0, cancer: 1, other: 2}")}
    bundle = build_datasets(data, seed=0)
    numbers = build_datasets(_cohort(tmp_path / "numbers", n=30, events=causes), seed=0)
    assert [float(bundle.train[i]["label"][1]) for i in range(len(bundle.train))] == \
        [float(numbers.train[i]["label"][1]) for i in range(len(numbers.train))]
    with pytest.raises(UserError, match=r"'other' maps to 1.5; each value must be 0 \(censored\) or a cause 1..K"):
        build_datasets({**data, "event_values": {"alive": 0, "cancer": 1, "other": 1.5}}, seed=0)
    with pytest.raises(UserError, match=r"event 'cancer' in column 'status' is not 0 \(censored\) or a cause 1..K; "
                                        r"map the column's values with data.event_values"):
        build_datasets({**data, "event_values": None}, seed=0)


def test_messages_name_the_competing_risks_type(tmp_path):
    data = {**_cohort(tmp_path, n=30), "label_columns": "status"}
    with pytest.raises(UserError, match="with task_type: competing_risks takes time_column and event_column"):
        build_datasets(data, seed=0)
    data = {**_cohort(tmp_path / "b", n=30), "time_column": None}
    with pytest.raises(UserError, match=r"task_type: competing_risks needs data.time_column .*0 censored / 1..K"):
        build_datasets(data, seed=0)
