"""Results written back as DICOM, so that a PACS or a DICOM viewer shows them beside their source (optional extra:
``pip install 'medattn[dicom]'`` brings highdicom).

* :class:`SegmentationWriter` (``medattn predict``, a segmentation model given a DICOM series): a DICOM Segmentation
  ``<stem>_seg.dcm``, BINARY, one segment per foreground class labelled with the model's class name, of the label map
  predict writes as NIfTI on the series' own grid (the same array: frame k is the source instance at slice k of that
  grid), each frame referencing its source instance.
* :class:`TileAnnotationWriter` (``medattn explain`` on a bag whose slide, found in ``--slides``, is a DICOM
  whole-slide image): Microscopy Bulk Simple Annotations ``<stem>_tiles.dcm``, one POLYGON per tile (its four
  corners in level-0 pixels, the total pixel matrix of the slide's base level; coordinate type 2D) with the tile's
  score as a measurement, as the tile CSV and GeoJSON give them.

Both are derived objects of their source. Patient and study (:data:`COPIED`: PatientID, PatientName, ...,
StudyInstanceUID, AccessionNumber, ...) are copied from it, never made up: one the source lacks is left empty, as
DICOM permits for these type 2 attributes (the StudyInstanceUID and the FrameOfReferenceUID a source must have).
The frame of reference is the source's; the source series and instances are referenced; the series and instance
UIDs are new (``highdicom.UID()``). The series description says medattn wrote it, and SYNTHETIC when the model or
the data are synthetic. The algorithm is identified as medattn with its version and the model's id and checkpoint
hash. Without highdicom nothing of this is written; the other outputs are, and :meth:`DicomWriter.notes` says what
was not and how to get it.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import numpy as np

from medattn.outputs import OutputFolder

from .. import __version__

INSTALL = "pip install 'medattn[dicom]'"
#: The source's patient and study attributes every object copies (empty where the source has none).
COPIED = ("PatientID", "PatientName", "PatientBirthDate", "PatientSex", "StudyInstanceUID", "StudyID",
          "AccessionNumber", "StudyDate", "StudyTime", "ReferringPhysicianName")
#: The series number of every object medattn writes (a number for people; the new SeriesInstanceUID identifies it).
SERIES_NUMBER = 900
#: medattn's private coding scheme (DICOM: a designator starting with "99"), for what no standard code names.
SCHEME = "99MEDATTN"
#: Value Representation LO: at most 64 characters.
LONG_STRING = 64
#: The SOP class of the instances of a DICOM whole-slide image.
WSI_STORAGE = "1.2.840.10008.5.1.4.1.1.77.1.6"


def is_dicom_series(path: Path) -> bool:
    """Whether a volume input is a DICOM series: the volume reader reads a folder as one
    (:func:`medattn.data.readers.volumes.read_volume`)."""
    return Path(path).is_dir()


def _highdicom():
    """The highdicom module, or None when it is not installed."""
    try:
        import highdicom
    except ImportError:
        return None
    return highdicom


def _identifiers_kept(dataset):
    """``dataset`` (a source instance's header) with each attribute of :data:`COPIED` it lacks added empty, so that
    highdicom copies what the source has and leaves the rest empty."""
    for keyword in COPIED:
        if keyword not in dataset:
            setattr(dataset, keyword, None)
    return dataset


def series_description(what: str, synthetic: bool) -> str:
    """The series description of an object medattn writes: medattn output, SYNTHETIC (when ``synthetic``), then
    ``what`` (cut to 64 characters; the model is named by the algorithm identification and ManufacturerModelName)."""
    return f"medattn output{' SYNTHETIC' if synthetic else ''}: {what}"[:LONG_STRING]


class DicomWriter:
    """The DICOM objects of one kind (:attr:`what`, written as ``<stem><suffix>``) that one command writes for the
    model ``model_id`` (checkpoint hash ``checkpoint_sha256``; ``synthetic``: trained on SYNTHETIC data), and what it
    wrote or did not, for the command's :meth:`notes`."""

    what = ""
    suffix = ""

    def __init__(self, model_id: str, checkpoint_sha256: str, synthetic: bool) -> None:
        self.model_id, self.checkpoint_sha256, self.synthetic = model_id, checkpoint_sha256, synthetic
        self.written: list[Path] = []
        self.without_highdicom: list[str] = []  # sources whose object was not written: highdicom is missing
        self.refused: list[tuple[str, str]] = []  # (source, why its object cannot be made)
        self.saved: dict = {}  # stem -> the dataset written (an SR references a Segmentation)

    @cached_property
    def hd(self):
        """The highdicom module (imported when first asked for), or None when it is not installed."""
        return _highdicom()

    @property
    def available(self) -> bool:
        """Whether highdicom is installed (the objects can be written)."""
        return self.hd is not None

    def name(self, stem: str) -> str:
        """The object's file name for the outputs named ``stem``."""
        return f"{stem}{self.suffix}"

    def notes(self) -> list[str]:
        """One line per thing to tell: the objects written, those not written for want of highdicom (and how to get
        it), each source whose object could not be made and why."""
        lines = []
        if self.written:
            shown = ", ".join(map(str, self.written[:3])) + (", ..." if len(self.written) > 3 else "")
            lines.append(f"wrote {len(self.written)} {self.what} object(s) referencing their DICOM source: {shown}")
        if self.without_highdicom:
            lines.append(f"{self.what} not written for {len(self.without_highdicom)} DICOM input(s): it needs "
                         f"highdicom ({INSTALL})")
        lines += [f"{self.what} not written for {source}: {why}" for source, why in self.refused]
        return lines

    def _algorithm(self):
        """highdicom's AlgorithmIdentificationSequence: medattn, its version, the model's id and checkpoint hash."""
        from pydicom.sr.codedict import codes

        parameters = {"model_id": self.model_id, "checkpoint_sha256": self.checkpoint_sha256}
        return self.hd.AlgorithmIdentificationSequence(name="medattn", family=codes.cid7162.ArtificialIntelligence,
                                                       version=__version__, parameters=parameters)

    def _equipment(self) -> dict:
        """The arguments every object takes: new UIDs, the series, medattn as the equipment."""
        return {"series_instance_uid": self.hd.UID(), "series_number": SERIES_NUMBER, "sop_instance_uid": self.hd.UID(),
                "instance_number": 1, "manufacturer": "medattn",
                "manufacturer_model_name": (self.model_id or "medattn")[:LONG_STRING],
                "software_versions": __version__,
                "device_serial_number": (self.checkpoint_sha256 or self.model_id or "medattn")[:LONG_STRING]}

    @staticmethod
    def _missing(headers) -> str:
        """Why objects referencing ``headers`` (the source's instances) cannot be made: a UID they must carry is
        missing (never made up); "" when none is."""
        for keyword in ("StudyInstanceUID", "SeriesInstanceUID", "SOPInstanceUID", "FrameOfReferenceUID"):
            if any(not str(ds.get(keyword, "") or "") for ds in headers):
                return f"the source has no {keyword} (it is copied, never made up)"
        return ""

    def _save(self, build, source: Path, out: OutputFolder, stem: str) -> str | None:
        """The object ``build()`` makes, written as ``<stem><suffix>`` into ``out`` (atomically, by the output policy);
        -> the name, or None when highdicom refuses the source (recorded with its reason for :meth:`notes`)."""
        try:
            dataset = build()
        except (ValueError, TypeError, AttributeError, KeyError) as error:  # highdicom's word on a source it cannot use
            self.refused.append((str(source), f"highdicom: {str(error).splitlines()[0] if str(error) else error!r}"))
            return None
        name = self.name(stem)
        with out.write(name) as tmp:
            dataset.save_as(tmp, enforce_file_format=True)
        self.written.append(out.path(name))
        self.saved[stem] = dataset
        return name


class SegmentationWriter(DicomWriter):
    """DICOM Segmentations of label maps on their DICOM series' grid (module docstring)."""

    what = "DICOM Segmentation"
    suffix = "_seg.dcm"

    def write(self, labels: np.ndarray, affine: np.ndarray, series: Path, class_names: list[str], out: OutputFolder,
              stem: str) -> str | None:
        """A DICOM Segmentation of ``labels`` (the label map on the series' own grid, (columns, rows, slices), as
        :func:`medattn.deploy.segmentation.to_input_grid` gives it, with the RAS ``affine`` of that grid) of the DICOM
        series folder ``series``, written into ``out`` as ``<stem>_seg.dcm``; ``class_names``: one per class, the
        first the background. -> the name written, or None (recorded for :meth:`notes`)."""
        if self.hd is None:
            self.without_highdicom.append(str(series))
            return None
        from medattn.data.readers.dicom_series import series_geometry

        headers = [_identifiers_kept(ds) for ds in series_geometry(series).headers]  # as the volume was read
        order, why = _slice_order(headers, affine, labels.shape)
        why = self._missing(headers) or why
        if why:
            self.refused.append((str(series), why))
            return None
        frames = np.ascontiguousarray(np.asarray(labels).transpose(2, 1, 0))  # (slices, rows, columns)
        return self._segmentation([headers[i] for i in order], frames, series, class_names, out, stem)

    def write_image(self, labels: np.ndarray, image: Path, class_names: list[str], out: OutputFolder,
                    stem: str) -> str | None:
        """A DICOM Segmentation of ``labels`` (rows, columns), the label map of the 2D DICOM image file ``image`` on
        its own pixels (a slice model's map of one image), written into ``out`` as ``<stem>_seg.dcm``: one frame,
        referencing the image. -> the name written, or None (recorded for :meth:`notes`)."""
        if self.hd is None:
            self.without_highdicom.append(str(image))
            return None
        import pydicom

        source = _identifiers_kept(pydicom.dcmread(image))
        why = next((f"the source has no {k} (it is copied, never made up)" for k in
                    ("StudyInstanceUID", "SeriesInstanceUID", "SOPInstanceUID") if not str(source.get(k, "") or "")),
                   "")
        size = (int(source.get("Rows", 0)), int(source.get("Columns", 0)))
        if not why and np.asarray(labels).shape != size:
            why = f"its label map is {np.asarray(labels).shape}, the image {size[0]} x {size[1]}"
        if why:
            self.refused.append((str(image), why))
            return None
        if "PixelSpacing" in source and "SliceThickness" not in source and "FrameOfReferenceUID" not in source:
            del source.PixelSpacing  # a projection image: highdicom would write Pixel Measures it cannot read back
        return self._segmentation([source], np.asarray(labels)[None], image, class_names, out, stem)

    def _segmentation(self, sources: list, frames: np.ndarray, source: Path, class_names: list[str],
                      out: OutputFolder, stem: str) -> str | None:
        """The Segmentation of ``frames`` (one per dataset of ``sources``, rows by columns) of ``source``, written."""
        from pydicom.sr.codedict import codes

        frames = frames.astype(np.uint8 if len(class_names) <= 256 else np.uint16)
        algorithm = self._algorithm()
        segments = [self.hd.seg.SegmentDescription(
            segment_number=k, segment_label=name[:LONG_STRING], segmented_property_category=codes.SCT.Tissue,
            segmented_property_type=self.hd.sr.CodedConcept(name, SCHEME, name[:LONG_STRING]),
            algorithm_type="AUTOMATIC", algorithm_identification=algorithm)
            for k, name in enumerate(class_names[1:], start=1)]
        description = series_description("segmentation", self.synthetic)
        return self._save(lambda: self.hd.seg.Segmentation(
            source_images=sources, pixel_array=frames, segmentation_type="BINARY",
            segment_descriptions=segments, series_description=description, content_label="MEDATTN",
            content_description=description, **self._equipment()), source, out, stem)


def _slice_order(headers, affine: np.ndarray, shape: tuple[int, ...]) -> tuple[list[int], str]:
    """(the indices of ``headers`` in the order of the grid's slices, "") when each instance's ImagePositionPatient
    is the corner of one slice of the grid (RAS ``affine``, array ``shape``) and every slice has one; else ([], why)."""
    inverse = np.linalg.inv(np.asarray(affine, dtype=np.float64))
    slices = []
    for ds in headers:
        if "ImagePositionPatient" not in ds:
            return [], "an instance has no ImagePositionPatient"
        x, y, z = (float(v) for v in ds.ImagePositionPatient)
        i, j, k = (inverse @ np.array([-x, -y, z, 1.0]))[:3]  # LPS (DICOM) -> RAS -> voxel
        if abs(i) > 1e-3 or abs(j) > 1e-3 or abs(k - round(k)) > 1e-3:
            return [], "its instances' positions are not the slices of one grid"
        slices.append(round(k))
    if sorted(slices) != list(range(shape[2])):
        return [], f"its {len(headers)} instances are not the {shape[2]} slices of the label map"
    return [int(i) for i in np.argsort(slices)], ""


class TileAnnotationWriter(DicomWriter):
    """Microscopy Bulk Simple Annotations of a bag's tile scores on its DICOM whole-slide image (module docstring)."""

    what = "DICOM Microscopy Bulk Simple Annotations"
    suffix = "_tiles.dcm"

    def write(self, slide: Path, corners: np.ndarray, side: float, scores: np.ndarray, method: str,
              out: OutputFolder, stem: str, synthetic_data: bool = False) -> str | None:
        """The tiles of top-left ``corners`` (N, 2) (x, y) and ``side`` in level-0 pixels of the DICOM whole-slide
        image folder ``slide``, each a POLYGON with its score of ``scores`` (N,) as the measurement ``<method> score``,
        written into ``out`` as ``<stem>_tiles.dcm``; ``synthetic_data``: the slide itself is SYNTHETIC. -> the name
        written, or None (recorded for :meth:`notes`)."""
        if self.hd is None:
            self.without_highdicom.append(str(slide))
            return None
        from pydicom.sr.codedict import codes

        base = _base_level(slide)
        corners = np.asarray(corners, dtype=np.float64).reshape(-1, 2)
        if base is None:
            why = "it holds no base level (a VL Whole Slide Microscopy VOLUME instance)"
        elif not (np.isfinite(corners).all() and np.isfinite(side)):
            why = "the tiles' level-0 positions are unknown (a bag in microns without mpp)"
        else:
            why = self._missing([base])
        if why:
            self.refused.append((str(slide), why))
            return None
        _identifiers_kept(base)
        offsets = np.array([[0.0, 0.0], [side, 0.0], [side, side], [0.0, side]])
        score = self.hd.ann.Measurements(name=self.hd.sr.CodedConcept(method, SCHEME, f"{method} score"),
                                         values=np.asarray(scores, dtype=np.float64).ravel(), unit=codes.UCUM.NoUnits)
        group = self.hd.ann.AnnotationGroup(
            number=1, uid=self.hd.UID(), label="tiles", annotated_property_category=codes.SCT.Tissue,
            annotated_property_type=self.hd.sr.CodedConcept("tile", SCHEME, "tissue tile"), graphic_type="POLYGON",
            graphic_data=[corner + offsets for corner in corners], algorithm_type="AUTOMATIC",
            algorithm_identification=self._algorithm(), measurements=[score],
            description=f"{method} score per tile of {self.model_id}"[:LONG_STRING])
        description = series_description(f"{method} tile scores", self.synthetic or synthetic_data)

        def build():
            dataset = self.hd.ann.MicroscopyBulkSimpleAnnotations(
                source_images=[base], annotation_coordinate_type="2D", annotation_groups=[group],
                series_description=description, content_label="MEDATTN", content_description=description,
                **self._equipment())
            dataset.FrameOfReferenceUID = base.FrameOfReferenceUID  # the slide's (highdicom sets it for 3D only)
            return dataset

        return self._save(build, slide, out, stem)


def _base_level(slide: Path):
    """The header of the base level of the DICOM whole-slide image ``slide`` (its folder, or one of its instances): its
    VOLUME instance of the largest total pixel matrix (the level-0 pixels of :class:`medattn.slides.dicom.DicomSlide`);
    None when it has none."""
    import pydicom
    from pydicom.errors import InvalidDicomError

    folder = Path(slide) if Path(slide).is_dir() else Path(slide).parent
    best, size = None, 0
    for path in sorted(p for p in folder.iterdir() if p.suffix.lower() == ".dcm"):  # as DicomSlide finds them
        try:
            ds = pydicom.dcmread(path, stop_before_pixels=True)
        except (InvalidDicomError, OSError):
            continue
        kind = list(ds.get("ImageType", []))
        pixels = int(ds.get("TotalPixelMatrixColumns", 0)) * int(ds.get("TotalPixelMatrixRows", 0))
        if ds.get("SOPClassUID") == WSI_STORAGE and len(kind) > 2 and kind[2] == "VOLUME" and pixels > size:
            best, size = ds, pixels
    return best
