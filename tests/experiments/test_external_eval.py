"""External-cohort evaluation: ``medattn eval`` on a table whose rows are all test, the clinical metrics it adds
(operating point, calibration) and per-patient aggregation, each against an independent computation."""

import csv
import json

import numpy as np
import pytest
from PIL import Image
from sklearn.metrics import roc_auc_score

from medattn import clinical_metrics
from medattn.cli import main
from medattn.data import build_datasets
from medattn.errors import UserError


def _cohort(folder, n: int = 40, split_of=lambda i: "train" if i < 20 else "val" if i < 30 else "test",
            patients_of=lambda i: f"p{i}"):
    """PNG files (positives carry a bright square), a labels CSV with a split column and a tiny config."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        image = rng.integers(0, 120, (40, 36), dtype=np.uint8)
        image[5:15, 5:15] += 110 * (i % 2)
        Image.fromarray(image).save(folder / f"{i}.png")
        rows.append([f"{i}.png", i % 2, patients_of(i), split_of(i)])
    with open(folder / "labels.csv", "w", newline="") as f:
        csv.writer(f).writerows([["path", "label", "patient", "split"], *rows])
    (folder / "c.yaml").write_text(
        f"data: {{kind: image_table, csv: {folder / 'labels.csv'}, label_columns: [label], patient_column: patient,"
        " split_column: split, image_size: 32, in_chans: 1}\n"
        "model: {name: vit2d_tiny}\ntrain: {epochs: 2, batch_size: 8, threads: 1}\neval: {bootstrap: 50}\n")
    return folder / "c.yaml"


def test_eval_on_an_all_test_table_gives_the_training_runs_test_auroc(tmp_path):
    config = _cohort(tmp_path / "a")
    run = tmp_path / "run"
    assert main(["train", str(config), "--out", str(run), "--no-progress"]) == 0
    results = json.loads((run / "results.json").read_text())
    # the training run's test rows, as another hospital would send them: every row "test"
    rows = [r for r in csv.DictReader(open(tmp_path / "a/labels.csv")) if r["split"] == "test"]
    external = tmp_path / "b"
    external.mkdir()
    with open(external / "labels.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({**r, "path": str(tmp_path / "a" / r["path"]), "split": "test"} for r in rows)
    data = str(external / "labels.csv")
    assert main(["eval", str(run), str(config), f"data.csv={data}", f"data.data_root={tmp_path / 'a'}",
                 "--out", str(tmp_path / "eval"), "--no-progress"]) == 0
    evaluated = json.loads((tmp_path / "eval/eval.json").read_text())
    assert evaluated["auroc"] == pytest.approx(results["test"]["auroc"], abs=1e-12)
    assert evaluated["n"] == results["test"]["n"] == 10
    assert (evaluated["ci_low"], evaluated["ci_high"]) == pytest.approx((results["test"]["ci_low"],
                                                                        results["test"]["ci_high"]))
    assert (tmp_path / "eval/reliability_test.png").is_file() and evaluated["ece"] is not None
    # the same cohort by fractions: test_fraction 1 with val_fraction 0 makes every row a test row
    assert main(["eval", str(run), str(config), f"data.csv={data}", f"data.data_root={tmp_path / 'a'}",
                 "data.split_column=null", "data.test_fraction=1", "data.val_fraction=0",
                 "--out", str(tmp_path / "eval2"), "--no-progress"]) == 0
    again = json.loads((tmp_path / "eval2/eval.json").read_text())
    assert again["auroc"] == pytest.approx(evaluated["auroc"], abs=1e-12)


def test_training_refuses_an_all_test_table_and_names_eval(tmp_path, capsys):
    config = _cohort(tmp_path / "a", split_of=lambda i: "test")
    assert main(["train", str(config), "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    assert "the train split is empty" in capsys.readouterr().err
    bundle = build_datasets({"kind": "image_table", "csv": str(tmp_path / "a/labels.csv"), "label_columns": "label",
                             "patient_column": "patient", "test_fraction": 1, "val_fraction": 0, "in_chans": 1})
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (0, 0, 40)


def test_per_patient_eval_aggregates_each_patients_images(tmp_path):
    config = _cohort(tmp_path / "a", n=48, split_of=lambda i: "train" if i < 24 else "val" if i < 32 else "test",
                     patients_of=lambda i: f"q{i // 4}" if i >= 32 else f"p{i}")  # 4 test images per patient
    # labels alternate, so every test patient has positive images: make patients q8 and q10 all negative
    labels_csv = tmp_path / "a/labels.csv"
    rows = list(csv.DictReader(open(labels_csv)))
    for r in rows:
        if r["patient"] in ("q8", "q10"):
            r["label"] = "0"
    with open(labels_csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    run = tmp_path / "run"
    assert main(["train", str(config), "--out", str(run), "--no-progress"]) == 0
    assert main(["eval", str(run), str(config), "--per-patient", "max", "--out", str(tmp_path / "eval"),
                 "--no-progress"]) == 0
    evaluated = json.loads((tmp_path / "eval/eval.json").read_text())
    images = list(csv.DictReader(open(tmp_path / "eval/predictions_test.csv")))
    by_patient = {}
    for r in images:
        probability, label = by_patient.get(r["patient"], (0.0, 0))
        by_patient[r["patient"]] = (max(probability, float(r["prob_label"])), max(label, int(r["label_label"])))
    expected = roc_auc_score([v[1] for v in by_patient.values()], [v[0] for v in by_patient.values()])
    assert evaluated["per_patient"]["n"] == len(by_patient) == 4
    assert evaluated["per_patient"]["auroc"] == pytest.approx(expected, abs=1e-6)
    patients = list(csv.DictReader(open(tmp_path / "eval/predictions_test_patients.csv")))
    assert [r["id"] for r in patients] == list(by_patient)


def test_operating_point_counts_and_wilson_intervals():
    probs = np.array([[0.9], [0.8], [0.4], [0.3], [0.7], [0.1]])
    labels = np.array([[1], [1], [1], [0], [0], [0]])
    (point,) = clinical_metrics.operating_point(probs, labels, [0.5], names=["lesion"])
    assert (point["tp"], point["fn"], point["tn"], point["fp"]) == (2, 1, 2, 1)
    assert point["sensitivity"]["value"] == point["specificity"]["value"] == pytest.approx(2 / 3)
    # Wilson score interval for 2 of 3 at 95%, by its formula
    z, p, n = 1.959963984540054, 2 / 3, 3
    centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n
                                                                                        + z * z / (4 * n * n))
    assert (point["sensitivity"]["ci_low"], point["sensitivity"]["ci_high"]) == pytest.approx((centre - half,
                                                                                              centre + half))
    assert clinical_metrics.operating_point(probs, labels, [None]) == []  # no stored threshold: nothing claimed


def test_expected_calibration_error_by_hand():
    probs = np.array([[0.05], [0.15], [0.85], [0.95]])
    labels = np.array([[0], [1], [1], [1]])
    # bins [0, .1): p .05, rate 0; [.1, .2): p .15, rate 1; [.8, .9): p .85, rate 1; [.9, 1]: p .95, rate 1
    expected = (0.05 + 0.85 + 0.15 + 0.05) / 4
    assert clinical_metrics.expected_calibration_error(probs, labels, "binary") == pytest.approx(expected)
    perfect = np.array([[0.0], [1.0]])
    assert clinical_metrics.expected_calibration_error(perfect, np.array([[0], [1]]), "binary") == 0


def test_aggregate_patients_mean_max_and_multiclass_agreement():
    probs = np.array([[0.2], [0.6], [0.9]])
    labels = np.array([[0], [1], [0]])
    order, mean, label = clinical_metrics.aggregate_patients(probs, labels, ["a", "a", "b"], "mean", "binary")
    assert order == ["a", "b"] and mean[:, 0] == pytest.approx([0.4, 0.9]) and label[:, 0].tolist() == [1, 0]
    _, top, _ = clinical_metrics.aggregate_patients(probs, labels, ["a", "a", "b"], "max", "binary")
    assert top[:, 0] == pytest.approx([0.6, 0.9])
    with pytest.raises(UserError, match="different classes"):
        clinical_metrics.aggregate_patients(np.eye(3), np.array([0, 1, 2]), ["a", "a", "b"], "mean", "multiclass")
    with pytest.raises(UserError, match="mean, max"):
        clinical_metrics.aggregate_patients(probs, labels, ["a", "a", "b"], "median", "binary")
