"""Case heatmaps of survival and regression runs on report.html (issue 51): the test cases of highest and lowest
predicted risk (or value), each map saying what each tile adds to the prediction, titled with the risk and the
patient's observed time and event (or the predicted and true value of the named column); on the slide thumbnails
where ``--slides`` is given."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import yaml

from medattn.cli import main
from writers import write_csv, write_h5

FEATURES, PLANTED = 8, 3


def _cohort(root, task: str, n: int = 100, seed: int = 0) -> dict:
    """``n`` patients, one bag of 8 tiles each: noise, and feature 0 of the first :data:`PLANTED` tiles (at y = 0;
    the others at y = 2048) carries the patient's marker ``m`` ~ U(0, 2). Survival: hazard ratio exp(3 m), about
    10% censored; regression: ``psa`` = 10 + 5 m + noise."""
    rng = np.random.default_rng(seed)
    (root / "feats").mkdir(parents=True)
    slides, clinical = [], []
    for i in range(n):
        marker = rng.uniform(0, 2)
        tiles = rng.normal(0, 0.3, (8, FEATURES)).astype(np.float32)
        tiles[:PLANTED, 0] += marker
        coords = np.array([[256 * k, 0 if k < PLANTED else 2048] for k in range(8)], dtype=np.float32)
        write_h5(root / "feats" / f"s{i}.h5", tiles, coords)
        slides.append([f"P{i}", f"s{i}.h5"])
        if task == "survival":
            event_time, censor_time = 10 * (rng.exponential(1) * np.exp(-3 * marker)) ** 0.5, rng.uniform(0, 30)
            clinical.append([f"P{i}", f"{min(event_time, censor_time):.4f}", int(event_time <= censor_time)])
        else:
            clinical.append([f"P{i}", f"{10 + 5 * marker + rng.normal(0, 0.5):.4f}"])
    header = ["PATIENT", "os_months", "os_event"] if task == "survival" else ["PATIENT", "psa"]
    data = {"kind": "wsi_bags", "feature_dir": str(root / "feats"),
            "slide_table": str(write_csv(root / "slides.csv", ["PATIENT", "FILENAME"], slides)),
            "clinical_table": str(write_csv(root / "clinical.csv", header, clinical)), "task_type": task,
            "val_fraction": 0.2, "test_fraction": 0.3}
    data.update({"time_column": "os_months", "event_column": "os_event"} if task == "survival"
                else {"label_columns": ["psa"]})
    return data


def _train(root, task: str, monkeypatch) -> tuple[dict, list[tuple[str, np.ndarray, np.ndarray]]]:
    """Train a tiny attention-MIL on :func:`_cohort` drawing 2 cases of each end; -> (results.json, each drawn
    map's (title, tile coordinates, relevance per tile))."""
    from medattn.explain import cases

    drawn, tiles = [], cases.CasePictures.tiles

    def recorded(self, coords, relevance):
        drawn.append((self.title, np.asarray(coords), np.asarray(relevance)))
        return tiles(self, coords, relevance)

    monkeypatch.setattr(cases.CasePictures, "tiles", recorded)
    config = {"name": "t", "seed": 0, "data": _cohort(root, task), "model": {"name": "abmil_small", "attention": None},
              "train": {"epochs": 20, "batch_size": 16, "lr": 5e-3, "threads": 1, "warmup_epochs": 0},
              "eval": {"bootstrap": 0, "heatmaps": 2}}
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["train", str(root / "config.yaml"), "--out", str(root / "run"), "--no-progress"]) == 0
    return json.loads((root / "run" / "results.json").read_text()), drawn


def _predictions(run, column: str) -> dict[str, float]:
    with open(run / "predictions_test.csv", newline="") as f:
        return {row["id"]: float(row[column]) for row in csv.DictReader(f)}


def _planted_share(coords: np.ndarray, relevance: np.ndarray) -> tuple[float, float]:
    """(mean relevance of the planted tiles, of the others)."""
    planted = coords[:, 1] == 0
    return float(relevance[planted].mean()), float(relevance[~planted].mean())


def test_a_survival_run_draws_its_highest_and_lowest_risks_and_what_raises_them(tmp_path, monkeypatch):
    from pictures import colour_bar_span

    results, drawn = _train(tmp_path, "survival", monkeypatch)
    run = tmp_path / "run"
    assert results["test"]["c_index"] > 0.7
    assert results["heatmaps"] == ["heatmaps/highest_1.png", "heatmaps/highest_2.png", "heatmaps/lowest_1.png",
                                   "heatmaps/lowest_2.png"]
    assert not [w for w in results["warnings"] if "heatmaps" in w or "report.html" in w]
    page = (run / "report.html").read_text()
    assert all(f"<small>({name})</small>" in page for name in results["heatmaps"])
    assert "Test case of the highest prediction, number 1 (a risk: log relative risk" in page
    risks = _predictions(run, "risk")
    ranked = sorted(risks, key=risks.get)
    titles = [title for title, _, _ in drawn]
    for title, case in zip(titles, [ranked[-1], ranked[-2], ranked[0], ranked[1]]):
        assert f"test case {case}: risk = {risks[case]:.2f} (log relative risk, higher = earlier event), observed " \
               f"os_months (months) = " in title and title.endswith(("event", "censored")), title
    assert titles[0].startswith("abmil_small | gradxinput | highest test case")
    _, coords, relevance = drawn[0]  # the highest risk: its planted tiles raise it, the noise does not
    planted, others = _planted_share(coords, relevance)
    assert planted > 0 and planted > 5 * abs(others), (planted, others)
    assert relevance.min() < 0 < relevance.max()  # signed: red raises the risk, blue lowers it
    assert colour_bar_span(run / "heatmaps/highest_1.png", "RdBu_r") > 0.8


def test_a_regression_run_draws_its_highest_and_lowest_predicted_values(tmp_path, monkeypatch):
    results, drawn = _train(tmp_path, "regression", monkeypatch)
    run = tmp_path / "run"
    assert results["test"]["r2"] > 0.5
    assert results["heatmaps"] == ["heatmaps/highest_1.png", "heatmaps/highest_2.png", "heatmaps/lowest_1.png",
                                   "heatmaps/lowest_2.png"]
    values = _predictions(run, "pred_psa")
    ranked = sorted(values, key=values.get)
    for (title, _, _), case in zip(drawn, [ranked[-1], ranked[-2], ranked[0], ranked[1]]):
        assert f"test case {case}: predicted psa = {values[case]:.4g} (true " in title and \
               "; column psa, in its unit)" in title, title
    planted, others = _planted_share(*drawn[0][1:])
    assert planted > 0 and planted > 5 * abs(others), (planted, others)


def test_a_survival_bag_run_given_its_slides_draws_its_risks_on_the_slide_thumbnails(tmp_path):
    """As a classification run does (tests/experiments/test_report_page.py): the tumour slides' patients die
    earlier."""
    pytest.importorskip("openslide")
    pytest.importorskip("tifffile")
    from medattn.generators.slides import write_synthetic_cohort
    from pictures import glass_fraction

    slides, features = tmp_path / "slides", tmp_path / "features"
    write_synthetic_cohort(slides, count=8, seed=3, shape=(384, 512))
    assert main(["wsi", "extract", str(slides), "--out", str(features), "--extractor", "descriptor", "--skip-bad",
                 "--patch-um", "64", "--patch-px", "32", "--thumbnail-px", "256", "--no-progress"]) == 0
    with open(slides / "clinical_table.csv", newline="") as f:
        rows = [[r["PATIENT"], 5 + 20 * (1 - int(r["TUMOUR"])) + i, int(i % 3 != 2)]
                for i, r in enumerate(csv.DictReader(f))]
    clinical = write_csv(tmp_path / "survival.csv", ["PATIENT", "os_months", "os_event"], rows)
    run = tmp_path / "run"
    assert main(["train", "synthetic_slides", f"data.feature_dir={features}",
                 f"data.slide_table={slides}/slide_table.csv", f"data.clinical_table={clinical}",
                 "data.label_columns=null", "data.task_type=survival", "data.time_column=os_months",
                 "data.event_column=os_event", "train.epochs=1", "train.batch_size=4", "train.threads=1",
                 "eval.bootstrap=0", "eval.heatmaps=1", "--slides", str(slides), "--out", str(run),
                 "--no-progress"]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["heatmaps"] == ["heatmaps/highest_1.png", "heatmaps/lowest_1.png"]
    assert all(glass_fraction(run / name) > 0.1 for name in results["heatmaps"])  # the slide's glass around its tissue
    assert not [w for w in results["warnings"] if "report.html" in w or "heatmaps" in w]


@pytest.mark.parametrize("task", ["survival", "regression"])
def test_an_image_table_run_draws_its_highest_and_lowest_cases_beside_their_maps(tmp_path, task):
    """Images too: each case beside its map (a CNN's gradient x input of the risk or value)."""
    from writers import write_pillow

    rng = np.random.default_rng(1)
    rows = []
    for i in range(40):
        write_pillow(tmp_path / f"i{i}.png", rng.integers(0, 255, (32, 32), dtype=np.uint8))
        rows.append([f"i{i}.png", f"{rng.exponential(10):.3f}", i % 2])
    write_csv(tmp_path / "cases.csv", ["path", "t", "e"], rows)
    data = {"kind": "image_table", "csv": str(tmp_path / "cases.csv"), "task_type": task, "image_size": 32,
            "in_chans": 1, "val_fraction": 0.25, "test_fraction": 0.25}
    data.update({"time_column": "t", "event_column": "e"} if task == "survival" else {"label_columns": ["t"]})
    config = {"name": "t", "seed": 0, "data": data, "model": {"name": "resnet2d_tiny", "attention": None},
              "train": {"epochs": 1, "batch_size": 8, "threads": 1}, "eval": {"bootstrap": 0, "heatmaps": 1}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    run = tmp_path / "run"
    assert main(["train", str(tmp_path / "config.yaml"), "--out", str(run), "--no-progress"]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["heatmaps"] == ["heatmaps/highest_1.png", "heatmaps/lowest_1.png"]
    assert not [w for w in results["warnings"] if "heatmaps" in w]
