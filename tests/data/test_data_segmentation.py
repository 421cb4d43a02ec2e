"""Segmentation data: the synthetic vertebra kind and NIfTI image/label pairs (nifti_segmentation)."""

import nibabel as nib
import numpy as np
import pytest
import torch

from medattn.data import build_datasets
from medattn.data.base import collate
from medattn.errors import UserError
from medattn.generators.synthetic_vertebrae import SyntheticVertebrae

VERTEBRAE = {"kind": "synthetic_vertebrae", "volume_size": [8, 8, 32], "num_blobs": 2,
             "num_samples": {"train": 3, "val": 2, "test": 2}}


def test_synthetic_vertebrae_follows_the_sample_contract():
    bundle = build_datasets(VERTEBRAE, seed=3)
    task = bundle.task
    assert (task.task_type, task.input_kind, task.num_outputs, task.input_shape) == \
        ("segmentation", "volume3d", 3, (1, 8, 8, 32))
    assert task.synthetic and task.class_names == ["background", "blob1", "blob2"]
    sample = bundle.train[1]
    assert sample["input"].shape == (1, 8, 8, 32) and sample["input"].dtype == torch.float32
    assert sample["label"].shape == (8, 8, 32) and sample["label"].dtype == torch.int64
    assert set(sample["label"].unique().tolist()) == {0, 1, 2}
    image, label = SyntheticVertebrae(3, seed=3, size=(8, 8, 32), num_blobs=2)[1]  # the same generator
    assert torch.equal(sample["input"], image) and torch.equal(sample["label"], label)
    batch = collate([bundle.train[0], bundle.train[1]])
    assert batch["input"].shape == (2, 1, 8, 8, 32) and batch["label"].shape == (2, 8, 8, 32)
    assert batch["label"].dtype == torch.int64 and batch["id"][0] != batch["id"][1]


def test_synthetic_vertebrae_is_deterministic_and_splits_differ():
    a, b = build_datasets(VERTEBRAE, seed=3), build_datasets(VERTEBRAE, seed=3)
    assert torch.equal(a.val[0]["label"], b.val[0]["label"])
    assert not torch.equal(a.train[0]["label"], a.val[0]["label"])
    assert not torch.equal(build_datasets(VERTEBRAE, seed=4).train[0]["input"], a.train[0]["input"])


@pytest.mark.parametrize("change, message", [({"volume_size": [8, 8, 16]}, "depth .* at least 18"),
                                             ({"num_blobs": 0}, "num_blobs"), ({"blobs": 3}, "does not take blobs")])
def test_synthetic_vertebrae_bad_options(change, message):
    with pytest.raises(UserError, match=message):
        build_datasets({**VERTEBRAE, **change})


def _save(path, array, spacing=(1.0, 1.0, 1.0), dtype=np.float32):
    nib.save(nib.Nifti1Image(np.asarray(array, dtype=dtype), np.diag([*spacing, 1.0])), str(path))


def _pairs(tmp_path, n=6, shape=(8, 6, 4), spacing=(1.0, 1.0, 1.0)):
    """n NIfTI pairs: label = a box of class 1 and a voxel of class 2; image = label * 10 + index."""
    rows = ["image,label,patient"]
    for i in range(n):
        label = np.zeros(shape, dtype=np.int16)
        label[1:4, 1:3, 1:3] = 1
        label[-1, -1, -1] = 2
        _save(tmp_path / f"img{i}.nii.gz", label * 10.0 + i, spacing)
        _save(tmp_path / f"seg{i}.nii.gz", label, spacing, np.int16)
        rows.append(f"img{i}.nii.gz,seg{i}.nii.gz,p{i // 2}")
    (tmp_path / "pairs.csv").write_text("\n".join(rows) + "\n")
    return {"kind": "nifti_segmentation", "csv": str(tmp_path / "pairs.csv"), "num_classes": 3,
            "patient_column": "patient", "target_size": list(shape), "normalize": "none", "val_fraction": 0.34,
            "test_fraction": 0.34}


def test_nifti_pairs_load_as_image_and_label_map(tmp_path):
    bundle = build_datasets(_pairs(tmp_path))
    task = bundle.task
    assert (task.task_type, task.num_outputs, task.input_shape) == ("segmentation", 3, (1, 8, 6, 4))
    assert task.class_names == ["background", "1", "2"] and not task.synthetic
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (2, 2, 2)
    patients = [{s["patient"] for s in split} for split in (bundle.train, bundle.val, bundle.test)]
    assert all(len(p) == 1 for p in patients) and len(set.union(*patients)) == 3  # patients stay in one split
    sample = bundle.test[0]
    assert sample["input"].shape == (1, 8, 6, 4) and sample["label"].dtype == torch.int64
    index = int(sample["id"][3])
    assert torch.equal(sample["input"][0], sample["label"].float() * 10 + index)
    assert int((sample["label"] == 1).sum()) == 12 and int((sample["label"] == 2).sum()) == 1


def test_label_is_resampled_by_nearest_neighbour(tmp_path):
    cfg = {**_pairs(tmp_path, n=3, shape=(8, 6, 4)), "target_spacing": [0.5, 0.5, 0.5], "target_size": [16, 12, 8],
           "classes": ["background", "box", "dot"], "split_column": None}
    cfg.pop("num_classes")
    bundle = build_datasets({**cfg, "val_fraction": 0.34, "test_fraction": 0.34})
    sample = bundle.train[0]
    assert sample["input"].shape == (1, 16, 12, 8) and sample["label"].shape == (16, 12, 8)
    assert set(sample["label"].unique().tolist()) == {0, 1, 2}  # no interpolated in-between classes
    assert int((sample["label"] == 1).sum()) == 12 * 8 and int((sample["label"] == 2).sum()) == 8
    assert bundle.task.class_names == ["background", "box", "dot"]


def test_augmentation_flips_image_and_label_together(tmp_path):
    bundle = build_datasets({**_pairs(tmp_path), "augment": True})
    torch.manual_seed(0)
    flipped = 0
    for _ in range(8):
        sample = bundle.train[0]
        index = int(sample["id"][3])
        assert torch.equal(sample["input"][0], sample["label"].float() * 10 + index)
        flipped += int(sample["label"][0, 0, 0] == 2)  # the class-2 voxel moved from the far corner
    assert 0 < flipped < 8


def test_missing_file_names_file_and_row(tmp_path):
    cfg = _pairs(tmp_path)
    (tmp_path / "seg4.nii.gz").unlink()
    with pytest.raises(UserError, match=r"pairs.csv row 6: .*seg4.nii.gz: file or folder not found"):
        build_datasets(cfg)
    assert build_datasets(cfg, skip_bad=True).skipped == 1


def test_mismatched_shapes_are_refused(tmp_path):
    cfg = _pairs(tmp_path)
    _save(tmp_path / "seg2.nii.gz", np.zeros((8, 6, 5)), dtype=np.int16)
    with pytest.raises(UserError, match=r"pairs.csv row 4: .*image shape \(8, 6, 4\) and label shape \(8, 6, 5\)"):
        build_datasets(cfg)


@pytest.mark.parametrize("value, message", [(0.5, "holds a value 0.5; expected integer class indices"),
                                            (-1, "holds a value -1"), (3, "label value 3 is out of range for 3")])
def test_bad_label_values_are_refused(tmp_path, value, message):
    cfg = _pairs(tmp_path)
    label = np.zeros((8, 6, 4))
    label[2, 2, 2] = value
    _save(tmp_path / "seg1.nii.gz", label)
    bundle = build_datasets(cfg, seed=0)  # headers are fine: content is checked when loaded
    split = next(s for s in (bundle.train, bundle.val, bundle.test) if any(r.id == "img1.nii.gz" for r in s.records))
    position = [r.id for r in split.records].index("img1.nii.gz")
    with pytest.raises(UserError, match=rf"pairs.csv row 3: .*seg1.nii.gz: .*{message}"):
        split[position]
    assert build_datasets(cfg, skip_bad=True).skipped == 1  # loaded once at build time


def test_class_count_is_required(tmp_path):
    cfg = _pairs(tmp_path, n=2)
    cfg.pop("num_classes")
    with pytest.raises(UserError, match="needs classes .* or num_classes"):
        build_datasets(cfg)
    with pytest.raises(UserError, match="does not take path_column"):
        build_datasets({**cfg, "num_classes": 2, "path_column": "image"})
