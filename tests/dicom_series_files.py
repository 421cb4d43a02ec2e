"""DICOM series written as scanners write them, in the shapes that test a series reader (issue 49): regular, files in
any order, oblique; a missing slice or attribute, two series in one folder; and SimpleITK's reading of them (the
independent reader)."""

from __future__ import annotations

import numpy as np
from pydicom.dataset import FileDataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, MRImageStorage, generate_uid

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


def stack(orientation, count, step=2.5, origin=(-10.0, 4.0, 30.0)):
    """``count`` slice positions ``step`` mm apart along the normal of ``orientation``."""
    normal = np.cross(orientation[:3], orientation[3:])
    return [np.asarray(origin) + k * step * normal for k in range(count)]


def planes(count, rows=5, columns=7):
    return np.arange(count * rows * columns, dtype=np.uint16).reshape(count, rows, columns) * 3


def simpleitk_series(folder, uid=None):
    """SimpleITK's image of the series ``uid`` (default: the only one) of ``folder``: (array (columns, rows, slices),
    affine in RAS, metadata keys)."""
    import SimpleITK as sitk

    reader = sitk.ImageSeriesReader()
    uid = uid or reader.GetGDCMSeriesIDs(str(folder))[0]
    reader.SetFileNames(reader.GetGDCMSeriesFileNames(str(folder), uid))
    image = reader.Execute()
    affine = np.eye(4)
    affine[:3, :3] = np.asarray(image.GetDirection()).reshape(3, 3) * np.asarray(image.GetSpacing())
    affine[:3, 3] = image.GetOrigin()
    affine[:2] *= -1  # LPS -> RAS
    return sitk.GetArrayFromImage(image).transpose(2, 1, 0), affine, image.GetMetaDataKeys()
