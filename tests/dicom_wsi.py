"""Write DICOM whole-slide images as scanners export them, for tests: one VL Whole Slide Microscopy Image instance
per pyramid level in one folder (same study, series and frame of reference), TILED_FULL frames in row-major order,
Pixel Spacing in millimetres in the shared functional groups; frames uncompressed (Explicit VR Little Endian) or
JPEG baseline (YBR_FULL_422, as most scanners store them)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.encaps import encapsulate
from pydicom.uid import ExplicitVRLittleEndian, JPEGBaseline8Bit, generate_uid

WSI_STORAGE = "1.2.840.10008.5.1.4.1.1.77.1.6"


def _frames(rgb: np.ndarray, tile: int) -> np.ndarray:
    """(H, W, 3) -> (frames, tile, tile, 3) in row-major order, the last row and column padded white."""
    h, w, _ = rgb.shape
    across, down = -(-w // tile), -(-h // tile)
    padded = np.full((down * tile, across * tile, 3), 255, np.uint8)
    padded[:h, :w] = rgb
    return padded.reshape(down, tile, across, tile, 3).transpose(0, 2, 1, 3, 4).reshape(-1, tile, tile, 3)


def _level(rgb: np.ndarray, downsample: float, tile: int, mpp: float, uids: tuple[str, str, str], jpeg: bool
           ) -> Dataset:
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = WSI_STORAGE
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = JPEGBaseline8Bit if jpeg else ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = WSI_STORAGE, meta.MediaStorageSOPInstanceUID
    ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = uids
    ds.Modality = "SM"
    base = downsample == 1
    ds.ImageType = ["ORIGINAL" if base else "DERIVED", "PRIMARY", "VOLUME", "NONE" if base else "RESAMPLED"]
    frames = _frames(rgb, tile)
    ds.Rows = ds.Columns = tile
    ds.TotalPixelMatrixColumns, ds.TotalPixelMatrixRows = rgb.shape[1], rgb.shape[0]
    ds.NumberOfFrames = len(frames)
    ds.DimensionOrganizationType = "TILED_FULL"
    ds.TotalPixelMatrixFocalPlanes = ds.NumberOfOpticalPaths = 1
    ds.SamplesPerPixel, ds.PlanarConfiguration = 3, 0
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
    spacing_mm = mpp * downsample / 1000
    measures = Dataset()
    measures.PixelSpacing, measures.SliceThickness = [spacing_mm, spacing_mm], 0.001
    shared = Dataset()
    shared.PixelMeasuresSequence = [measures]
    ds.SharedFunctionalGroupsSequence = [shared]
    ds.ImagedVolumeWidth, ds.ImagedVolumeHeight = rgb.shape[1] * spacing_mm, rgb.shape[0] * spacing_mm
    ds.ImagedVolumeDepth = 0.001
    path = Dataset()
    path.OpticalPathIdentifier = "0"
    ds.OpticalPathSequence = [path]
    if jpeg:
        ds.PhotometricInterpretation = "YBR_FULL_422"
        encoded = []
        for frame in frames:
            buffer = io.BytesIO()
            Image.fromarray(frame).save(buffer, format="JPEG", quality=95)
            encoded.append(buffer.getvalue())
        ds.PixelData = encapsulate(encoded)
        ds["PixelData"].VR = "OB"
    else:
        ds.PhotometricInterpretation = "RGB"
        ds.PixelData = frames.tobytes()
    return ds


def write_dicom_slide(folder: Path, levels: list[np.ndarray], mpp: float = 0.5, tile: int = 256,
                      jpeg: bool = False) -> Path:
    """A pyramid (``levels``: (H, W, 3) uint8, the base first, base at ``mpp`` um per pixel) as a folder of one
    instance per level (``level<k>.dcm``), each level's spacing ``mpp`` times its downsample. Returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    uids = (generate_uid(), generate_uid(), generate_uid())
    for k, level in enumerate(levels):
        downsample = levels[0].shape[1] / level.shape[1]
        _level(level, downsample, tile, mpp, uids, jpeg).save_as(folder / f"level{k}.dcm", enforce_file_format=True)
    return folder
