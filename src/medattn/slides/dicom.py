"""DICOM whole-slide images (VL Whole Slide Microscopy Image Storage) through wsidicom, behind OpenSlide's interface.

A DICOM slide is a folder of instances, one per pyramid level (and label, overview and thumbnail images), as
scanners and PACS export them (``pip install 'medattn[slides]'`` brings wsidicom). :class:`DicomSlide` opens the
folder (given the folder or any ``.dcm`` file in it) with wsidicom, takes its first pyramid's levels in order of
size, and reads regions frame by frame, so a patch never reads a level whole. Microns per pixel come from the
base level's Pixel Spacing (millimetres in the file), as ``openslide.mpp-x`` / ``-y``; its ImageComments as
``dicom.ImageComments``. Folders of several slides (different series) are refused by wsidicom's own check, with its
reason.

:func:`write_dicom_slide` writes a pyramid as such a folder (``medattn wsi synthetic --format dicom``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import UserError
from ..extras import require
from .pyramid import PyramidSlide, clip

SUFFIX = ".dcm"


def is_dicom(path: Path) -> bool:
    """A ``.dcm`` file, or a folder holding ``.dcm`` files (one slide's instances)."""
    path = Path(path)
    if path.is_dir():
        return any(child.suffix.lower() == SUFFIX for child in path.iterdir())
    return path.suffix.lower() == SUFFIX


class DicomSlide(PyramidSlide):
    """A DICOM whole-slide image behind OpenSlide's interface (:class:`~medattn.slides.pyramid.PyramidSlide`)."""

    def __init__(self, path: Path) -> None:
        wsidicom = require("wsidicom", "reading DICOM whole-slide images")
        self.path = Path(path)
        folder = self.path if self.path.is_dir() else self.path.parent
        try:
            self._wsi = wsidicom.WsiDicom.open(folder)
            self._levels = sorted(self._wsi.levels.levels, key=lambda level: level.level)
        except Exception as error:  # wsidicom raises its own errors, and pydicom's, for files it cannot use
            raise UserError(f"{path}: not a DICOM whole-slide image wsidicom can read "
                            f"({type(error).__name__}: {error})") from None
        self.level_dimensions = tuple((level.size.width, level.size.height) for level in self._levels)
        mpp = self._levels[0].mpp  # micrometres per pixel (wsidicom converts the file's millimetres)
        self.properties = {} if mpp is None else {"openslide.mpp-x": str(mpp.width), "openslide.mpp-y": str(mpp.height)}
        try:  # the base level's ImageComments (a SYNTHETIC slide's mark, medattn.slides.mark.is_synthetic)
            comments = self._levels[0].datasets[0].as_dataset().get("ImageComments", "")
        except Exception:  # wsidicom's own errors for a header it reads otherwise
            comments = ""
        if comments:
            self.properties["dicom.ImageComments"] = str(comments)

    def _level_region(self, level: int, x: int, y: int, width: int, height: int) -> np.ndarray:
        """RGB (height, width, 3) of ``level`` at level pixels (x, y); 255 outside the image."""
        out = np.full((height, width, 3), 255, dtype=np.uint8)
        inside = clip(x, y, width, height, self.level_dimensions[level])
        if inside is None:
            return out
        x0, y0, x1, y1 = inside
        try:
            region = self._wsi.read_region((x0, y0), self._levels[level].level, (x1 - x0, y1 - y0), as_array=True)
        except Exception as error:  # damaged or missing frames: wsidicom's and the codecs' own errors
            raise UserError(f"cannot read level {level} at ({x0}, {y0}) ({type(error).__name__}: {error})") from None
        out[y0 - y:y1 - y, x0 - x:x1 - x] = region[..., :3] if region.ndim == 3 else region[..., None]
        return out

    def close(self) -> None:
        self._wsi.close()


#: The SOP class of VL Whole Slide Microscopy Image Storage.
WSI_STORAGE = "1.2.840.10008.5.1.4.1.1.77.1.6"


def write_dicom_slide(out, levels: list[np.ndarray], mpp: float, description: str, patient: str = "",
                      tile: int = 256) -> list[Path]:
    """A pyramid (``levels``: (H, W, 3) uint8, the base first, at ``mpp`` um per pixel) as one DICOM whole-slide image
    in the :class:`~medattn.outputs.OutputFolder` ``out`` (the slide's own folder): one VL Whole Slide
    Microscopy Image instance per level, ``level<k>.dcm``, of one study, series and frame of reference, TILED_FULL
    frames of ``tile`` pixels in row-major order, JPEG baseline (YBR_FULL_422, as most scanners store them), Pixel
    Spacing in millimetres; ``description`` as ImageComments and SeriesDescription, ``patient`` as PatientID (and
    PatientName ``SYNTHETIC^<patient>``).
    Every name is checked before the first is written. -> the files."""
    from pydicom.uid import generate_uid

    names = [f"level{k}.dcm" for k in range(len(levels))]
    for name in names:
        out.path(name)
    shared = {"StudyInstanceUID": generate_uid(), "SeriesInstanceUID": generate_uid(),
              "FrameOfReferenceUID": generate_uid(), "PatientID": patient,
              "PatientName": f"SYNTHETIC^{patient}" if patient else "",
              "ImageComments": description, "SeriesDescription": description[:64],
              "ContainerIdentifier": patient or "1"}
    for k, (name, level) in enumerate(zip(names, levels)):
        with out.write(name) as tmp:
            _level(level, levels[0].shape[1] / level.shape[1], tile, mpp, shared, k).save_as(tmp,
                                                                                            enforce_file_format=True)
    return [out.folder / name for name in names]


def _level(rgb: np.ndarray, downsample: float, tile: int, mpp: float, shared: dict, number: int):
    """One level of :func:`write_dicom_slide` as a pydicom dataset."""
    import io

    from PIL import Image
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.encaps import encapsulate
    from pydicom.uid import JPEGBaseline8Bit, generate_uid

    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.MediaStorageSOPClassUID, ds.file_meta.MediaStorageSOPInstanceUID = WSI_STORAGE, generate_uid()
    ds.file_meta.TransferSyntaxUID = JPEGBaseline8Bit
    ds.SOPClassUID, ds.SOPInstanceUID = WSI_STORAGE, ds.file_meta.MediaStorageSOPInstanceUID
    for keyword, value in shared.items():
        setattr(ds, keyword, value)
    ds.Modality, ds.Manufacturer, ds.SeriesNumber, ds.InstanceNumber = "SM", "medattn", 1, number + 1
    ds.ImageType = ["ORIGINAL" if number == 0 else "DERIVED", "PRIMARY", "VOLUME",
                    "NONE" if number == 0 else "RESAMPLED"]
    h, w, _ = rgb.shape
    across, down = -(-w // tile), -(-h // tile)
    padded = np.full((down * tile, across * tile, 3), 255, np.uint8)
    padded[:h, :w] = rgb
    frames = padded.reshape(down, tile, across, tile, 3).transpose(0, 2, 1, 3, 4).reshape(-1, tile, tile, 3)
    ds.Rows = ds.Columns = tile
    ds.TotalPixelMatrixColumns, ds.TotalPixelMatrixRows, ds.NumberOfFrames = w, h, len(frames)
    ds.DimensionOrganizationType, ds.TotalPixelMatrixFocalPlanes, ds.NumberOfOpticalPaths = "TILED_FULL", 1, 1
    ds.SamplesPerPixel, ds.PlanarConfiguration, ds.PhotometricInterpretation = 3, 0, "YBR_FULL_422"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
    ds.LossyImageCompression, ds.LossyImageCompressionMethod = "01", "ISO_10918_1"
    spacing = mpp * downsample / 1000  # millimetres
    measures = Dataset()
    measures.PixelSpacing, measures.SliceThickness = [spacing, spacing], 0.001
    groups = Dataset()
    groups.PixelMeasuresSequence = [measures]
    ds.SharedFunctionalGroupsSequence = [groups]
    ds.ImagedVolumeWidth, ds.ImagedVolumeHeight, ds.ImagedVolumeDepth = w * spacing, h * spacing, 0.001
    path = Dataset()
    path.OpticalPathIdentifier = "0"
    ds.OpticalPathSequence = [path]
    encoded = []
    for frame in frames:
        buffer = io.BytesIO()
        Image.fromarray(frame).save(buffer, format="JPEG", quality=95, subsampling=1)  # 1: 4:2:2
        encoded.append(buffer.getvalue())
    ds.PixelData = encapsulate(encoded)
    ds["PixelData"].VR = "OB"
    return ds
