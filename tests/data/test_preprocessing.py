"""The preprocessing description: returned by the data builder, stored in the checkpoint, reused by predict."""

import csv
import json

import nibabel as nib
import numpy as np
import pytest
import torch
from PIL import Image

from medattn.cli import main
from medattn.data import build_datasets
from medattn.data.preprocessing import Preprocessing, differences, from_dict, inference_dataset, stated_task
from medattn.errors import UserError


def _volume_table(folder, n: int = 12) -> str:
    """DUKE-like pairs (pre, post) of NIfTI volumes with per-side labels; the lesion shows only in pre - post."""
    rng = np.random.default_rng(0)
    affine = np.diag([0.7, 0.7, 3.0, 1.0])
    with open(folder / "volumes.csv", "w") as f:
        f.write("path,post_path,patient,cancer_left,cancer_right\n")
        for i in range(n):
            post = rng.normal(100, 30, (16, 16, 8)).astype(np.float32)  # most of the signal: subtraction removes it
            pre = post + rng.normal(0, 1, post.shape).astype(np.float32)
            left, right = i % 2, (i // 2) % 2
            pre[2:6, 4:10, 2:6] += 5 * left
            pre[10:14, 4:10, 2:6] += 5 * right
            nib.save(nib.Nifti1Image(pre, affine), folder / f"pre{i}.nii.gz")
            nib.save(nib.Nifti1Image(post, affine), folder / f"post{i}.nii.gz")
            f.write(f"pre{i}.nii.gz,post{i}.nii.gz,p{i},{left},{right}\n")
    (folder / "duke.yaml").write_text(
        f"data: {{kind: volume_table, csv: {folder / 'volumes.csv'}, path_column: path, subtract_column: post_path, "
        "label_columns: [cancer], patient_column: patient, target_size: [8, 16, 8], normalize: zscore, "
        "split_sides: true, augment: false, val_fraction: 0.25, test_fraction: 0.34}\n"
        "model: {name: vit3d_tiny, attention: seqnorm}\n"
        "train: {epochs: 1, batch_size: 4, threads: 1}\neval: {bootstrap: 20}\n")
    return str(folder / "duke.yaml")


def test_predict_subtracts_and_splits_sides_as_training_did(tmp_path, capsys):
    """The DUKE setup (subtract_column, split_sides): predict gives eval's probabilities per side. Before the
    stored description, predict read the first volume alone (no subtraction) and refused left/right models."""
    config = _volume_table(tmp_path)
    run = tmp_path / "run"
    assert main(["train", config, "--out", str(run), "--no-progress"]) == 0
    meta = json.loads((run / "checkpoints/best/checkpoint.json").read_text())
    assert meta["preprocessing"]["subtract"] is True and meta["preprocessing"]["split_sides"] is True
    assert main(["eval", str(run), config, "--out", str(tmp_path / "eval"), "--no-progress"]) == 0
    evaluated = {r["id"]: float(r["prob_cancer"]) for r in csv.DictReader(open(tmp_path / "eval/predictions_test.csv"))}
    stems = sorted({i.split("#")[0] for i in evaluated})
    pre = [str(tmp_path / s) for s in stems]
    post = [str(tmp_path / s.replace("pre", "post")) for s in stems]
    assert main(["predict", str(run), *pre, "--subtract", *post, "--out", str(tmp_path / "p.csv")]) == 0
    rows = list(csv.DictReader(open(tmp_path / "p.csv")))
    assert len(rows) == 2 * len(stems) and {r["side"] for r in rows} == {"left", "right"}
    for row in rows:
        name = row["file"].rsplit("/", 1)[-1]
        assert abs(float(row["prob_cancer"]) - evaluated[f"{name}#{row['side']}"]) <= 1e-5
    capsys.readouterr()
    assert main(["predict", str(run), *pre, "--out", str(tmp_path / "q.csv")]) == 2
    assert "trained on subtraction volumes: give --subtract" in capsys.readouterr().err
    assert main(["eval", str(run), config, "data.normalize=percentile", "--out", str(tmp_path / "e2")]) == 2
    assert "prepares inputs unlike the checkpoint's training: normalize is 'percentile'" in capsys.readouterr().err


def test_inference_samples_equal_the_training_pipelines_samples(tmp_path):
    """Same files, same tensors: the description's loader against build_datasets' test split (no augmentation)."""
    config = _volume_table(tmp_path)
    import yaml

    data_cfg = yaml.safe_load(open(config))["data"]
    bundle = build_datasets(data_cfg, seed=0)
    prep = bundle.preprocessing
    sample = bundle.test[0]
    stem, side = sample["id"].split("#")
    pair = (tmp_path / stem, tmp_path / stem.replace("pre", "post"))
    dataset = inference_dataset(prep, [pair])
    mine = {s["id"].rsplit("#", 1)[1]: s for s in (dataset[0], dataset[1])}
    torch.testing.assert_close(mine[side]["input"], sample["input"], rtol=0, atol=0)


def test_image_table_samples_equal_and_a_changed_std_is_a_difference(tmp_path):
    rng = np.random.default_rng(1)
    with open(tmp_path / "labels.csv", "w") as f:
        f.write("path,label\n")
        for i in range(8):
            Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
            f.write(f"{i}.png,{i % 2}\n")
    cfg = {"kind": "image_table", "csv": str(tmp_path / "labels.csv"), "label_columns": ["label"], "image_size": 16,
           "in_chans": 1, "mean": 0.4, "std": 0.2, "val_fraction": 0.25, "test_fraction": 0.25}
    bundle = build_datasets(cfg)
    prep = bundle.preprocessing
    assert prep.mean == (0.4,) and prep.std == (0.2,) and prep.input_shape == (1, 16, 16)
    sample = bundle.test[0]
    torch.testing.assert_close(inference_dataset(prep, [(tmp_path / sample["id"],)])[0]["input"], sample["input"],
                               rtol=0, atol=0)
    other = build_datasets({**cfg, "std": 0.3}).preprocessing
    assert differences(prep, other) == ["std"]


@pytest.mark.parametrize("kind", ["synthetic_cxr", "synthetic_breast_mri", "synthetic_wsi", "synthetic_vertebrae"])
def test_round_trip_and_shapes_of_packaged_kinds(kind):
    cfg = {"kind": kind, "num_samples": [2, 2, 2]}
    bundle = build_datasets(cfg)
    task, prep = bundle.task, bundle.preprocessing
    assert prep.input_shape == tuple(task.input_shape) and stated_task(prep) == task
    assert from_dict(json.loads(json.dumps(prep.to_dict())), "x") == prep


@pytest.mark.parametrize(("change", "message"), [
    ({"version": 2}, "preprocessing must be a mapping with version 1"),
    ({"colour": 1}, r"unknown keys \['colour'\]"),
    ({"input_shape": [1, 8]}, "preprocessing.input_shape is missing or invalid"),
    ({"std": [0.0]}, "preprocessing.std"),
    ({"normalize": "minmax"}, "preprocessing.normalize"),
    ({"mean": [0.5, 0.5]}, "preprocessing.mean"),
])
def test_stored_description_is_checked(change, message):
    good = Preprocessing("image_table", "image2d", "binary", 1, ("a",), (1, 8, 8), mean=(0.5,), std=(0.5,)).to_dict()
    with pytest.raises(UserError, match=message):
        from_dict({**good, **change}, "ckpt/checkpoint.json")


def test_skip_bad_gives_a_placeholder_and_the_reason(tmp_path):
    prep = Preprocessing("wsi_bags", "bag", "binary", 1, ("t",), (4,))
    (tmp_path / "bad.h5").write_bytes(b"not hdf5")
    dataset = inference_dataset(prep, [(tmp_path / "bad.h5",), (tmp_path / "gone.h5",)], skip_bad=True)
    assert dataset[0]["input"].shape == (1, 4) and dataset[1]["input"].shape == (1, 4)
    assert "bad.h5: cannot read" in dataset.bad[str(tmp_path / "bad.h5")]
    assert dataset.bad[str(tmp_path / "gone.h5")].endswith("gone.h5: no such file")
    with pytest.raises(UserError, match="gone.h5: no such file"):
        inference_dataset(prep, [(tmp_path / "gone.h5",)])[0]
