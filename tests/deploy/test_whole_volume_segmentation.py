"""Segmentation of the whole input and on the source geometry (issue 49): a 3D segmentation model larger inputs than
its training size segments every voxel by sliding windows (a structure outside the central crop is found, the CSV's
volumes count it); a DICOM series off one regular grid is refused in one line naming it; one series chosen out of a
folder of two gets its label map and DICOM Segmentation on that series' grid, the grid SimpleITK reads."""

from __future__ import annotations

import csv

import nibabel as nib
import numpy as np
import pytest
import torch

from engine_data import save_checkpoint
from medattn.cli import main
from medattn.data.base import TaskInfo
from medattn.data.preprocessing import Preprocessing
from medattn.deploy.predict import predict_files
from medattn.deploy.runtime import Runner

CLASSES = ["background", "lesion"]


def _threshold_runner(size, seen, slice_axis=None):
    """A runner of a pointwise 'model' of input size ``size``: lesion where the voxel is over 0.5; ``seen`` collects
    the shapes it is given. ``slice_axis``: a 2D model trained on slices along that axis."""
    kind = "volume3d" if slice_axis is None else "image2d"
    prep = Preprocessing("nifti_segmentation", kind, "segmentation", 2, tuple(CLASSES), (1, *size),
                         slice_axis=slice_axis)

    def run(batch):
        x = batch["input"]  # (B, 1, H, W, D)
        seen.append(tuple(x.shape))
        lesion = (x > 0.5).float()
        return torch.cat([1 - lesion, lesion], 1).numpy() * 0.9 + 0.05  # (B, 2, H, W, D)

    return Runner(prep, None, "test/threshold", "0" * 64, "memory", run)


def test_a_structure_outside_the_training_crop_is_segmented(tmp_path):
    """A 50 x 58 x 20 volume, a model of input 16 x 16 x 8: the lesion in a corner, far from the central crop the
    model used to see alone, is in the label map and the CSV; the model only ever sees windows of its size."""
    volume = np.zeros((50, 58, 20), np.float32)
    volume[2:7, 49:55, 1:4] = 500  # 90 voxels in a corner
    volume[24:27, 28:30, 9:11] = 500  # 12 voxels in the centre: the only ones the centre crop kept
    affine = np.diag([0.7, 0.8, 2.5, 1.0])
    nib.save(nib.Nifti1Image(volume, affine), tmp_path / "scan.nii.gz")
    seen = []
    table = predict_files(_threshold_runner((16, 16, 8), seen), [(tmp_path / "scan.nii.gz",)],
                          label_dir=tmp_path / "maps")
    (row,) = [dict(zip(table.header, r)) for r in table.rows]
    labels = np.asarray(nib.load(row["label_map"]).dataobj)
    np.testing.assert_array_equal(labels, volume > 100)  # every voxel, on the file's grid
    assert row["voxels_lesion"] == 102 and float(row["volume_mm3_lesion"]) == pytest.approx(102 * 0.7 * 0.8 * 2.5)
    assert set(seen) == {(1, 1, 16, 16, 8)} and len(seen) == 6 * 7 * 4  # windows of the training size, overlap 0.5
    assert table.notes == ["segmented 1 volume(s) larger than the model's 16 x 16 x 8 input whole, by sliding windows "
                           "of that size (overlap 0.5, Gaussian-weighted blending of the probabilities, MONAI's "
                           "sliding_window_inference convention)"]


def test_a_slice_segmenter_segments_whole_slices_and_images(tmp_path):
    """A 2D model of input 16 x 16 trained on axial slices: a 40 x 36 x 5 volume and a 30 x 44 image are segmented
    in-plane by windows of 16 x 16 (every slice at once), corners included."""
    from PIL import Image

    volume = np.zeros((40, 36, 5), np.float32)
    volume[0:3, 30:36, 1:3] = 500
    volume[37:40, 0:2, 4] = 500
    nib.save(nib.Nifti1Image(volume, np.diag([0.5, 0.5, 3.0, 1.0])), tmp_path / "vol.nii.gz")
    image = np.zeros((30, 44), np.uint8)
    image[26:30, 0:5] = 255
    Image.fromarray(image).save(tmp_path / "slice.png")
    seen = []
    table = predict_files(_threshold_runner((16, 16), seen, slice_axis=2),
                          [(tmp_path / "vol.nii.gz",), (tmp_path / "slice.png",)], label_dir=tmp_path / "maps")
    np.testing.assert_array_equal(np.asarray(nib.load(table.rows[0][1]).dataobj), volume > 100)
    np.testing.assert_array_equal(np.asarray(Image.open(table.rows[1][1])), image > 100)
    assert table.rows[0][2] == 3 * 6 * 2 + 3 * 2
    assert {s[2:4] for s in seen} == {(16, 16)} and (1, 1, 16, 16, 5) in seen  # in-plane windows, all slices at once
    assert table.notes[-1].startswith("segmented 2 input(s) (in-plane) larger than the model's 16 x 16 input whole")


def test_a_volume_within_the_training_size_takes_one_forward_as_before(tmp_path):
    volume = np.zeros((12, 16, 6), np.float32)
    volume[0:2, 0:3, 0] = 500
    nib.save(nib.Nifti1Image(volume, np.eye(4)), tmp_path / "small.nii.gz")
    seen = []
    table = predict_files(_threshold_runner((16, 16, 8), seen), [(tmp_path / "small.nii.gz",)],
                          label_dir=tmp_path / "maps")
    assert seen == [(1, 1, 16, 16, 8)] and table.notes == []  # padded to the model's size, one forward
    np.testing.assert_array_equal(np.asarray(nib.load(table.rows[0][1]).dataobj), volume > 100)


@pytest.fixture(scope="module")
def unet(tmp_path_factory):
    """An untrained 2-class 3D U-Net of input 16 x 16 x 8 on SYNTHETIC data."""
    root = tmp_path_factory.mktemp("unet")
    task = TaskInfo("segmentation", "volume3d", 2, (1, 16, 16, 8), CLASSES, synthetic=True)
    return save_checkpoint(root / "ck", "synthetic_vertebrae", ["model.name=unet3d"], task, normalize="zscore")


def test_predict_refuses_a_series_with_a_missing_slice_in_one_line(unet, tmp_path, capsys):
    pytest.importorskip("pydicom")
    from dicom_series_files import AXIAL, planes, stack, write_series

    positions = stack(np.asarray(AXIAL, float), 10)
    write_series(tmp_path / "gap", planes(9, 18, 20), positions[:4] + positions[5:])
    assert main(["predict", str(unet), str(tmp_path / "gap"), "--out", str(tmp_path / "p.csv")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"medattn: error: {tmp_path / 'gap'}: the slices are not evenly spaced: ")
    assert error.endswith("are 5.000 mm apart, the others 2.500 mm (a missing slice?); refused rather than put on a "
                          "wrong grid (--skip-bad leaves out files that cannot be read and lists them)")
    assert not (tmp_path / "p.csv").exists() and not list(tmp_path.rglob("*_labels.nii.gz"))  # nothing on a wrong grid
    assert main(["predict", str(unet), str(tmp_path / "gap"), "--out", str(tmp_path / "s.csv"), "--skip-bad"]) == 0
    with open(tmp_path / "s_skipped.csv", newline="") as f:
        (skipped,) = list(csv.DictReader(f))
    assert skipped["file"] == str(tmp_path / "gap") and "(a missing slice?)" in skipped["reason"]
    assert not list(tmp_path.rglob("*_labels.nii.gz"))


def test_one_series_of_two_is_segmented_on_its_own_grid(unet, tmp_path, capsys):
    pytest.importorskip("pydicom")
    from dicom_series_files import AXIAL, planes, simpleitk_series, stack, write_series

    folder = tmp_path / "study"
    write_series(folder, planes(6, 18, 20), stack(np.asarray(AXIAL, float), 6), description="T1")
    chosen = write_series(folder, planes(12, 22, 30) % 701, stack(np.asarray(AXIAL, float), 12, 1.5, (-9, 3, 10)),
                          description="T2")
    assert main(["predict", str(unet), str(folder), "--out", str(tmp_path / "refused.csv")]) == 2
    assert "study: holds 2 DICOM series, read one at a time: " in capsys.readouterr().err
    assert main(["predict", str(unet), str(folder), "--out", str(tmp_path / "p.csv"), "--dicom-series", chosen]) == 0
    printed = capsys.readouterr().out
    assert "segmented 1 volume(s) larger than the model's 16 x 16 x 8 input whole, by sliding windows" in printed
    with open(tmp_path / "p.csv", newline="") as f:
        (row,) = list(csv.DictReader(f))
    image = nib.load(row["label_map"])
    _, affine, _ = simpleitk_series(folder, chosen)
    assert image.shape == (30, 22, 12)  # (columns, rows, slices) of the chosen series
    np.testing.assert_allclose(image.affine, affine, atol=1e-4)
    labels = np.asarray(image.dataobj)
    assert int(row["voxels_lesion"]) == int((labels == 1).sum())
    assert float(row["volume_mm3_lesion"]) == pytest.approx((labels == 1).sum() * 0.8 * 0.6 * 1.5, rel=1e-5)
    hd = pytest.importorskip("highdicom")
    seg = hd.seg.segread(tmp_path / "p_labels" / "study_seg.dcm")
    (referenced,) = seg.ReferencedSeriesSequence
    assert referenced.SeriesInstanceUID == chosen and len(referenced.ReferencedInstanceSequence) == 12


def test_an_exported_graph_segments_a_whole_volume_as_the_checkpoint_does(unet, tmp_path):
    """The same windows and blending for an ONNX file (of the training input size) as for the checkpoint."""
    pytest.importorskip("onnxruntime")
    from medattn.deploy.runtime import open_model

    assert main(["export", str(unet), "--format", "onnx", "--out", str(tmp_path / "m.onnx"), "--no-check"]) == 0
    rng = np.random.default_rng(1)
    nib.save(nib.Nifti1Image(rng.normal(size=(26, 19, 11)).astype(np.float32), np.eye(4)), tmp_path / "v.nii.gz")
    tables = [predict_files(open_model(model, "cpu"), [(tmp_path / "v.nii.gz",)], label_dir=tmp_path / name)
              for model, name in ((unet, "ck"), (tmp_path / "m.onnx", "onnx"))]
    assert all(len(t.notes) == 1 and t.notes[0].startswith("segmented 1 volume(s) larger") for t in tables)
    maps = [np.asarray(nib.load(t.rows[0][1]).dataobj) for t in tables]
    assert maps[0].shape == (26, 19, 11)
    assert (maps[0] != maps[1]).mean() < 1e-3  # float rounding may flip a voxel at a near tie, no more
