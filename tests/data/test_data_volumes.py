"""3D volume tables: NIfTI and DICOM series, orientation, resampling, crop/pad, subtraction, sides, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("nibabel")
pytest.importorskip("pydicom")

from medattn.data import build_datasets  # noqa: E402
from medattn.data.readers.volumes import crop_or_pad, normalise, read_dicom_series, read_volume, to_native_grid  # noqa: E402
from medattn.errors import UserError  # noqa: E402
from writers import write_csv, write_dicom, write_nifti  # noqa: E402


def _ramp(shape=(6, 5, 4)):
    return np.arange(np.prod(shape), dtype=np.float32).reshape(shape)


def _copies(tmp_path, stem, array, n, spacing=(1.0, 1.0, 1.0)):
    """n files of one array, told apart by their origin (one file per row: a file in two rows is a duplicate)."""
    for i in range(n):
        affine = np.diag([*spacing, 1.0])
        affine[:3, 3] = i
        write_nifti(tmp_path / f"{stem}{i}.nii.gz", array, affine=affine)
    return [f"{stem}{i}.nii.gz" for i in range(n)]


def _cfg(csv, **kw):
    return {"kind": "volume_table", "csv": str(csv), "label_columns": "label", "target_size": [6, 5, 4],
            "normalize": "none", "augment": False, **kw}


def test_nifti_is_reoriented_to_ras(tmp_path):
    volume = _ramp()
    ras, spacing = read_volume(write_nifti(tmp_path / "ras.nii.gz", volume, spacing=(0.5, 1.0, 3.0)))
    assert torch.equal(ras, torch.from_numpy(volume)) and spacing == (0.5, 1.0, 3.0)
    las = np.diag([-0.5, 1.0, 3.0, 1.0])  # axis 0 runs right to left
    flipped, spacing = read_volume(write_nifti(tmp_path / "las.nii", volume, affine=las))
    assert torch.equal(flipped, torch.from_numpy(volume[::-1].copy())) and spacing == (0.5, 1.0, 3.0)
    permuted = np.array([[0, 2.0, 0, 0], [0.7, 0, 0, 0], [0, 0, 3.0, 0], [0, 0, 0, 1]])  # axes 0, 1 swapped
    swapped, spacing = read_volume(write_nifti(tmp_path / "swap.nii", volume, affine=permuted))
    assert torch.equal(swapped, torch.from_numpy(volume.transpose(1, 0, 2).copy()))
    assert spacing == pytest.approx((2.0, 0.7, 3.0))  # input axis 1 (2 mm) runs along x


def test_dicom_series_matches_nifti(tmp_path):
    """Axial slices written in shuffled order: sorted by position, rescaled, LPS turned into RAS."""
    volume = _ramp((4, 3, 5))  # RAS (x, y, z)
    folder = tmp_path / "series"
    folder.mkdir()
    for k in (3, 0, 4, 1, 2):
        rows_cols = volume[::-1, ::-1, k].T  # LPS columns run right->left, rows anterior->posterior
        write_dicom(folder / f"slice{k}.dcm", (rows_cols * 2).astype(np.uint16), slope=0.5, intercept=0.0,
                    position=(0.0, 0.0, 2.5 * k), spacing=(0.8, 0.6), instance=5 - k)
    series, spacing = read_volume(folder)
    assert torch.equal(series, torch.from_numpy(volume)) and spacing == pytest.approx((0.6, 0.8, 2.5))
    # a map on the loader's grid (cropped) goes back onto the series' own array grid, voxel for voxel
    stored, affine = read_dicom_series(folder)
    back, back_affine = to_native_grid(crop_or_pad(series, (3, 3, 4)), folder, None)
    kept = to_native_grid(torch.ones(3, 3, 4, dtype=torch.bool), folder, None)[0]
    np.testing.assert_array_equal(back_affine, affine)
    assert kept.sum() == 3 * 3 * 4 and np.array_equal(back[kept], stored[kept]) and not back[~kept].any()


def test_resample_crop_pad_and_normalise(tmp_path):
    names = _copies(tmp_path, "v", np.ones((4, 4, 2), np.float32), 8, spacing=(2.0, 2.0, 3.0))
    csv = write_csv(tmp_path / "t.csv", ["path", "label"], [[names[i], i % 2] for i in range(8)])
    bundle = build_datasets(_cfg(csv, target_spacing=[1.0, 1.0, 3.0], target_size=[6, 10, 4]))
    x = bundle.train[0]["input"]
    assert x.shape == (1, 6, 10, 4) and bundle.task.input_shape == (1, 6, 10, 4)
    assert x[0, :, 1:9, 1:3].eq(1).all() and x[0, :, 0].eq(1).all()  # resampled 8 x 8 x 2, then cropped/padded
    padded = crop_or_pad(torch.arange(4.0).reshape(2, 2, 1) + 1, (4, 1, 1))
    assert padded.flatten().tolist() == [1.0, 1.0, 3.0, 1.0]  # padded with the minimum, rows centred
    z = normalise(torch.randn(4, 4, 4) * 5 + 3, "zscore")
    assert abs(z.mean()) < 1e-5 and abs(z.std() - 1) < 1e-5
    p = normalise(torch.arange(1000.0).reshape(10, 10, 10), "percentile")
    assert p.min() == 0 and p.max() == 1


def test_subtraction_and_split_sides(tmp_path):
    pre = np.zeros((8, 4, 2), np.float32)
    pre[:4], pre[4:] = 10.0, 20.0  # left half 10, right half 20
    post = np.full((8, 4, 2), 1.0, np.float32)
    pres, posts = _copies(tmp_path, "pre", pre, 6), _copies(tmp_path, "post", post, 6)
    rows = [[pres[i], posts[i], f"p{i}", i % 2, 1 - i % 2] for i in range(6)]
    csv = write_csv(tmp_path / "t.csv", ["path", "post", "patient", "lesion_left", "lesion_right"], rows)
    cfg = _cfg(csv, label_columns="lesion", subtract_column="post", split_sides=True, patient_column="patient",
               target_size=[4, 4, 2], val_fraction=0.0, test_fraction=0.0)
    bundle = build_datasets(cfg)
    assert len(bundle.train) == 12 and bundle.task.class_names == ["lesion"]
    left, right = bundle.train[0], bundle.train[1]
    assert (left["id"], right["id"]) == ("pre0.nii.gz#left", "pre0.nii.gz#right")
    assert left["input"].eq(9).all() and right["input"].eq(19).all()
    assert left["patient"] == right["patient"]
    assert {left["label"].item(), right["label"].item()} == {0.0, 1.0}


def test_flip_augmentation_only_in_training(tmp_path):
    names = _copies(tmp_path, "v", _ramp(), 6)
    csv = write_csv(tmp_path / "t.csv", ["path", "label", "split", "patient"],
                    [[names[i], i % 2, ["train", "val", "test"][i % 3], i] for i in range(6)])
    bundle = build_datasets(_cfg(csv, split_column="split", patient_column="patient", augment=True))
    torch.manual_seed(0)
    seen = {tuple(bundle.train[0]["input"].flatten()[:2].tolist()) for _ in range(12)}
    assert len(seen) > 2  # flips along different axes put different voxels first
    assert torch.equal(bundle.val[0]["input"][0], torch.from_numpy(_ramp()))


def test_bad_volumes(tmp_path):
    good = _copies(tmp_path, "good", _ramp(), 8)
    write_nifti(tmp_path / "flat.nii.gz", np.zeros((6, 5), np.float32))
    write_nifti(tmp_path / "nan.nii.gz", np.full((6, 5, 4), np.nan, np.float32))
    (tmp_path / "junk.nii.gz").write_bytes(b"nonsense")
    rows = [[good[i], i % 2] for i in range(8)]
    for name, expected in [("flat.nii.gz", "3D volume"), ("junk.nii.gz", "junk.nii.gz"), ("gone.nii", "not found"),
                           ("../x.nii", "outside the data root")]:
        csv = write_csv(tmp_path / "t.csv", ["path", "label"], rows + [[name, 1]])
        with pytest.raises(UserError, match="t.csv row 10") as err:
            build_datasets(_cfg(csv))
        assert expected in str(err.value)
        assert build_datasets(_cfg(csv), skip_bad=True).skipped == 1
    csv = write_csv(tmp_path / "t.csv", ["path", "label"], rows + [["nan.nii.gz", 1]])
    bundle = build_datasets(_cfg(csv, val_fraction=0.0, test_fraction=0.0))
    with pytest.raises(UserError, match="t.csv row 10: .*nan.nii.gz: the volume holds NaN"):
        [bundle.train[i] for i in range(len(bundle.train))]
    assert build_datasets(_cfg(csv), skip_bad=True).skipped == 1
    with pytest.raises(UserError, match="missing column.*lesion_left"):
        build_datasets(_cfg(csv, label_columns="lesion", split_sides=True))


def _one_volume_table(tmp_path, shape, affine, **kw):
    write_nifti(tmp_path / "v.nii.gz", np.zeros(shape, np.float32), affine=affine)
    write_csv(tmp_path / "t.csv", ["path", "label"], [["v.nii.gz", 1]])
    cfg = {"kind": "volume_table", "csv": str(tmp_path / "t.csv"), "label_columns": "label", "augment": False,
           "val_fraction": 0.0, "test_fraction": 0.0, **kw}
    return build_datasets(cfg).warnings


@pytest.mark.parametrize("shape, affine, kw, lost", [
    ((300, 8, 8), np.eye(4), {}, "15%"),  # H 300 > 256: centre-cropped
    ((8, 8, 8), np.eye(4), {}, None),  # smaller: only padded
    ((300, 8, 8), np.eye(4), {"target_size": [256, 256, 32]}, None),  # the user chose the size
    ((8, 300, 8), np.array([[0, 1.0, 0, 0], [1.0, 0, 0, 0], [0, 0, 1.0, 0], [0, 0, 0, 1]]), {}, "15%"),  # W -> H
    ((8, 8, 40), np.eye(4), {}, "20%"),  # D 40 > 32
    ((200, 8, 8), np.eye(4), {"target_spacing": [0.5, 1.0, 1.0]}, "36%"),  # resampled to 400 voxels
    ((400, 8, 8), np.eye(4), {"split_sides": True}, None),  # halves of 200 fit
])
def test_a_default_size_that_crops_the_volumes_is_a_warning(tmp_path, shape, affine, kw, lost):
    if kw.get("split_sides"):
        write_nifti(tmp_path / "v.nii.gz", np.zeros(shape, np.float32), affine=affine)
        write_csv(tmp_path / "t.csv", ["path", "label_left", "label_right"], [["v.nii.gz", 1, 0]])
        cfg = {"kind": "volume_table", "csv": str(tmp_path / "t.csv"), "label_columns": "label", "augment": False,
               "val_fraction": 0.0, "test_fraction": 0.0, **kw}
        warnings = build_datasets(cfg).warnings
    else:
        warnings = _one_volume_table(tmp_path, shape, affine, **kw)
    if lost is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and "data.target_size is not set" in warnings[0]
        assert f"{lost} of an axis" in warnings[0]
