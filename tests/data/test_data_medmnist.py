"""MedMNIST ``.npz`` files: 2D gray/RGB and 3D layouts, task types from the labels, bad files."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from medattn.data import build_datasets
from medattn.errors import UserError


def _npz(tmp_path, images: dict, labels: dict, name="m.npz"):
    arrays = {f"{s}_images": images[s] for s in images} | {f"{s}_labels": labels[s] for s in labels}
    np.savez(tmp_path / name, **arrays)
    return {"kind": "medmnist", "path": str(tmp_path / name), "augment": False, "mean": 0.0, "std": 1.0}


def _split(shape, labels, seed=0):
    rng = np.random.default_rng(seed)
    images = {s: rng.integers(0, 256, (len(labels), *shape), dtype=np.uint8) for s in ("train", "val", "test")}
    return images, {s: np.asarray(labels) for s in ("train", "val", "test")}


def test_2d_gray_binary(tmp_path):
    images, labels = _split((8, 8), [[0], [1], [1], [0]])
    bundle = build_datasets(_npz(tmp_path, images, labels))
    sample = bundle.train[1]
    assert bundle.task.task_type == "binary" and bundle.task.input_shape == (1, 8, 8)
    torch.testing.assert_close(sample["input"][0], torch.from_numpy(images["train"][1] / 255).float())
    assert sample["label"].tolist() == [1.0] and len(bundle.test) == 4 and sample["id"] == "train-1"


def test_2d_rgb_multiclass_resized(tmp_path):
    images, labels = _split((8, 8, 3), [[0], [3], [2], [1]])
    cfg = {**_npz(tmp_path, images, labels), "image_size": 16, "in_chans": 1}
    bundle = build_datasets(cfg)
    assert bundle.task.task_type == "multiclass" and bundle.task.num_outputs == 4
    assert bundle.task.input_shape == (1, 16, 16) and bundle.train[0]["input"].shape == (1, 16, 16)
    assert bundle.train[1]["label"].dtype == torch.int64 and bundle.train[1]["label"].item() == 3


def test_multilabel_like_chestmnist(tmp_path):
    images, labels = _split((8, 8), [[0, 1, 1], [1, 0, 0], [0, 0, 0]])
    bundle = build_datasets(_npz(tmp_path, images, labels))
    assert bundle.task.task_type == "multilabel" and bundle.task.num_outputs == 3
    assert bundle.train[0]["label"].tolist() == [0.0, 1.0, 1.0]


def test_3d_volumes(tmp_path):
    images, labels = _split((4, 6, 8), [[0], [1]])  # (N, D, H, W)
    bundle = build_datasets({**_npz(tmp_path, images, labels), "augment": True})
    assert bundle.task.input_kind == "volume3d" and bundle.task.input_shape == (1, 6, 8, 4)
    expected = torch.from_numpy(images["val"][0].transpose(1, 2, 0) / 255).float()[None]
    torch.testing.assert_close(bundle.val[0]["input"], expected)
    forced = build_datasets({**_npz(tmp_path, *_split((4, 6, 3), [[0], [1]]), "x.npz"), "spatial_dims": 3})
    assert forced.task.input_shape == (1, 6, 3, 4)


def test_bad_files(tmp_path):
    images, labels = _split((8, 8), [[0], [1], [1], [0]])
    del labels["val"]
    with pytest.raises(UserError, match="missing array.s. val_labels;"):
        build_datasets(_npz(tmp_path, images, labels))
    with pytest.raises(UserError, match="file not found"):
        build_datasets({"kind": "medmnist", "path": str(tmp_path / "none.npz")})
    (tmp_path / "junk.npz").write_bytes(b"junk")
    with pytest.raises(UserError, match="junk.npz: not a readable"):
        build_datasets({"kind": "medmnist", "path": str(tmp_path / "junk.npz")})
    images, labels = _split((2, 8, 8, 2, 2), [[0], [1]])
    with pytest.raises(UserError, match="train_images: expected images"):
        build_datasets(_npz(tmp_path, images, labels))
    images, labels = _split((8, 8), [[0], [1], [1], [0]])
    labels["train"] = np.array([[0], [1], [-1], [1]])
    with pytest.raises(UserError, match=r"train_labels\[2\]"):
        build_datasets(_npz(tmp_path, images, labels))
    assert build_datasets(_npz(tmp_path, images, labels), skip_bad=True).skipped == 1
    images["test"] = images["test"].astype(np.float32)
    images["test"][0, 0, 0] = np.nan
    with pytest.raises(UserError, match="NaN"):
        build_datasets(_npz(tmp_path, images, labels))
