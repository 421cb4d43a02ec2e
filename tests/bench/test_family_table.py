"""The realistic family's comparisons with the independent model (benchmarks/family_table.py, split_luck.py): the
paired bootstrap of an arm against the independent model pairs cases by patient, and the re-splits refit the model
on partitions of the same patients."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def scripts(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import family_table
    import split_luck

    return family_table, split_luck


def _write_run(folder: Path, patients: list[str], labels: np.ndarray, probabilities: np.ndarray) -> None:
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"metric": "auroc", "test": {"auroc": 0.0}}))
    rows = ["id,patient,label_label,prob_label"] + [f"{p},{p},{y},{q:.6f}" for p, y, q in
                                                     zip(patients, labels, probabilities)]
    (folder / "predictions_test.csv").write_text("\n".join(rows) + "\n")


def test_an_arm_is_paired_with_the_independent_model_patient_by_patient(scripts, tmp_path):
    family_table, _ = scripts
    rng = np.random.default_rng(0)
    patients = [f"p{i:02d}" for i in range(40)]
    labels = np.arange(40) % 2
    independent = rng.random(40) * 0.6 + 0.4 * labels  # the independent model, in the task's test order
    expected = []
    for seed in range(2):
        arm = rng.random(40) * 0.3 + 0.7 * labels
        order = rng.permutation(40)  # each run writes its cases in an order of its own
        _write_run(tmp_path / "cmp" / "vitwsi_small" / f"seed_{seed}", [patients[i] for i in order], labels[order],
                   arm[order])
        expected.append(roc_auc_score(labels, arm) - roc_auc_score(labels, independent))
    found = family_table.against_independent(tmp_path / "cmp", independent.tolist(), patients, n_boot=100)
    test = found["vitwsi_small"]
    assert test["seeds"] == 2 and test["difference"] == pytest.approx(np.mean(expected))
    assert test["ci_low"] <= test["difference"] <= test["ci_high"]
    same = tmp_path / "same"
    _write_run(same / "abmil_small" / "seed_0", patients[::-1], labels[::-1], independent[::-1])
    itself = family_table.against_independent(same, independent.tolist(), patients, n_boot=100)["abmil_small"]
    assert itself["difference"] == 0 and itself["ci_low"] == itself["ci_high"] == 0


def test_the_resplits_refit_the_independent_model_on_partitions_of_the_same_patients(scripts):
    _, split_luck = scripts
    rng = np.random.default_rng(1)
    sizes = {"train": 40, "val": 10, "test": 20}
    labels = {split: np.arange(n) % 2 for split, n in sizes.items()}
    data = {"label_columns": "label"}

    def pooled(signal: float) -> dict:
        return {split: rng.normal(size=(n, 4)) + signal * labels[split][:, None] for split, n in sizes.items()}

    targets = {split: {"label": y.astype(float)} for split, y in labels.items()}
    separable = split_luck.resplit_scores(pooled(10.0), targets, data, resplits=3)
    assert separable == [1.0] * 3
    noise = split_luck.resplit_scores(pooled(0.0), targets, data, resplits=8)
    assert len(set(noise)) > 1 and 0.3 < np.mean(noise) < 0.7


def test_the_resplit_tables_keep_every_row_and_follow_the_partitions(scripts, tmp_path):
    _, split_luck = scripts
    sizes = {"train": 6, "val": 2, "test": 3}
    patients = {split: [f"{split}{i}" for i in range(n)] for split, n in sizes.items()}
    rows = [(p, i, split) for i, (split, names) in enumerate(patients.items()) for p in names]
    task = tmp_path / "task"
    task.mkdir()
    (task / "clinical.csv").write_text("PATIENT,os_months,cohort_split\n" +
                                       "".join(f"{p},{i}.5,{split}\n" for p, i, split in rows))
    written = split_luck.write_tables(task, "cohort_split", patients, 2, tmp_path / "out")
    every = [p for s in split_luck.SPLITS for p in patients[s]]
    for path, parts in zip(written, split_luck.partitions(sizes, 2)):
        table = list(csv.DictReader(path.open()))
        assert [(r["PATIENT"], r["os_months"]) for r in table] == [(p, f"{i}.5") for p, i, _ in rows]
        for split, numbers in parts.items():
            chosen = sorted(r["PATIENT"] for r in table if r["cohort_split"] == split)
            assert chosen == sorted(every[i] for i in numbers)
    assert len(written) == 2 and written[0].read_text() != written[1].read_text()


def _write_resplit_run(folder: Path, value: float, learned: bool = True) -> None:
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"metric": "c_index", "test": {"c_index": value, "auroc": 0.0},
                                                     "learning": {"learned": learned}}))


def test_the_bag_models_resplit_runs_are_paired_with_the_same_resplits(scripts, tmp_path):
    _, split_luck = scripts
    for k, value in ((2, 0.61), (0, 0.55), (1, 0.60)):
        _write_resplit_run(tmp_path / f"resplit_{k}", value)
    paired = split_luck.paired_over_resplits([tmp_path], [0.50, 0.58, 0.63, 0.99])
    assert paired["resplits"] == [0, 1, 2] and paired["model"] == [0.55, 0.60, 0.61]
    assert paired["independent"] == [0.50, 0.58, 0.63]  # the re-split each run trained on, not the fourth
    assert paired["difference"] == pytest.approx((0.05 + 0.02 - 0.02) / 3) and 0 < paired["p_value"] < 1
    assert "no re-split" in split_luck.paired_text(split_luck.paired_over_resplits([tmp_path / "none"], [0.5]))


def test_several_seeds_are_averaged_on_the_resplits_every_seed_ran_on(scripts, tmp_path):
    _, split_luck = scripts
    for seed, runs in enumerate(({0: 0.50, 1: 0.70, 2: 0.90}, {0: 0.60, 1: 0.50})):
        for k, value in runs.items():
            _write_resplit_run(tmp_path / f"seed_{seed}" / f"resplit_{k}", value, learned=value > 0.5)
    paired = split_luck.paired_over_resplits([tmp_path / "seed_0", tmp_path / "seed_1"], [0.52, 0.61, 0.0])
    assert paired["resplits"] == [0, 1]  # re-split 2 has one seed only
    assert paired["per_seed"] == [[0.50, 0.70], [0.60, 0.50]]
    assert paired["model"] == pytest.approx([0.55, 0.60]) and paired["independent"] == [0.52, 0.61]
    assert paired["difference"] == pytest.approx((0.03 - 0.01) / 2)
    # differences 0.03 and -0.01: standard error 0.02; t with 1 degree of freedom, 12.706 standard errors
    assert paired["interval"] == pytest.approx([0.01 - 12.706 * 0.02, 0.01 + 12.706 * 0.02], abs=1e-3)
    assert (paired["runs_learned"], paired["runs"]) == (2, 4)
    assert "mean of 2 seed(s)" in split_luck.paired_text(paired) and "2 of 4 runs learned" in \
        split_luck.paired_text(paired)


def test_the_pooled_bags_follow_the_configs_split_column(scripts, tmp_path):
    """Mean and max of each bag's features, standardised by the training tiles, split by the column the config
    names (not one called ``split``)."""
    import h5py

    family_table, _ = scripts
    rng = np.random.default_rng(0)
    splits = {"p0": "train", "p1": "train", "p2": "val", "p3": "test"}
    bags = {p: rng.normal(size=(3 + i, 2)) for i, p in enumerate(splits)}
    (tmp_path / "features").mkdir()
    for p, bag in bags.items():
        with h5py.File(tmp_path / "features" / f"slide_{p}.h5", "w") as h5:
            h5["features"] = bag
    (tmp_path / "config.yaml").write_text("data: {split_column: cohort_split, label_columns: label}\n")
    (tmp_path / "clinical.csv").write_text("PATIENT,label,split,cohort_split\n" + "".join(
        f"{p},{i % 2},test,{s}\n" for i, (p, s) in enumerate(splits.items())))
    (tmp_path / "slides.csv").write_text("PATIENT,FILENAME\n" + "".join(f"{p},slide_{p}\n" for p in splits))
    pooled, targets, _, patients = family_table.pooled_bags(tmp_path)
    assert patients == {"train": ["p0", "p1"], "val": ["p2"], "test": ["p3"]}
    training = np.concatenate([bags["p0"], bags["p1"]])
    standard = (bags["p3"] - training.mean(0)) / (training.std(0) + 1e-8)
    np.testing.assert_allclose(pooled["test"][0], np.concatenate([standard.mean(0), standard.max(0)]))
    assert list(targets["train"]["label"]) == [0.0, 1.0]
