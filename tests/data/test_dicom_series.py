"""DICOM series read as a viewer reads them (issue 49): one series per volume, slices ordered along their normal, the
geometry SimpleITK's ImageSeriesReader (the independent reader) gives the same series; a missing slice, a slice
without a position, two series in one folder, a duplicate position, mixed orientations and a tilted stack refused
naming the files, never put on a wrong grid."""

from __future__ import annotations

import numpy as np
import pytest

pydicom = pytest.importorskip("pydicom")
sitk = pytest.importorskip("SimpleITK")

from dicom_series_files import AXIAL, OBLIQUE, planes, simpleitk_series, stack, write_series  # noqa: E402
from medattn.data.readers.dicom_series import choose_series, read_dicom_series, series_geometry  # noqa: E402
from medattn.data.readers.volumes import check_volume_header, read_volume  # noqa: E402
from medattn.errors import UserError  # noqa: E402


@pytest.mark.parametrize("orientation,step", [(AXIAL, 2.5), (AXIAL, -3.0), (OBLIQUE, 1.25), ((0, 1, 0, 0, 0, -1), 2.0)],
                         ids=["axial", "files-descending", "oblique", "sagittal"])
def test_a_regular_series_has_simpleitks_geometry(tmp_path, orientation, step):
    write_series(tmp_path / "s", planes(6), stack(np.asarray(orientation, float), 6, step), orientation)
    array, affine = read_dicom_series(tmp_path / "s")
    expected, expected_affine, _ = simpleitk_series(tmp_path / "s")
    np.testing.assert_allclose(affine, expected_affine, atol=1e-5)
    np.testing.assert_array_equal(array, expected)
    assert check_volume_header(tmp_path / "s") is not None  # the grid is known from the headers at build time


def test_a_missing_slice_is_refused_where_simpleitk_flags_it(tmp_path):
    positions = stack(np.asarray(AXIAL, float), 6)
    write_series(tmp_path / "gap", planes(5), positions[:3] + positions[4:])  # the fourth slice is missing
    *_, keys = simpleitk_series(tmp_path / "gap")
    assert "ITK_non_uniform_sampling_deviation" in keys  # the independent reader sees the gap too
    with pytest.raises(UserError, match=r"gap: the slices are not evenly spaced: .* are 5\.000 mm apart, the others "
                                        r"2\.500 mm \(a missing slice\?\)"):
        read_volume(tmp_path / "gap")
    with pytest.raises(UserError, match="not evenly spaced"):
        check_volume_header(tmp_path / "gap")  # refused when the table is built, before training


def test_a_slice_without_a_position_or_orientation_is_refused_naming_it(tmp_path):
    positions = stack(np.asarray(AXIAL, float), 4)
    write_series(tmp_path / "nopos", planes(4), positions, drop=[(2, "ImagePositionPatient")])
    with pytest.raises(UserError, match=r"nopos/\w+_\d{3}\.dcm: no valid ImagePositionPatient: the slice's place in "
                                        r"the volume is unknown \(nothing is guessed\)"):
        read_volume(tmp_path / "nopos")
    write_series(tmp_path / "noori", planes(4), positions, drop=["ImageOrientationPatient"])
    with pytest.raises(UserError, match="no valid ImageOrientationPatient"):
        read_volume(tmp_path / "noori")


def test_two_series_in_one_folder_are_refused_naming_both_or_one_is_chosen(tmp_path):
    folder = tmp_path / "study"
    first = write_series(folder, planes(4), stack(np.asarray(AXIAL, float), 4), description="T1")
    second = write_series(folder, planes(6, 5, 7)[::-1], stack(np.asarray(AXIAL, float), 6, 1.5, (-10, 4, 20)),
                          description="T2")
    with pytest.raises(UserError, match=r"study: holds 2 DICOM series, read one at a time: .*; give each series its "
                                        r"own folder, or choose one with predict's --dicom-series UID") as refused:
        read_volume(folder)
    assert f"{first} (4 files, MR T1)" in str(refused.value) and f"{second} (6 files, MR T2)" in str(refused.value)
    for uid, count in ((first, 4), (second, 6)):
        with choose_series([uid, "1.2.3.unrelated"]):
            array, affine = read_dicom_series(folder)
            assert series_geometry(folder).uid == uid
        expected, expected_affine, _ = simpleitk_series(folder, uid)
        assert array.shape[2] == count
        np.testing.assert_allclose(affine, expected_affine, atol=1e-5)
        np.testing.assert_array_equal(array, expected)
    with choose_series(["1.2.3.unrelated"]), pytest.raises(UserError, match=r"holds none of the series chosen"):
        read_volume(folder)


@pytest.mark.parametrize("shape,message", [
    ("duplicate", r"lie at one position \(32\.500 mm along the slice normal\): a duplicate slice"),
    ("orientation", r"is oriented otherwise than .*: one series, one orientation"),
    ("tilt", r"lies 0\.500 mm off the line of the first slice's normal \(a tilted gantry or a sheared stack\)"),
])
def test_a_series_off_one_grid_is_refused(tmp_path, shape, message):
    positions = stack(np.asarray(AXIAL, float), 5)
    orientation = AXIAL
    if shape == "duplicate":
        positions[2] = positions[1]
    elif shape == "orientation":
        orientation = [AXIAL] * 4 + [OBLIQUE]
    else:  # each slice shifted 0.5 mm along y: a gantry tilt the orientation does not say
        positions = [p + [0, 0.5 * k, 0] for k, p in enumerate(positions)]
    write_series(tmp_path / shape, planes(5), positions, orientation)
    with pytest.raises(UserError, match=message):
        read_volume(tmp_path / shape)
