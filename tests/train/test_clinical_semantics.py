"""Issue 49, nothing silent on the clinical paths: event columns written yes/no or true/false (mapped by
data.event_values, else refused naming 0/1), tables a survival or regression model cannot learn from (refused before
the first epoch with the reason), survival outputs named a risk and regression outputs in the table's units in
explain, and a run that did not learn marked in what predict and explain write."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import yaml

from medattn.cli import main
from medattn.data import build_datasets
from medattn.errors import UserError
from writers import write_bag_cohort, write_csv

FEATURES = 8


def _bags(root, clinical: list[list], header: list[str], **data) -> dict:
    """One bag of noise per clinical row (patient ``P<i>``) and the wsi_bags data section over them."""
    return {**write_bag_cohort(root, clinical, header, features=FEATURES), "val_fraction": 0.25, "test_fraction": 0.25,
            **data}


def _survival(root, events: list, **data) -> dict:
    times = [f"{1 + 0.7 * i:.1f}" for i in range(len(events))]
    return _bags(root, [[t, e] for t, e in zip(times, events)], ["os_months", "os_event"], task_type="survival",
                 time_column="os_months", event_column="os_event", **data)


def _config(root, data: dict, epochs: int = 2) -> str:
    config = {"name": "t", "seed": 0, "data": data, "model": {"name": "abmil_small", "attention": None},
              "train": {"epochs": epochs, "batch_size": 8, "lr": 3e-3, "threads": 1, "warmup_epochs": 0},
              "eval": {"bootstrap": 0, "heatmaps": 0}}
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("medattn: error: ")
    return err[0]


# --- event columns written as words ---------------------------------------------------------------------------------

@pytest.mark.parametrize("yes, no, mapping", [
    ("yes", "no", "{yes: 1, no: 0}"), ("True", "False", "{true: 1, false: 0}"),
    ("dead", "alive", "{dead: 1, alive: 0}"), ("2", "1", "{2: 1, 1: 0}")])
def test_an_event_column_of_words_is_mapped_by_event_values(tmp_path, yes, no, mapping):
    """data.event_values as a user writes it in YAML (yes/no and true/false read as bools by YAML 1.1)."""
    events = [yes if i % 3 == 0 else no for i in range(24)]
    data = _survival(tmp_path, events, event_values=yaml.safe_load(mapping))
    bundle = build_datasets(data, seed=0)
    labels = {r.id: int(r.label[1]) for split in (bundle.train, bundle.val, bundle.test) for r in split.records}
    assert labels == {f"P{i}": int(i % 3 == 0) for i in range(24)}


@pytest.mark.parametrize("yes, no, hint", [("yes", "no", "{yes: 1, no: 0}"), ("TRUE", "FALSE", "{true: 1, false: 0}"),
                                           ("dead", "alive", "{yes: 1, no: 0}")])
def test_an_event_column_of_words_without_a_mapping_is_refused_naming_0_1(tmp_path, yes, no, hint):
    data = _survival(tmp_path, [yes if i % 3 == 0 else no for i in range(24)])
    with pytest.raises(UserError) as error:
        build_datasets(data, seed=0)
    assert f"event '{yes}' in column 'os_event' is not 1 (event observed) or 0 (censored); map the column's values " \
           f"with data.event_values, e.g. {hint}" in str(error.value)


def test_an_image_table_maps_its_event_column_too(tmp_path):
    from writers import write_pillow

    rng = np.random.default_rng(1)
    rows = []
    for i in range(24):
        write_pillow(tmp_path / f"i{i}.png", rng.integers(0, 255, (16, 16), dtype=np.uint8))
        rows.append([f"i{i}.png", f"{1 + i:.1f}", "Yes" if i % 2 else "No"])
    write_csv(tmp_path / "cases.csv", ["path", "t", "e"], rows)
    cfg = {"kind": "image_table", "csv": str(tmp_path / "cases.csv"), "task_type": "survival", "time_column": "t",
           "event_column": "e", "image_size": 16, "in_chans": 1, "val_fraction": 0.25, "test_fraction": 0.25}
    with pytest.raises(UserError, match=r"event 'No' in column 'e' is not 1 \(event observed\) or 0 \(censored\); "
                                        r"map the column's values with data.event_values, e.g. \{yes: 1, no: 0\}"):
        build_datasets(cfg, seed=0)
    bundle = build_datasets({**cfg, "event_values": yaml.safe_load("{yes: 1, no: 0}")}, seed=0)
    labels = {r.id: int(r.label[1]) for split in (bundle.train, bundle.val, bundle.test) for r in split.records}
    assert labels == {f"i{i}.png": i % 2 for i in range(24)}


def test_event_values_are_checked(tmp_path):
    data = _survival(tmp_path, ["dead", "alive", "unknown"] * 8, event_values={"dead": 1, "alive": 0})
    with pytest.raises(UserError, match=r"event 'unknown' in column 'os_event' is not 1 .* \(data.event_values maps "
                                        r"alive, dead\)"):
        build_datasets(data, seed=0)
    with pytest.raises(UserError, match="each value must be 1 .event observed. or 0"):
        build_datasets({**data, "event_values": {"dead": 2, "alive": 0}}, seed=0)
    with pytest.raises(UserError, match="event_values describe a survival task"):
        build_datasets({**data, "task_type": "regression", "time_column": None, "event_column": None,
                        "label_columns": ["os_months"]}, seed=0)


# --- tables that cannot train -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("events, reason", [
    ([0] * 24, "no event: all 18 training and validation cases are censored (event 0)"),
    ([1] + [0] * 23, "only 1 event among 18 training and validation cases"),
])
def test_a_survival_table_that_cannot_train_is_refused_before_the_first_epoch(tmp_path, capsys, events, reason):
    config = _config(tmp_path, _survival(tmp_path, events))
    line = _error(capsys, ["train", config, "--out", str(tmp_path / "run"), "--no-progress"])
    assert line == f"medattn: error: this table cannot train a survival model: {reason}" + line.split(reason)[1]
    assert not (tmp_path / "run" / "metrics.csv").exists()  # no epoch ran


def test_a_constant_regression_target_is_refused_before_the_first_epoch(tmp_path, capsys):
    data = _bags(tmp_path, [["4.2"] for _ in range(24)], ["psa"], task_type="regression", label_columns=["psa"])
    line = _error(capsys, ["train", _config(tmp_path, data), "--out", str(tmp_path / "run"), "--no-progress"])
    assert line == ("medattn: error: this table cannot train a regression model: target 'psa' is constant in the "
                    "training split (all 12 cases are 4.2): nothing to learn")
    assert not (tmp_path / "run" / "metrics.csv").exists()


def test_a_target_beyond_float32_is_a_bad_row_not_a_diverged_run(tmp_path, capsys):
    data = _bags(tmp_path, [[f"{v:g}"] for v in [1e39] + list(range(23))], ["psa"], task_type="regression",
                 label_columns=["psa"])
    line = _error(capsys, ["train", _config(tmp_path, data), "--out", str(tmp_path / "run"), "--no-progress"])
    assert "clinical.csv row 2: value 1e+39 is too large for float32 (largest 3.4e+38): rescale the column" in line
    assert "lower train.lr" not in line and not (tmp_path / "run" / "metrics.csv").exists()


def _rows(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# --- task semantics and the verdict in what predict and explain write -------------------------------------------------

@pytest.fixture(scope="module")
def noise_runs(tmp_path_factory):
    """A survival and a regression run on bags of noise (labels unrelated to the features): neither learns."""
    root = tmp_path_factory.mktemp("noise")
    rng = np.random.default_rng(1)
    runs = {}
    for task in ("survival", "regression"):
        folder = root / task
        folder.mkdir()
        if task == "survival":
            data = _bags(folder, [[f"{rng.uniform(1, 40):.2f}", int(rng.random() < 0.7)] for _ in range(40)],
                         ["os_months", "os_event"], task_type="survival", time_column="os_months",
                         event_column="os_event")
        else:
            data = _bags(folder, [[f"{rng.normal(10, 2):.3f}"] for _ in range(40)], ["psa"], task_type="regression",
                         label_columns=["psa"])
        assert main(["train", _config(folder, data, epochs=2), "--out", str(folder / "run"), "--no-progress"]) == 0
        runs[task] = folder
    return runs


def _titles(monkeypatch) -> list[str]:
    from medattn.explain import outputs

    titles, draw = [], outputs.slide_map_figure
    monkeypatch.setattr(outputs, "slide_map_figure", lambda picture, scores, title, *a, **k: titles.append(title)
                        or draw(picture, scores, title, *a, **k))
    return titles


def test_survival_outputs_are_a_risk_in_explain(noise_runs, tmp_path, capsys, monkeypatch):
    from medattn.slides.heatmap import prediction_text

    assert prediction_text([-0.02], ["0"], "survival") == \
        "slide risk = -0.02 (log relative risk, higher = earlier event)"
    titles = _titles(monkeypatch)
    bags = [str(noise_runs["survival"] / "feats" / f"s{i}.h5") for i in range(2)]
    assert main(["explain", str(noise_runs["survival"] / "run"), *bags, "--out", str(tmp_path / "x")]) == 0
    rows = _rows(tmp_path / "x" / "summary.csv")
    assert "risk" in rows[0] and not any(c.startswith("prob_") for c in rows[0])
    assert len(titles) == 2 and all("slide risk = " in t and "P(" not in t for t in titles)


def test_regression_outputs_are_in_the_tables_units_in_explain(noise_runs, tmp_path, capsys, monkeypatch):
    from medattn.slides.heatmap import prediction_text

    assert prediction_text([12.34], ["psa"], "regression") == "slide predicted psa = 12.34"
    titles = _titles(monkeypatch)
    bags = [str(noise_runs["regression"] / "feats" / f"s{i}.h5") for i in range(2)]
    assert main(["explain", str(noise_runs["regression"] / "run"), *bags, "--out", str(tmp_path / "x")]) == 0
    rows = _rows(tmp_path / "x" / "summary.csv")
    assert not any(c.startswith("prob_") for c in rows[0]) and 5 < float(rows[0]["pred_psa"]) < 15  # mean ~10
    assert main(["predict", str(noise_runs["regression"] / "run"), *bags, "--out", str(tmp_path / "p.csv")]) == 0
    assert float(_rows(tmp_path / "p.csv")[0]["pred_psa"]) == pytest.approx(float(rows[0]["pred_psa"]), abs=1e-5)
    assert all("slide predicted psa = " in t and "P(" not in t for t in titles)


def test_a_run_that_did_not_learn_says_so_in_predict_and_explain(noise_runs, tmp_path, capsys):
    import json

    run = noise_runs["survival"] / "run"
    learning = json.loads((run / "results.json").read_text())["learning"]
    assert learning["learned"] is False, learning
    column = "DID NOT LEARN: " + "; ".join(learning["reasons"])
    bags = [str(noise_runs["survival"] / "feats" / f"s{i}.h5") for i in range(2)]
    capsys.readouterr()
    assert main(["predict", str(run), *bags, "--out", str(tmp_path / "p.csv")]) == 0
    assert "WARNING: this model's training run did not learn (" in capsys.readouterr().out
    assert [r["run_verdict"] for r in _rows(tmp_path / "p.csv")] == [column] * 2
    assert main(["explain", str(run), *bags, "--out", str(tmp_path / "x")]) == 0
    assert "WARNING: this model's training run did not learn (" in capsys.readouterr().out
    assert [r["run_verdict"] for r in _rows(tmp_path / "x" / "summary.csv")] == [column] * 2
    assert main(["export", str(run), "--format", "onnx", "--out", str(tmp_path / "m.onnx")]) == 0
    assert main(["predict", str(tmp_path / "m.onnx"), *bags, "--out", str(tmp_path / "o.csv")]) == 0
    assert "did not learn" in capsys.readouterr().out
    assert [r["run_verdict"] for r in _rows(tmp_path / "o.csv")] == [column] * 2
