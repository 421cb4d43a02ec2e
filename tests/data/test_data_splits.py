"""Patient-level splits: fractions, stratification, seeds, k-fold, split columns."""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("sklearn")

from medattn.data.cohort.splits import assign_splits, splits_from_column  # noqa: E402
from medattn.errors import UserError  # noqa: E402

# 40 patients with 1 to 3 samples each; a quarter of the patients are positive
PATIENTS = [f"p{i}" for i in range(40) for _ in range(1 + i % 3)]
KEYS = ["[1.0]" if int(p[1:]) % 4 == 0 else "[0.0]" for p in PATIENTS]


def _groups(names):
    groups = {"train": set(), "val": set(), "test": set()}
    for patient, name in zip(PATIENTS, names):
        groups[name].add(patient)
    return groups


def test_fractions_no_shared_patient_and_stratified():
    names = assign_splits(PATIENTS, KEYS, {"val_fraction": 0.2, "test_fraction": 0.25}, seed=0)
    groups = _groups(names)
    assert [len(groups[s]) for s in ("train", "val", "test")] == [22, 8, 10]
    assert not (groups["train"] & groups["val"] or groups["train"] & groups["test"] or groups["val"] & groups["test"])
    positives = {s: sum(int(p[1:]) % 4 == 0 for p in groups[s]) for s in groups}
    assert positives["test"] in (2, 3) and positives["val"] == 2


def test_seeded():
    cfg = {"val_fraction": 0.2, "test_fraction": 0.2}
    assert assign_splits(PATIENTS, KEYS, cfg, seed=3) == assign_splits(PATIENTS, KEYS, cfg, seed=3)
    assert assign_splits(PATIENTS, KEYS, cfg, seed=3) != assign_splits(PATIENTS, KEYS, cfg, seed=4)


def test_kfold_covers_every_patient_once():
    tested = Counter()
    for fold in range(4):
        groups = _groups(assign_splits(PATIENTS, KEYS, {"folds": 4, "fold": fold, "val_fraction": 0.2}, seed=0))
        assert not (groups["train"] & groups["test"] or groups["val"] & groups["test"])
        assert groups["val"] and not groups["train"] & groups["val"]
        tested.update(groups["test"])
    assert set(tested) == set(PATIENTS) and set(tested.values()) == {1}


def test_rare_stratum_falls_back_to_unstratified():
    patients, keys = [f"p{i}" for i in range(10)], ["[0.0]"] * 9 + ["[1.0]"]
    names = assign_splits(patients, keys, {"val_fraction": 0.2, "test_fraction": 0.2}, seed=0)
    assert Counter(names) == {"train": 6, "val": 2, "test": 2}


def test_bad_options_and_columns():
    with pytest.raises(UserError, match="val_fraction"):
        assign_splits(PATIENTS, KEYS, {"val_fraction": 0.6, "test_fraction": 0.5}, seed=0)
    with pytest.raises(UserError, match="fold must be"):
        assign_splits(PATIENTS, KEYS, {"folds": 3, "fold": 3}, seed=0)
    with pytest.raises(UserError, match="folds must be"):
        assign_splits(PATIENTS, KEYS, {"folds": 1}, seed=0)
    message = "t.csv row 3: patient 'a' is in split 'test' here and in 'train' at t.csv row 2"
    with pytest.raises(UserError, match=message):
        splits_from_column(["a", "a"], ["train", "test"], ["t.csv row 2", "t.csv row 3"])
