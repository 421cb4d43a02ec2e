"""2D slices of 3D volumes (data kinds nifti_slices, synthetic_mri_slices): the slice plan, the axis, empty-slice
subsampling, patient grouping and patient-level splits, and a run through the training loop."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from medattn.config import load_config
from medattn.data import build_datasets
from medattn.data.kinds.slices import foreground_slices, plan_slices
from medattn.errors import UserError
from medattn.generators.synthetic_mri_slices import CLASSES
from medattn.train import fit
from writers import write_nifti


def test_plan_keeps_foreground_slices_and_a_seeded_share_of_empty_ones():
    flags = [torch.tensor([0, 1, 1, 0, 0, 0, 1, 0, 0, 0], dtype=torch.bool)]
    assert plan_slices(flags, 1, 0.0, seed=0) == [(0, 1), (0, 2), (0, 6)]
    assert plan_slices(flags, 1, 1.0, seed=0) == [(0, s) for s in range(10)]
    half = plan_slices(flags, 1, 0.5, seed=0)
    empty = [s for _, s in half if s not in (1, 2, 6)]
    assert len(empty) == round(0.5 * 7) and half == plan_slices(flags, 1, 0.5, seed=0)  # deterministic
    draws = {tuple(plan_slices(flags, 1, 0.5, seed=s)) for s in range(20)}
    assert len(draws) > 1  # the seed picks which empty slices
    assert plan_slices(flags, 2, 1.0, seed=0) == [(0, s) for s in (0, 2, 4, 6, 8)]  # stride
    assert plan_slices(flags, 2, 0.0, seed=0) == [(0, 2), (0, 6)]
    two = plan_slices(flags * 2, 1, 0.0, seed=0)
    assert [v for v, _ in two] == [0, 0, 0, 1, 1, 1]


def test_foreground_slices_along_each_axis():
    label = torch.zeros(4, 5, 6, dtype=torch.long)
    label[1, 2, 3] = 2
    assert foreground_slices(label, 0).tolist() == [False, True, False, False]
    assert foreground_slices(label, 1).nonzero().flatten().tolist() == [2]
    assert foreground_slices(label, 2).nonzero().flatten().tolist() == [3]


SHAPE = (12, 10, 6)


def _cohort(tmp_path, patients=("p0", "p1", "p1", "p2", "p3", "p4", "p5")):
    """NIfTI pairs with an identity affine (RAS+ = array order); volume i has a box of class 1 in
    [2:5, 3:6, 1:3] and a voxel of class 2 at (9, 8, 4); image = 10 * label + i. p1 has two volumes."""
    rows = [["image", "label", "patient_id"]]
    for i, patient in enumerate(patients):
        label = np.zeros(SHAPE, dtype=np.float32)
        label[2:5, 3:6, 1:3] = 1
        label[9, 8, 4] = 2
        write_nifti(tmp_path / f"img{i}.nii.gz", label * 10 + i)
        write_nifti(tmp_path / f"seg{i}.nii.gz", label)
        rows.append([f"img{i}.nii.gz", f"seg{i}.nii.gz", patient])
    with open(tmp_path / "pairs.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return {"kind": "nifti_slices", "csv": str(tmp_path / "pairs.csv"), "patient_column": "patient_id",
            "num_classes": 3, "normalize": "none", "val_fraction": 0.3, "test_fraction": 0.3}


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_nifti_slices_follow_the_axis_and_keep_patients_together(tmp_path, axis):
    cfg = {**_cohort(tmp_path), "axis": axis, "slice_size": [s for i, s in enumerate(SHAPE) if i != axis],
           "empty_fraction": 0.0, "eval_unit": "slice"}
    bundle = build_datasets(cfg, seed=3)
    assert bundle.task.input_kind == "image2d" and bundle.task.num_outputs == 3
    fg = {0: [2, 3, 4, 9], 1: [3, 4, 5, 8], 2: [1, 2, 4]}[axis]  # slices holding a label along the axis
    assert sorted({int(s["id"].rsplit(":", 1)[1]) for s in bundle.train}) == fg  # no empty slice in training
    per_volume = {}
    for split in ("val", "test"):  # evaluation sees every slice of every volume
        for sample in getattr(bundle, split):
            per_volume.setdefault(sample["id"].split("#")[0], []).append(sample)
    assert all(len(samples) == SHAPE[axis] for samples in per_volume.values())
    sample = next(iter(per_volume.values()))[3]
    index = int(sample["id"].split("#")[0][3:-7])
    label = np.zeros(SHAPE, dtype=np.int64)
    label[2:5, 3:6, 1:3] = 1
    label[9, 8, 4] = 2
    expected = torch.from_numpy(label).select(axis, 3)
    assert sample["input"].shape == (1, *expected.shape) and sample["label"].dtype == torch.int64
    assert torch.equal(sample["label"], expected)
    assert torch.equal(sample["input"][0], expected.float() * 10 + index)
    splits = {split: {s["patient"] for s in getattr(bundle, split)} for split in ("train", "val", "test")}
    assert not (splits["train"] & splits["val"] or splits["train"] & splits["test"] or splits["val"] & splits["test"])
    volumes_of_p1 = {s["id"].split("#")[0] for split in ("train", "val", "test") for s in getattr(bundle, split)
                     if s["patient"] == "p1"}
    assert volumes_of_p1 == {"img1.nii.gz", "img2.nii.gz"}  # one patient, two volumes, one split


def test_empty_slices_are_subsampled_in_training_only(tmp_path):
    cfg = {**_cohort(tmp_path), "axis": 0, "slice_size": [10, 6], "empty_fraction": 0.5, "eval_empty_fraction": 0.0,
           "eval_unit": "slice"}
    bundle = build_datasets(cfg, seed=0)
    per_volume = {}
    for sample in bundle.train:
        per_volume.setdefault(sample["id"].split("#")[0], []).append(sample)
    assert all(len(s) == 4 + round(0.5 * 8) for s in per_volume.values())  # 4 with a label, 4 of 8 empty
    assert all(s["label"].any() for s in bundle.val) and all(s["label"].any() for s in bundle.test)


def test_in_plane_crop_and_pad(tmp_path):
    bundle = build_datasets({**_cohort(tmp_path), "axis": 2, "slice_size": [8, 16], "eval_unit": "slice"}, seed=0)
    sample = bundle.val[0]
    assert sample["input"].shape == (1, 8, 16) and sample["label"].shape == (8, 16)


@pytest.mark.parametrize("axis", [0, 2])
def test_evaluation_volumes_put_the_slicing_axis_last_and_match_the_slices(tmp_path, axis):
    cfg = {**_cohort(tmp_path), "axis": axis, "slice_size": [s for i, s in enumerate(SHAPE) if i != axis]}
    volumes = build_datasets(cfg, seed=0)
    slices = build_datasets({**cfg, "eval_unit": "slice"}, seed=0)
    assert len(volumes.test) == len({s["id"].split("#")[0] for s in slices.test})  # one case per volume
    volume = volumes.test[0]
    assert volume["input"].shape == (1, *slices.task.input_shape[1:], SHAPE[axis])
    for sample in slices.test:
        if sample["id"].startswith(volume["id"] + "#"):
            s = int(sample["id"].rsplit(":", 1)[1])
            assert torch.equal(volume["input"][..., s], sample["input"]) and torch.equal(volume["label"][..., s],
                                                                                         sample["label"])
    assert volume["patient"] == next(s["patient"] for s in slices.test if s["id"].startswith(volume["id"]))


@pytest.mark.parametrize("change, message", [
    ({"axis": 3}, "axis must be 0, 1 or 2"), ({"empty_fraction": 1.5}, "empty_fraction must be a number in"),
    ({"slice_stride": 0}, "slice_stride"), ({"target_size": [8, 8, 8]}, "does not take target_size"),
    ({"eval_unit": "patient"}, "eval_unit must be volume or slice"),
])
def test_bad_slice_options(tmp_path, change, message):
    with pytest.raises(UserError, match=message):
        build_datasets({**_cohort(tmp_path), **change})


def test_a_bad_label_map_names_its_file_and_row(tmp_path):
    cfg = _cohort(tmp_path)
    write_nifti(tmp_path / "seg3.nii.gz", np.full(SHAPE, 0.5, dtype=np.float32))
    with pytest.raises(UserError, match=r"pairs.csv row \d+: .*seg3.nii.gz.*0.5"):
        build_datasets(cfg, seed=0)
    assert build_datasets(cfg, seed=0, skip_bad=True).skipped == 1


SMALL = {"kind": "synthetic_mri_slices", "volume_size": [32, 32, 16], "num_patients": [3, 2, 2]}


def test_synthetic_mri_slices_are_deterministic_multi_structure_and_patient_split():
    a, b = build_datasets(SMALL, seed=1), build_datasets(SMALL, seed=1)
    assert a.task.synthetic and a.task.class_names == CLASSES and a.task.input_shape == (1, 32, 32)
    assert len(a.train) == len(b.train) and all(torch.equal(a.train[i]["input"], b.train[i]["input"])
                                                 for i in range(0, len(a.train), 5))
    assert not torch.equal(build_datasets(SMALL, seed=2).train[0]["input"], a.train[0]["input"])
    counts = torch.zeros(len(CLASSES))
    for sample in a.train:
        counts += torch.bincount(sample["label"].flatten(), minlength=len(CLASSES))
    assert (counts[1:5] > 0).all()  # the organs occur; the lesion (class 5) is small where present
    assert 0 < counts[5] < counts[1] / 4 and counts[3] < counts[1]
    patients = [{s["patient"] for s in getattr(a, split)} for split in ("train", "val", "test")]
    assert [len(p) for p in patients] == [3, 2, 2] and not (patients[0] & patients[1] or patients[0] & patients[2])
    with pytest.raises(UserError, match="slice_size"):
        build_datasets({**SMALL, "slice_size": [32, 32]})


def test_one_epoch_through_the_training_loop_groups_slices_by_patient(tmp_path):
    config = load_config("synthetic_mri_slices", [
        "data.volume_size=[16, 16, 8]", "data.num_patients=[2, 1, 2]", "train.epochs=1", "train.batch_size=16",
        "eval.bootstrap=20", "model.kwargs.depth=1", "model.kwargs.decoder_dim=8", "model.kwargs.embed_dim=16",
        "model.kwargs.mlp_dim=16"])
    bundle = build_datasets(config["data"], seed=config["seed"])
    fit(config, bundle, tmp_path / "run", progress=False, log=lambda m: None)
    test = json.loads((tmp_path / "run/results.json").read_text())["test"]
    assert list(test["dice_per_class"]) == CLASSES and test["n"] == len(bundle.test) == 2  # test patients
    assert 0 <= test["ci_low"] <= test["dice"] <= test["ci_high"] <= 1
    cases = list(csv.DictReader(open(tmp_path / "run/predictions_test.csv")))
    assert {c["patient"] for c in cases} == {s["patient"] for s in bundle.test} and len(cases) == 2
    assert sum(int(cases[0][f"voxels_{c}"]) for c in CLASSES) == 16 * 16 * 8  # the whole volume scored
