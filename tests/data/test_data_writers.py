"""What the test writers (tests/writers.py) write reads back as written with the libraries users have."""

from __future__ import annotations

import numpy as np
import pytest

from writers import write_dicom, write_h5, write_nifti


def test_dicom_round_trip(tmp_path):
    pydicom = pytest.importorskip("pydicom")
    array = np.arange(12, dtype=np.uint16).reshape(3, 4)
    ds = pydicom.dcmread(write_dicom(tmp_path / "a.dcm", array, "MONOCHROME1", slope=2.0, intercept=-5.0))
    assert ds.PhotometricInterpretation == "MONOCHROME1" and float(ds.RescaleSlope) == 2.0
    np.testing.assert_array_equal(ds.pixel_array, array)


def test_nifti_and_h5_round_trip(tmp_path):
    nib = pytest.importorskip("nibabel")
    h5py = pytest.importorskip("h5py")
    volume = np.random.default_rng(0).random((4, 5, 6)).astype(np.float32)
    image = nib.load(write_nifti(tmp_path / "v.nii.gz", volume, spacing=(0.5, 0.5, 2.0)))
    np.testing.assert_allclose(image.header.get_zooms(), (0.5, 0.5, 2.0))
    np.testing.assert_array_equal(np.asarray(image.dataobj), volume)
    with h5py.File(write_h5(tmp_path / "s.h5", volume[0], layout="stamp"), "r") as f:
        assert list(f) == ["feats"]
