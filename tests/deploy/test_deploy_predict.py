"""medattn predict and export end to end on files written here: columns, thresholds, provenance, --skip-bad,
ONNX against the checkpoint (1e-4 relative), segmentation label maps on the input's grid."""

import csv
import hashlib
import json
import shutil
import sys
from pathlib import Path

import h5py
import nibabel as nib
import numpy as np
import pytest

from engine_data import square_image_table
from medattn.cli import main
from medattn.data import build_datasets
from medattn.deploy import read_metadata

TRAIN = ["train.epochs=1", "train.batch_size=4", "train.threads=1", "eval.bootstrap=20", "eval.heatmaps=0",
         "--no-progress"]


def _rows(path):
    return list(csv.DictReader(open(path)))


@pytest.fixture(scope="module")
def image_run(tmp_path_factory):
    """PNG files (positives carry a bright square) and a tiny ViT trained on them."""
    folder = tmp_path_factory.mktemp("images")
    square_image_table(folder, "{name: vit2d_tiny, attention: seqnorm, kwargs: {img_size: 16}}")
    assert main(["train", str(folder / "c.yaml"), *TRAIN, "--out", str(folder / "run")]) == 0
    return folder


@pytest.fixture(scope="module")
def bag_run(tmp_path_factory):
    """A tiny WSI model trained on the SYNTHETIC bag task, and test bags written as CLAM-layout HDF5 files."""
    folder = tmp_path_factory.mktemp("bags")
    data = ["data.feature_dim=16", "data.num_instances=[10, 30]", "data.num_samples=[16, 16, 8]"]
    assert main(["train", "synthetic_wsi", *data, "model.name=vitwsi_tiny", "model.attention=sima", *TRAIN,
                 "--out", str(folder / "run")]) == 0
    bundle = build_datasets({"kind": "synthetic_wsi", "feature_dim": 16, "num_instances": [10, 30],
                             "num_samples": [16, 16, 8]})
    for i in range(5):
        with h5py.File(folder / f"slide{i}.h5", "w") as f:
            f["features"] = bundle.test[i]["input"].numpy()
            f["coords"] = bundle.test[i]["coords"].numpy()
    return folder


def test_columns_threshold_and_provenance(image_run, capsys):
    run, files = image_run / "run", [str(image_run / f"{i}.png") for i in range(4)]
    assert main(["predict", str(run), *files, "--out", str(image_run / "p.csv")]) == 0
    assert "threshold: validation Youden's J" in capsys.readouterr().out
    rows = _rows(image_run / "p.csv")
    weights = (run / "checkpoints/best/model.safetensors").read_bytes()
    import json

    meta = json.loads((run / "checkpoints/best/checkpoint.json").read_text())
    stored = meta["threshold"]["values"][0]
    for row in rows:
        assert row["checkpoint_sha256"] == hashlib.sha256(weights).hexdigest()
        assert row["model_id"] == f"run/vit2d_tiny/seqnorm/epoch{meta['epoch']}"
        assert float(row["threshold_label"]) == pytest.approx(stored, abs=1e-6)
        assert int(row["pred_label"]) == int(float(row["prob_label"]) >= stored)
    for cut, expected in (("0", "1"), ("1", "0")):
        assert main(["predict", str(run), *files, "--threshold", cut, "--out", str(image_run / "t.csv"),
                     "--overwrite"]) == 0
        assert {r["pred_label"] for r in _rows(image_run / "t.csv")} == {expected}
    capsys.readouterr()
    assert main(["predict", str(run), *files, "--threshold", "2", "--out", str(image_run / "t.csv")]) == 2
    assert "--threshold must be one number in [0, 1]" in capsys.readouterr().err


def test_skip_bad_lists_bad_files_with_reasons(image_run, capsys):
    run = image_run / "run"
    (image_run / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    files = [str(image_run / "0.png"), str(image_run / "broken.png"), str(image_run / "gone.png"),
             str(image_run / "1.png")]
    assert main(["predict", str(run), *files, "--out", str(image_run / "s.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "broken.png: cannot read" in err[0]
    out = str(image_run / "s.csv")
    assert main(["predict", str(run), *files, "--skip-bad", "--batch-size", "3", "--out", out]) == 0
    assert "skipped 2 bad file(s)" in capsys.readouterr().out
    assert [r["file"] for r in _rows(image_run / "s.csv")] == [files[0], files[3]]
    skipped = {r["file"]: r["reason"] for r in _rows(image_run / "s_skipped.csv")}
    assert set(skipped) == {files[1], files[2]} and skipped[files[2]].endswith("no such file")


def test_onnx_predictions_equal_the_checkpoints_on_image_files(image_run, capsys):
    pytest.importorskip("onnxruntime")
    run, files = image_run / "run", [str(image_run / f"{i}.png") for i in range(6)]
    assert main(["export", str(run), "--format", "onnx", "--out", str(image_run / "m.onnx")]) == 0
    assert "onnxruntime check: largest relative difference" in capsys.readouterr().out
    meta = read_metadata(image_run / "m.onnx")
    assert meta["class_names"] == ["label"] and meta["preprocessing"]["input_shape"] == [1, 16, 16]
    assert main(["predict", str(run), *files, "--out", str(image_run / "a.csv")]) == 0
    assert main(["predict", str(image_run / "m.onnx"), *files, "--out", str(image_run / "b.csv")]) == 0
    _same(_rows(image_run / "a.csv"), _rows(image_run / "b.csv"))
    assert main(["export", str(run), "--format", "pt2", "--out", str(image_run / "m.pt2")]) == 0
    assert read_metadata(image_run / "m.pt2") == meta


def test_onnx_predictions_equal_the_checkpoints_on_hdf5_bags(bag_run):
    """Bags of different lengths in one batch (padded, masked) through the dynamic-token ONNX graph."""
    pytest.importorskip("onnxruntime")
    run, files = bag_run / "run", [str(bag_run / f"slide{i}.h5") for i in range(5)]
    assert main(["export", str(run), "--format", "onnx", "--out", str(bag_run / "m.onnx")]) == 0
    assert main(["predict", str(run), *files, "--out", str(bag_run / "a.csv")]) == 0
    assert main(["predict", str(bag_run / "m.onnx"), *files, "--out", str(bag_run / "b.csv")]) == 0
    _same(_rows(bag_run / "a.csv"), _rows(bag_run / "b.csv"))


def _same(a: list[dict], b: list[dict]) -> None:
    """Same rows; probabilities to 1e-4 relative (the CSV keeps 6 decimals, so 1e-6 absolute below that)."""
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            if key.startswith("prob_"):
                assert abs(float(x[key]) - float(y[key])) <= max(1e-4 * abs(float(x[key])), 1.5e-6), key
            elif not key.startswith("pred_"):  # a probability on the threshold may round either way
                assert x[key] == y[key], key


def test_onnx_without_onnxruntime_is_one_line(image_run, monkeypatch, capsys):
    pytest.importorskip("onnxruntime")
    if not (image_run / "m.onnx").exists():
        assert main(["export", str(image_run / "run"), "--format", "onnx", "--out", str(image_run / "m.onnx")]) == 0
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime now raises ImportError
    out = str(image_run / "x.csv")
    assert main(["predict", str(image_run / "m.onnx"), str(image_run / "0.png"), "--out", out]) == 2
    assert "running an ONNX model needs onnxruntime" in capsys.readouterr().err


def test_segmentation_label_maps_on_the_input_grid(tmp_path, capsys):
    """Label maps keep the input's shape and affine; a volume stored flipped (another affine, same anatomy)
    gives the flipped map; volumes are voxel counts x voxel volume."""
    data = ["data.volume_size=[16, 16, 8]", "data.num_blobs=1", "data.num_samples=[4, 2, 2]"]
    assert main(["train", "synthetic_vertebrae", *data, "model.name=unet3d", "train.batch_size=2", *TRAIN[:1],
                 *TRAIN[2:], "--out", str(tmp_path / "run")]) == 0
    image = build_datasets({"kind": "synthetic_vertebrae", "volume_size": [16, 16, 8], "num_blobs": 1,
                            "num_samples": [4, 2, 2]}).test[0]["input"][0].numpy()
    ras = np.diag([2.0, 1.5, 3.0, 1.0])
    flipped = ras.copy()
    flipped[0, 0], flipped[0, 3] = -2.0, 2.0 * 15  # axis 0 runs right to left: the same world grid
    nib.save(nib.Nifti1Image(image, ras), tmp_path / "a.nii.gz")
    nib.save(nib.Nifti1Image(np.ascontiguousarray(image[::-1]), flipped), tmp_path / "b.nii.gz")
    files = [str(tmp_path / "a.nii.gz"), str(tmp_path / "b.nii.gz")]
    assert main(["predict", str(tmp_path / "run"), *files, "--out", str(tmp_path / "seg.csv")]) == 0
    rows = _rows(tmp_path / "seg.csv")
    maps = [nib.load(r["label_map"]) for r in rows]
    assert [m.shape for m in maps] == [(16, 16, 8)] * 2
    np.testing.assert_array_equal(maps[0].affine, ras)
    np.testing.assert_array_equal(maps[1].affine, flipped)
    a, b = (np.asarray(m.dataobj) for m in maps)
    np.testing.assert_array_equal(b, a[::-1])
    voxel = 2.0 * 1.5 * 3.0
    assert float(rows[0]["volume_mm3_blob1"]) == pytest.approx((a == 1).sum() * voxel)
    assert rows[0]["volume_mm3_blob1"] == rows[1]["volume_mm3_blob1"]


@pytest.mark.parametrize("size", [(8, 16, 16), (6, 16, 12)])
def test_label_maps_undo_reorientation_and_crop(tmp_path, size):
    """A 'label map' computed on the model's grid (the prepared input > 0) maps back to the file's own voxels:
    the same test on the file's array, background where the centre crop cut voxels away. The file is not
    RAS (axes permuted and flipped): its RAS grid is 8 x 16 x 16."""
    import torch

    from medattn.data.preprocessing import Preprocessing, inference_dataset
    from medattn.deploy.segmentation import to_input_grid

    rng = np.random.default_rng(0)
    array = rng.normal(size=(16, 16, 8)).astype(np.float32)
    affine = np.array([[0, 0, -3.0, 20], [-1.5, 0, 0, 5], [0, 2.0, 0, -7], [0, 0, 0, 1]])
    nib.save(nib.Nifti1Image(array, affine), tmp_path / "v.nii.gz")
    prep = Preprocessing("nifti_segmentation", "volume3d", "segmentation", 2, ("bg", "x"), (1, *size))
    prepared = inference_dataset(prep, [(tmp_path / "v.nii.gz",)])[0]["input"][0]
    assert tuple(prepared.shape) == size
    labels, out_affine = to_input_grid((prepared > 0).long(), tmp_path / "v.nii.gz", prep)
    np.testing.assert_array_equal(out_affine, affine)
    kept, _ = to_input_grid(torch.ones(size, dtype=torch.long), tmp_path / "v.nii.gz", prep)
    assert kept.shape == array.shape and kept.sum() == np.prod(size)  # the voxels the model saw, each once
    np.testing.assert_array_equal(labels, (array > 0) * kept)


def test_a_model_trained_on_patches_predicts_by_sliding_windows(tmp_path, capsys):
    """predict gives what eval computes for a patch-trained model (Gaussian-blended windows), not a whole-volume
    forward the model never saw in training; export refuses it in one line."""
    import torch

    from medattn.deploy.runtime import open_model
    from medattn.runtime.sliding import sliding_window_logits
    from medattn.runtime.trained import load_checkpoint

    data = ["data.volume_size=[16, 16, 8]", "data.num_blobs=1", "data.num_samples=[4, 2, 2]"]
    assert main(["train", "synthetic_vertebrae", *data, "model.name=dilated_fcn", "train.batch_size=2",
                 "train.patch_size=[8, 8, 8]", *TRAIN[:1], *TRAIN[2:], "--out", str(tmp_path / "run")]) == 0
    volume = build_datasets({"kind": "synthetic_vertebrae", "volume_size": [16, 16, 8], "num_blobs": 1,
                             "num_samples": [4, 2, 2]}).test[0]["input"][None]
    runner = open_model(tmp_path / "run")
    model = load_checkpoint(tmp_path / "run").model.eval()
    expected = sliding_window_logits(model, volume, (8, 8, 8), 0.5).softmax(1)
    with torch.no_grad():
        whole = model(volume).softmax(1)
    assert not torch.allclose(expected, whole, atol=1e-3)  # the two really differ for this model
    np.testing.assert_allclose(runner.probabilities({"input": volume}), expected.numpy(), atol=1e-6)
    assert main(["export", str(tmp_path / "run"), "--format", "onnx", "--out", str(tmp_path / "m.onnx")]) == 2
    assert "trained on patches" in capsys.readouterr().err
    # eval scores the test split as the training run did (sliding windows): the same Dice as results.json
    assert main(["eval", str(tmp_path / "run"), "synthetic_vertebrae", *data, "--out", str(tmp_path / "eval"),
                 "--no-progress"]) == 0
    evaluated = json.loads((tmp_path / "eval/eval.json").read_text())
    trained = json.loads((tmp_path / "run/results.json").read_text())["test"]
    assert evaluated["dice"] == pytest.approx(trained["dice"], abs=1e-9)


def _edited_onnx(source, target, edit) -> str:
    """A copy of the ONNX file ``source`` whose medattn metadata went through ``edit`` (JSON text -> JSON text)."""
    import onnx

    model = onnx.load(str(source))
    for prop in model.metadata_props:
        if prop.key == "medattn":
            prop.value = edit(prop.value)
    onnx.save(model, str(target))
    return str(target)


def test_onnx_files_with_foreign_or_edited_metadata_are_one_line(image_run, capsys):
    """Metadata of the wrong type, a preprocessing that describes another graph, an input shape the graph refuses,
    a task that contradicts itself: each one error line, never a traceback or a silent number."""
    pytest.importorskip("onnxruntime")
    source = image_run / "m.onnx"
    if not source.exists():
        assert main(["export", str(image_run / "run"), "--format", "onnx", "--out", str(source)]) == 0
    files = [str(image_run / "0.png")]

    def prep(**changes):
        def edit(text):
            meta = json.loads(text)
            meta["preprocessing"].update(changes)
            return json.dumps(meta)
        return edit

    cases = {
        "a list": (lambda text: "[1, 2]", "must be a JSON object"),
        "a bag": (prep(input_kind="bag", input_shape=[16], mean=[], std=[]), "are not those of a bag model"),
        "larger images": (prep(input_shape=[1, 40, 40]), "the graph refuses inputs"),
        "multiclass of one output": (prep(task_type="multiclass"), "contradicts itself"),
        "a threshold text": (lambda text: json.dumps({**json.loads(text), "threshold": "high"}), "threshold must"),
    }
    capsys.readouterr()
    for name, (edit, message) in cases.items():
        path = _edited_onnx(source, image_run / f"edited_{name.replace(' ', '_')}.onnx", edit)
        assert main(["predict", path, *files, "--out", str(image_run / f"{name}.csv")]) == 2, name
        assert message in _one_line(capsys), name


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("medattn: error: ") and "\n" not in err, err
    return err


def test_a_pt2_program_predicts_as_the_checkpoint(image_run, capsys):
    """``predict model.pt2`` runs the torch.export program (it said "no checkpoint found")."""
    run, files = image_run / "run", [str(image_run / f"{i}.png") for i in range(4)]
    program = image_run / "p2.pt2"
    if not program.exists():
        assert main(["export", str(run), "--format", "pt2", "--out", str(program)]) == 0
    assert main(["predict", str(run), *files, "--out", str(image_run / "ck.csv")]) == 0
    assert main(["predict", str(program), *files, "--out", str(image_run / "pt2.csv")]) == 0
    _same(_rows(image_run / "ck.csv"), _rows(image_run / "pt2.csv"))


def test_predict_takes_a_folder_and_names_skip_bad_on_a_bad_file(image_run, tmp_path, capsys):
    run = image_run / "run"
    folder = tmp_path / "scans"
    folder.mkdir()
    for i in range(3):
        shutil.copy(image_run / f"{i}.png", folder / f"{i}.png")
    (folder / "notes.txt").write_text("not an image: left out of the folder's files")
    assert main(["predict", str(run), str(folder), "--out", str(tmp_path / "p.csv")]) == 0
    assert [Path(r["file"]).name for r in _rows(tmp_path / "p.csv")] == ["0.png", "1.png", "2.png"]
    (folder / "3.png").write_bytes(b"\x89PNG cut")
    capsys.readouterr()
    assert main(["predict", str(run), str(folder), "--out", str(tmp_path / "q.csv")]) == 2
    err = capsys.readouterr().err
    assert "3.png" in err and "--skip-bad leaves out" in err


def test_a_patient_with_several_slides_gets_one_prediction_of_their_joined_bag(tmp_path, capsys):
    """--patients SLIDE_TABLE joins a patient's slides into one bag, as training's wsi_bags did."""
    import h5py

    from engine_data import save_checkpoint
    from medattn.data.base import TaskInfo

    ck = save_checkpoint(tmp_path / "ck", "synthetic_wsi", ["model.name=vitwsi_tiny", "model.attention=seqnorm"],
                         TaskInfo("binary", "bag", 1, (16,), ["tumour"], synthetic=True))
    rng = np.random.default_rng(0)
    bags = {name: rng.normal(size=(n, 16)).astype(np.float32) for name, n in (("a", 30), ("b", 20), ("c", 25))}
    bags["a+b"] = np.concatenate([bags["a"], bags["b"]])
    for name, features in bags.items():
        with h5py.File(tmp_path / f"{name}.h5", "w") as f:
            f["features"], f["coords"] = features, np.zeros((len(features), 2), np.int64)
    (tmp_path / "slides.csv").write_text("PATIENT,FILENAME\nP1,a\nP1,b.h5\nP2,c\n")
    files = [str(tmp_path / f"{name}.h5") for name in ("a", "b", "c")]
    assert main(["predict", str(ck), *files, "--patients", str(tmp_path / "slides.csv"),
                 "--out", str(tmp_path / "patients.csv")]) == 0
    assert "(patients: 3 slides joined by" in capsys.readouterr().out
    rows = list(csv.DictReader(open(tmp_path / "patients.csv")))
    assert [r["patient"] for r in rows] == ["P1", "P2"]  # the ids under their own name (issue 36)
    assert main(["predict", str(ck), str(tmp_path / "a+b.h5"), str(tmp_path / "c.h5"),
                 "--out", str(tmp_path / "joined.csv")]) == 0
    joined = list(csv.DictReader(open(tmp_path / "joined.csv")))
    assert [float(r["prob_tumour"]) for r in rows] == pytest.approx([float(r["prob_tumour"]) for r in joined],
                                                                     abs=1e-6)
    (tmp_path / "other.csv").write_text("PATIENT,FILENAME\nP1,a\n")
    capsys.readouterr()
    assert main(["predict", str(ck), *files, "--patients", str(tmp_path / "other.csv"), "--out",
                 str(tmp_path / "x.csv")]) == 2
    assert "no row names b.h5, c.h5 (2 of the 3 file(s))" in capsys.readouterr().err
