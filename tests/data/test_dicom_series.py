"""DICOM series read as a viewer reads them (issue 49): one series per volume, slices ordered along their normal, the
geometry SimpleITK's ImageSeriesReader (the independent reader) gives the same series; a missing slice, a slice
without a position, two series in one folder, a duplicate position, mixed orientations and a tilted stack refused
naming the files, never put on a wrong grid."""

from __future__ import annotations

import numpy as np
import pytest

pydicom = pytest.importorskip("pydicom")
sitk = pytest.importorskip("SimpleITK")

from pydicom.dataset import FileDataset, FileMetaDataset  # noqa: E402
from pydicom.uid import ExplicitVRLittleEndian, MRImageStorage, generate_uid  # noqa: E402

from medattn.data.readers.dicom_series import choose_series, read_dicom_series, series_geometry  # noqa: E402
from medattn.data.readers.volumes import check_volume_header, read_volume  # noqa: E402
from medattn.errors import UserError  # noqa: E402

AXIAL = (1, 0, 0, 0, 1, 0)
OBLIQUE = (np.cos(0.3), np.sin(0.3), 0, 0, 0, -1)  # rows tilted in the axial plane, columns run feet-ward


def write_series(folder, planes: np.ndarray, positions, orientation=AXIAL, spacing=(0.8, 0.6), uid=None,
                 description="T1", drop=()):
    """``planes`` (k, rows, columns) as one MR series in ``folder``, slice k at ``positions[k]`` (LPS mm), files
    named in a shuffled order; ``drop``: attributes left out of every file (a name) or of one ((k, name)).
    -> the SeriesInstanceUID."""
    folder.mkdir(parents=True, exist_ok=True)
    uid = uid or generate_uid()
    study, frame = "1.2.826.0.1.3680043.8.498.1", "1.2.826.0.1.3680043.8.498.2"
    names = np.random.default_rng(len(planes)).permutation(len(planes))
    orientations = orientation if isinstance(orientation, list) else [orientation] * len(planes)
    for k, (plane, position) in enumerate(zip(planes, positions)):
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID = MRImageStorage, generate_uid()
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        path = folder / f"{uid[-6:]}_{names[k]:03d}.dcm"
        ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
        ds.SOPClassUID, ds.SOPInstanceUID = MRImageStorage, meta.MediaStorageSOPInstanceUID
        ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = study, uid, frame
        ds.Modality, ds.SeriesDescription, ds.InstanceNumber = "MR", description, int(names[k]) + 1
        ds.Rows, ds.Columns = plane.shape
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
        ds.ImagePositionPatient = [float(v) for v in position]
        ds.ImageOrientationPatient = [float(v) for v in orientations[k]]
        ds.PixelSpacing, ds.SliceThickness = list(spacing), 2.0
        for name in drop:
            if isinstance(name, str) or name[0] == k:
                delattr(ds, name if isinstance(name, str) else name[1])
        ds.PixelData = np.ascontiguousarray(plane, dtype=np.uint16).tobytes()
        ds.save_as(path, enforce_file_format=True)
    return uid


def _stack(orientation, count, step=2.5, origin=(-10.0, 4.0, 30.0)):
    """``count`` slice positions ``step`` mm apart along the normal of ``orientation``."""
    normal = np.cross(orientation[:3], orientation[3:])
    return [np.asarray(origin) + k * step * normal for k in range(count)]


def _planes(count, rows=5, columns=7):
    return np.arange(count * rows * columns, dtype=np.uint16).reshape(count, rows, columns) * 3


def _simpleitk(folder, uid=None):
    """SimpleITK's image of the series ``uid`` (default: the only one) of ``folder``: (array (columns, rows, slices),
    affine in RAS, metadata keys)."""
    reader = sitk.ImageSeriesReader()
    uid = uid or reader.GetGDCMSeriesIDs(str(folder))[0]
    reader.SetFileNames(reader.GetGDCMSeriesFileNames(str(folder), uid))
    image = reader.Execute()
    affine = np.eye(4)
    affine[:3, :3] = np.asarray(image.GetDirection()).reshape(3, 3) * np.asarray(image.GetSpacing())
    affine[:3, 3] = image.GetOrigin()
    affine[:2] *= -1  # LPS -> RAS
    return sitk.GetArrayFromImage(image).transpose(2, 1, 0), affine, image.GetMetaDataKeys()


@pytest.mark.parametrize("orientation,step", [(AXIAL, 2.5), (AXIAL, -3.0), (OBLIQUE, 1.25), ((0, 1, 0, 0, 0, -1), 2.0)],
                         ids=["axial", "files-descending", "oblique", "sagittal"])
def test_a_regular_series_has_simpleitks_geometry(tmp_path, orientation, step):
    planes = _planes(6)
    write_series(tmp_path / "s", planes, _stack(np.asarray(orientation, float), 6, step), orientation)
    array, affine = read_dicom_series(tmp_path / "s")
    expected, expected_affine, _ = _simpleitk(tmp_path / "s")
    np.testing.assert_allclose(affine, expected_affine, atol=1e-5)
    np.testing.assert_array_equal(array, expected)
    assert check_volume_header(tmp_path / "s") is not None  # the grid is known from the headers at build time


def test_a_missing_slice_is_refused_where_simpleitk_flags_it(tmp_path):
    positions = _stack(np.asarray(AXIAL, float), 6)
    write_series(tmp_path / "gap", _planes(5), positions[:3] + positions[4:])  # the fourth slice is missing
    *_, keys = _simpleitk(tmp_path / "gap")
    assert "ITK_non_uniform_sampling_deviation" in keys  # the independent reader sees the gap too
    with pytest.raises(UserError, match=r"gap: the slices are not evenly spaced: .* are 5\.000 mm apart, the others "
                                        r"2\.500 mm \(a missing slice\?\)"):
        read_volume(tmp_path / "gap")
    with pytest.raises(UserError, match="not evenly spaced"):
        check_volume_header(tmp_path / "gap")  # refused when the table is built, before training


def test_a_slice_without_a_position_or_orientation_is_refused_naming_it(tmp_path):
    positions = _stack(np.asarray(AXIAL, float), 4)
    write_series(tmp_path / "nopos", _planes(4), positions, drop=[(2, "ImagePositionPatient")])
    with pytest.raises(UserError, match=r"nopos/\w+_\d{3}\.dcm: no valid ImagePositionPatient: the slice's place in "
                                        r"the volume is unknown \(nothing is guessed\)"):
        read_volume(tmp_path / "nopos")
    write_series(tmp_path / "noori", _planes(4), positions, drop=["ImageOrientationPatient"])
    with pytest.raises(UserError, match="no valid ImageOrientationPatient"):
        read_volume(tmp_path / "noori")


def test_two_series_in_one_folder_are_refused_naming_both_or_one_is_chosen(tmp_path):
    folder = tmp_path / "study"
    first = write_series(folder, _planes(4), _stack(np.asarray(AXIAL, float), 4), description="T1")
    second = write_series(folder, _planes(6, 5, 7)[::-1], _stack(np.asarray(AXIAL, float), 6, 1.5, (-10, 4, 20)),
                          description="T2")
    with pytest.raises(UserError, match=r"study: holds 2 DICOM series, read one at a time: .*; choose one with "
                                        r"--dicom-series UID \(or give each series its own folder\)") as refused:
        read_volume(folder)
    assert f"{first} (4 files, MR T1)" in str(refused.value) and f"{second} (6 files, MR T2)" in str(refused.value)
    for uid, count in ((first, 4), (second, 6)):
        with choose_series([uid, "1.2.3.unrelated"]):
            array, affine = read_dicom_series(folder)
            assert series_geometry(folder).uid == uid
        expected, expected_affine, _ = _simpleitk(folder, uid)
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
    positions = _stack(np.asarray(AXIAL, float), 5)
    orientation = AXIAL
    if shape == "duplicate":
        positions[2] = positions[1]
    elif shape == "orientation":
        orientation = [AXIAL] * 4 + [OBLIQUE]
    else:  # each slice shifted 0.5 mm along y: a gantry tilt the orientation does not say
        positions = [p + [0, 0.5 * k, 0] for k, p in enumerate(positions)]
    write_series(tmp_path / shape, _planes(5), positions, orientation)
    with pytest.raises(UserError, match=message):
        read_volume(tmp_path / shape)
