"""Writers of small medical files for the tests (PNG/JPEG/TIFF, DICOM, NIfTI, HDF5, CSV), in their publishers'
layouts; tests/data/test_data_writers.py checks that what they write reads back as written."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np


def write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def write_pillow(path: Path, array: np.ndarray) -> Path:
    """uint8 (H, W) or (H, W, 3), or uint16 (H, W) (saved as 16-bit for .tif/.png)."""
    from PIL import Image

    Image.fromarray(array).save(path)
    return path


def write_dicom(path: Path, array: np.ndarray, photometric: str = "MONOCHROME2", slope: float = 1.0,
                intercept: float = 0.0, position=(0.0, 0.0, 0.0), orientation=(1, 0, 0, 0, 1, 0),
                spacing=(1.0, 1.0), instance: int = 1) -> Path:
    """A uint16 (H, W) slice (or (F, H, W) frames) as an MR image with the given geometry."""
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, MRImageStorage, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = MRImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
    ds.Modality = "MR"
    ds.Rows, ds.Columns = array.shape[-2:]
    if array.ndim == 3:
        ds.NumberOfFrames = array.shape[0]
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = photometric
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
    ds.RescaleSlope, ds.RescaleIntercept = slope, intercept
    ds.ImagePositionPatient = list(position)
    ds.ImageOrientationPatient = list(orientation)
    ds.PixelSpacing = list(spacing)
    ds.InstanceNumber = instance
    ds.PixelData = np.ascontiguousarray(array, dtype=np.uint16).tobytes()
    ds.save_as(path, enforce_file_format=True)
    return path


def write_nifti(path: Path, array: np.ndarray, spacing=(1.0, 1.0, 1.0), affine: np.ndarray | None = None) -> Path:
    import nibabel as nib

    if affine is None:
        affine = np.diag([*spacing, 1.0])
    nib.save(nib.Nifti1Image(np.asarray(array, dtype=np.float32), affine), path)
    return path


def write_h5(path: Path, features: np.ndarray, coords: np.ndarray | None = None, layout: str = "clam") -> Path:
    import h5py

    with h5py.File(path, "w") as f:
        f["features" if layout == "clam" else "feats"] = features
        if coords is not None:
            f["coords"] = coords
    return path


def write_bag_cohort(root: Path, clinical: list[list], header: list[str], tiles=lambda i: 5, features: int = 16,
                     seed: int = 0) -> dict:
    """One CLAM H5 bag of noise per clinical row (patient ``P<i>``, ``feats/s<i>.h5`` of ``tiles(i)`` tiles with
    ``features`` features and coordinates), the slide and clinical tables (``PATIENT`` and ``header``), and the
    wsi_bags data section over them."""
    rng = np.random.default_rng(seed)
    (root / "feats").mkdir(parents=True, exist_ok=True)
    slides = []
    for i in range(len(clinical)):
        write_h5(root / "feats" / f"s{i}.h5", rng.normal(size=(tiles(i), features)).astype(np.float32),
                 rng.integers(0, 5000, (tiles(i), 2)).astype(np.float32))
        slides.append([f"P{i}", f"s{i}.h5"])
    rows = [[f"P{i}", *row] for i, row in enumerate(clinical)]
    return {"kind": "wsi_bags", "feature_dir": str(root / "feats"),
            "slide_table": str(write_csv(root / "slides.csv", ["PATIENT", "FILENAME"], slides)),
            "clinical_table": str(write_csv(root / "clinical.csv", ["PATIENT", *header], rows))}
