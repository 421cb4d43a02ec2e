"""The ordinal task type (ordered grades): the cumulative-link head and its loss, a tiny model that learns a planted
grade, and train -> predict -> eval (and export) on a bag table and an image table."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
import yaml

from medattn.cli import main
from medattn.data.base import TaskInfo
from medattn.errors import UserError
from medattn.metrics_ordinal import cumulative, quadratic_weighted_kappa
from medattn.train.objectives import objective_for
from medattn.vocabulary.task_types import task_type
from writers import write_csv, write_h5, write_pillow

FEATURES = 8
GRADES = ["G1", "G2", "G3"]


def _objective(k: int = 4):
    return objective_for(TaskInfo("ordinal", "bag", k, (FEATURES,), GRADES[:k] if k <= 3 else []))


def _rows(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_the_loss_is_the_sum_of_the_cumulative_binary_cross_entropies_and_passes_gradcheck():
    torch.manual_seed(0)
    objective = _objective(4)
    logits = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 1, 2, 3, 1, 2])
    assert torch.autograd.gradcheck(lambda x: objective.loss(x, labels), (logits,))
    assert torch.autograd.gradcheck(lambda x: objective.loss(x, labels, per_sample=True), (logits,))
    cumulative_logits = task_type("ordinal").cumulative_logits(logits)
    targets = (labels[:, None] > torch.arange(3)).double()
    by_hand = -(targets * torch.log(cumulative_logits.sigmoid()) + (1 - targets) * torch.log(
        1 - cumulative_logits.sigmoid())).sum(1).mean()
    assert float(objective.loss(logits, labels).detach()) == pytest.approx(float(by_hand.detach()), rel=1e-10)


def test_class_probabilities_are_a_rank_consistent_distribution():
    kind = task_type("ordinal")
    logits = torch.cat([torch.randn(200, 5) * 4, torch.randn(20, 5) * 40])  # large logits too
    probs = kind.activate(logits)
    assert probs.shape == logits.shape and bool((probs >= 0).all())
    torch.testing.assert_close(probs.sum(1), torch.ones(len(probs)))
    above = kind.cumulative_logits(logits).sigmoid()
    assert bool((above[:, 1:] <= above[:, :-1]).all())  # P(y > k) falls in k for every input
    np.testing.assert_allclose(cumulative(probs.double().numpy()), above.double().numpy(), atol=1e-6)


def test_the_constant_predictor_is_the_grade_prior():
    labels = torch.tensor([0] * 5 + [1] * 3 + [2] * 2)
    above = np.array([0.5, 0.2])  # P(y > 0), P(y > 1) of the labels
    entropy = float(-(above * np.log(above) + (1 - above) * np.log(1 - above)).sum())
    assert _objective(3).constant_loss(labels) == pytest.approx(entropy, abs=1e-6)


def test_options_of_other_types_are_refused():
    task = TaskInfo("ordinal", "bag", 3, (FEATURES,), GRADES)
    for options in ({"loss": "cox"}, {"label_smoothing": 0.1}, {"pos_weight": torch.ones(3)}):
        with pytest.raises(UserError, match="do not apply to a ordinal task"):
            objective_for(task, **options)


def test_a_tiny_model_learns_a_planted_ordinal_signal(record_property):
    """Grades 0..4 cut from a linear score of 6 features plus noise; a linear head trained on the ordinal loss reaches
    a held-out kappa well above chance (0; a permuted predictor's 95% interval here is about +-0.09)."""
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    x = rng.normal(size=(1200, 6))
    score = x @ np.array([1.0, -0.8, 0.6, 0.0, 0.0, 0.3]) + rng.normal(0, 0.4, 1200)
    y = np.digitize(score, np.quantile(score, [0.2, 0.4, 0.6, 0.8]))
    x_t, y_t = torch.tensor(x, dtype=torch.float32), torch.tensor(y)
    head, objective = torch.nn.Linear(6, 5), _objective(5)
    optimizer = torch.optim.Adam(head.parameters(), lr=0.05)
    for _ in range(300):
        optimizer.zero_grad()
        objective.loss(head(x_t[:800]), y_t[:800]).backward()
        optimizer.step()
    with torch.no_grad():
        probs = task_type("ordinal").activate(head(x_t[800:])).numpy()
    kappa = quadratic_weighted_kappa(y[800:], probs.argmax(1), 5)
    record_property("qwk", kappa)
    print(f"held-out QWK {kappa:.4f}")
    assert kappa > 0.8
    chance = objective.chance_interval(y[800:], 0.95)
    assert chance[0] < 0 < chance[1] < 0.2


def _bags(root, n: int = 90, seed: int = 0) -> dict:
    """``n`` patients, one bag each: noise tiles, feature 0 of three tiles carrying the marker m ~ U(0, 3); the grade
    is m + noise cut at 1 and 2, named G1, G2, G3."""
    rng = np.random.default_rng(seed)
    (root / "feats").mkdir(parents=True)
    slides, clinical = [], []
    for i in range(n):
        marker = rng.uniform(0, 3)
        tiles = rng.normal(0, 0.3, (6 + i % 5, FEATURES)).astype(np.float32)
        tiles[:3, 0] += marker
        write_h5(root / "feats" / f"s{i}.h5", tiles, rng.integers(0, 5000, (len(tiles), 2)).astype(np.float32))
        slides.append([f"P{i}", f"s{i}.h5"])
        clinical.append([f"P{i}", GRADES[int(np.digitize(marker + rng.normal(0, 0.2), [1, 2]))]])
    return {"kind": "wsi_bags", "feature_dir": str(root / "feats"),
            "slide_table": str(write_csv(root / "slides.csv", ["PATIENT", "FILENAME"], slides)),
            "clinical_table": str(write_csv(root / "clinical.csv", ["PATIENT", "grade"], clinical)),
            "task_type": "ordinal", "label_columns": ["grade"], "classes": GRADES, "val_fraction": 0.2,
            "test_fraction": 0.3}


def _config(root, data: dict, model: dict, epochs: int = 12) -> str:
    config = {"name": "t", "seed": 0, "data": data, "model": model,
              "train": {"epochs": epochs, "batch_size": 16, "lr": 3e-3, "threads": 1, "warmup_epochs": 0},
              "eval": {"bootstrap": 50, "heatmaps": 0}}
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def _check_predictions(path, names=GRADES) -> list[dict]:
    rows = _rows(path)
    probs = np.array([[float(r[f"prob_{n}"]) for n in names] for r in rows])
    assert (probs >= 0).all() and np.allclose(probs.sum(1), 1, atol=1e-5)
    assert [r["pred_label"] for r in rows] == [names[k] for k in probs.argmax(1)]
    np.testing.assert_allclose([float(r["expected_grade"]) for r in rows], probs @ np.arange(len(names)), atol=1e-5)
    return rows


def test_a_bag_table_trains_predicts_evaluates_and_exports_an_ordinal_model(tmp_path, capsys):
    config = _config(tmp_path, _bags(tmp_path, n=120), {"name": "abmil_small", "attention": None}, epochs=20)
    run = tmp_path / "run"
    assert main(["train", config, "--out", str(run)]) == 0
    printed = capsys.readouterr().out
    results = json.loads((run / "results.json").read_text())
    assert results["metric"] == "qwk" and results["learning"]["learned"], results["learning"]
    test = results["test"]
    assert test["qwk"] > 0.5 and "test QWK" in printed and "AUROC y > k" in printed, printed
    assert set(test["metrics"]) == {"qwk", "mae", "mae_expected", "auroc_gt_0", "auroc_gt_1"}
    assert np.array(test["confusion"]).sum() == test["n"]
    rows = _check_predictions(run / "predictions_test.csv")
    assert quadratic_weighted_kappa([int(r["label"]) for r in rows], [GRADES.index(r["pred_label"]) for r in rows],
                                    3) == pytest.approx(test["qwk"], abs=1e-12)
    assert (run / "confusion_test.png").stat().st_size > 5_000
    assert "confusion_test.png" in (run / "report.html").read_text() and "Confusion counts" in \
        (run / "report.html").read_text()
    assert main(["eval", str(run), config, "--out", str(tmp_path / "eval")]) == 0  # the same test split
    evaluated = json.loads(next((tmp_path / "eval").rglob("eval.json")).read_text())
    assert evaluated["qwk"] == pytest.approx(test["qwk"], abs=1e-6)
    bags = [tmp_path / "feats" / f"{r['id'].replace('P', 's')}.h5" for r in rows[:5]]
    assert main(["predict", str(run), *map(str, bags), "--out", str(tmp_path / "p.csv")]) == 0
    predicted = _check_predictions(tmp_path / "p.csv")
    assert list(predicted[0])[:7] == ["file", "prob_G1", "prob_G2", "prob_G3", "pred_label", "expected_grade",
                                      "model_id"]
    np.testing.assert_allclose([float(r["prob_G3"]) for r in predicted], [float(r["prob_G3"]) for r in rows[:5]],
                               atol=1e-4)
    (run / "exported").mkdir()
    assert main(["export", str(run), "--format", "onnx", "--out", str(run / "exported" / "model.onnx")]) == 0


def test_an_image_table_trains_predicts_and_evaluates_an_ordinal_model(tmp_path):
    """40 images whose brightness rises with the grade (integers 0..2 in the table: no class names)."""
    rng = np.random.default_rng(1)
    rows = []
    for i in range(60):
        grade = i % 3
        image = rng.integers(0, 60, (16, 16)).astype(np.uint8) + np.uint8(70 * grade)
        write_pillow(tmp_path / f"i{i}.png", image)
        rows.append([f"i{i}.png", grade])
    data = {"kind": "image_table", "csv": str(write_csv(tmp_path / "cases.csv", ["path", "grade"], rows)),
            "task_type": "ordinal", "label_columns": ["grade"], "image_size": 16, "in_chans": 1,
            "val_fraction": 0.25, "test_fraction": 0.25}
    config = _config(tmp_path, data, {"name": "vit2d_tiny"}, epochs=4)
    run = tmp_path / "run"
    assert main(["train", config, "--out", str(run)]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["metric"] == "qwk" and results["test"]["n"] == 15
    _check_predictions(run / "predictions_test.csv", ["0", "1", "2"])
    assert main(["eval", str(run), config, "--out", str(tmp_path / "eval")]) == 0
    assert main(["predict", str(run), str(tmp_path / "i0.png"), str(tmp_path / "i1.png"),
                 "--out", str(tmp_path / "p.csv")]) == 0
    assert [r["file"].rsplit("/", 1)[-1] for r in _check_predictions(tmp_path / "p.csv", ["0", "1", "2"])] == \
        ["i0.png", "i1.png"]


def test_compare_cv_and_explain_serve_an_ordinal_task(tmp_path, capsys):
    """compare: the kappa per seed; cv: a kappa per fold, named QWK; explain: the class probabilities of a bag and its
    tiles' scores."""
    config = _config(tmp_path, _bags(tmp_path, n=60), {"name": "abmil_small", "attention": None})
    out = tmp_path / "compare"
    assert main(["compare", config, "--models", "abmil_small", "transmil_tiny", "--seeds", "0", "1",
                 "--out", str(out), "model.attention=null", "train.epochs=4"]) == 0
    summary = json.loads((out / "compare.json").read_text())
    assert summary["metric"] == "qwk" and "QWK" in capsys.readouterr().out
    assert all(-1 <= v <= 1 for arm in summary["arms"] for v in arm["per_seed"] if v is not None)
    assert main(["cv", config, "--folds", "2", "--out", str(tmp_path / "cv"), "train.epochs=3",
                 "data.test_fraction=null", "data.val_fraction=0.2"]) == 0
    folds = json.loads((tmp_path / "cv" / "cv.json").read_text())
    assert folds["metric"] == "qwk" and folds["rows"][0]["structure"] == "QWK"
    run = next(out.glob("abmil_small/seed_0"))
    assert main(["explain", str(run), str(tmp_path / "feats" / "s3.h5"), "--out", str(tmp_path / "explained")]) == 0
    scores = np.array([float(t["score"]) for t in _rows(tmp_path / "explained" / "s3_tiles.csv")])
    assert np.isfinite(scores).all() and np.ptp(scores) > 0


def test_a_volume_table_trains_and_predicts_an_ordinal_model(tmp_path):
    """24 NIfTI volumes whose intensity rises with the grade, named low, mid, high in the table."""
    from writers import write_nifti

    rng = np.random.default_rng(2)
    names, rows = ["low", "mid", "high"], []
    for i in range(24):
        write_nifti(tmp_path / f"v{i}.nii.gz", rng.normal(100 + 40 * (i % 3), 10, (8, 8, 4)))
        rows.append([f"v{i}.nii.gz", names[i % 3]])
    data = {"kind": "volume_table", "csv": str(write_csv(tmp_path / "v.csv", ["path", "grade"], rows)),
            "task_type": "ordinal", "label_columns": ["grade"], "classes": names, "target_size": [8, 8, 4],
            "val_fraction": 0.25, "test_fraction": 0.25}
    config = _config(tmp_path, data, {"name": "resnet3d_tiny", "attention": None}, epochs=2)
    run = tmp_path / "run"
    assert main(["train", config, "--out", str(run)]) == 0
    assert json.loads((run / "results.json").read_text())["metric"] == "qwk"
    _check_predictions(run / "predictions_test.csv", names)
    assert main(["predict", str(run), str(tmp_path / "v0.nii.gz"), "--out", str(tmp_path / "p.csv")]) == 0
    assert list(_check_predictions(tmp_path / "p.csv", names)[0])[1:6] == ["prob_low", "prob_mid", "prob_high",
                                                                           "pred_label", "expected_grade"]


def test_compare_draws_each_metrics_chance_from_its_task_type(tmp_path):
    from medattn.experiments.compare import plot_arms
    from medattn.outputs import OutputFolder

    def lines(metric: str) -> list[float]:
        summary = {"metric": metric, "data": "d", "seeds": [0], "synthetic": False,
                   "arms": [{"arm": "a", "per_seed": [0.4], "mean": 0.4, "status": "learned"}]}
        axis = plot_arms(summary, OutputFolder(tmp_path, overwrite=True), f"{metric}.png")
        return [line.get_ydata()[0] for line in axis.get_lines() if line.get_linestyle() == ":"]

    assert lines("qwk") == [0.0] and lines("auroc") == [0.5] and lines("dice") == []
