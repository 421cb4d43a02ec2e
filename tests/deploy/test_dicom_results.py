"""Results written back as DICOM (issue 37), read back with highdicom, the independent reader: predict's DICOM
Segmentation of a DICOM series equals its NIfTI label map voxel for voxel on the series' grid and references the
series; explain's Microscopy Bulk Simple Annotations of a DICOM whole-slide image hold each tile's polygon and score as
the tile CSV gives them; without highdicom both commands still succeed and say how to get it."""

from __future__ import annotations

import csv
import sys

import nibabel as nib
import numpy as np
import pydicom
import pytest
from pydicom.dataset import FileDataset, FileMetaDataset
from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

from engine_data import save_checkpoint
from medattn.cli import main
from medattn.data.base import TaskInfo

#: Patient and study of the source: what every result must copy.
PATIENT = {"PatientID": "MA-0042", "PatientName": "Test^Phantom", "PatientSex": "O", "StudyID": "S17",
           "AccessionNumber": "ACC123", "StudyDate": "20240131", "StudyTime": "101500",
           "ReferringPhysicianName": "Ref^Doctor"}  # no PatientBirthDate: it stays empty, never made up
CLASSES = ["background", "vertebra", "disc"]
SLIDE = ["--patch-um", "64", "--patch-px", "32", "--thumbnail-px", "256", "--no-progress"]


def write_ct_series(folder, volume: np.ndarray, spacing=(0.7, 0.8), thickness=2.5):
    """``volume`` (slices, rows, columns) as a CT series the way a scanner exports one: one file per slice named
    ``1-NN.dcm`` (numbered from the top, so the files' order is the reverse of the slices' along the normal), one
    study, series and frame of reference, the patient and study of :data:`PATIENT`, Hounsfield units by
    RescaleSlope/Intercept. -> {SOPInstanceUID of slice k (k along the normal)}."""
    folder.mkdir(parents=True)
    study, series, frame = generate_uid(), generate_uid(), generate_uid()
    uids = []
    for k, plane in enumerate(volume):
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID = CTImageStorage, generate_uid()
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        number = len(volume) - k
        ds = FileDataset(str(folder / f"1-{number:02d}.dcm"), {}, file_meta=meta, preamble=b"\0" * 128)
        ds.SOPClassUID, ds.SOPInstanceUID = CTImageStorage, meta.MediaStorageSOPInstanceUID
        ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = study, series, frame
        for keyword, value in PATIENT.items():
            setattr(ds, keyword, value)
        ds.Modality, ds.SeriesNumber, ds.InstanceNumber, ds.PositionReferenceIndicator = "CT", 3, number, ""
        ds.Manufacturer, ds.SeriesDescription, ds.ImageType = "Phantom", "AXIAL 2.5", ["ORIGINAL", "PRIMARY", "AXIAL"]
        ds.Rows, ds.Columns = plane.shape
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
        ds.RescaleSlope, ds.RescaleIntercept, ds.RescaleType = 1, -1024, "HU"
        ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
        ds.ImagePositionPatient = [-8.0, -6.0, -100.0 + thickness * k]
        ds.PixelSpacing, ds.SliceThickness = list(spacing), thickness
        ds.PixelData = np.ascontiguousarray(plane + 1024, dtype=np.uint16).tobytes()
        ds.save_as(folder / f"1-{number:02d}.dcm", enforce_file_format=True)
        uids.append(ds.SOPInstanceUID)
    return uids


@pytest.fixture(scope="module")
def series_and_model(tmp_path_factory):
    """An 8-slice CT series of 18 x 20 pixels (the model segments it by windows of 16 x 16 x 8) and an untrained 3-class
    U-Net on SYNTHETIC data, whose label map of the series holds every class."""
    root = tmp_path_factory.mktemp("seg")
    rng = np.random.default_rng(0)
    volume = rng.normal(0, 200, size=(8, 18, 20))
    volume[:, 5:12, 6:14] += 600  # something bright for the map to follow
    uids = write_ct_series(root / "series", volume)
    task = TaskInfo("segmentation", "volume3d", 3, (1, 16, 16, 8), CLASSES, synthetic=True)
    ck = save_checkpoint(root / "ck", "synthetic_vertebrae", ["model.name=unet3d"], task, normalize="zscore")
    return root, root / "series", uids, ck


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_predict_writes_a_dicom_seg_equal_to_the_label_map_and_referencing_the_series(series_and_model, capsys):
    hd = pytest.importorskip("highdicom")
    root, series, uids, ck = series_and_model
    segs = []
    for run in ("a", "b"):
        assert main(["predict", str(ck), str(series), "--out", str(root / f"{run}.csv")]) == 0
        printed = capsys.readouterr().out
        seg_path = root / f"{run}_labels" / "series_seg.dcm"
        assert f"wrote 1 DICOM Segmentation object(s) referencing their DICOM source: {seg_path}" in printed
        (row,) = _rows(root / f"{run}.csv")
        segs.append((hd.seg.segread(seg_path), np.asarray(nib.load(row["label_map"]).dataobj)))
    seg, labels = segs[0]
    assert labels.shape == (20, 18, 8) and set(np.unique(labels)) == {0, 1, 2}  # (columns, rows, slices)
    assert "segmented 1 volume(s) larger than the model's 16 x 16 x 8 input whole" in printed  # every voxel (issue 49)
    # voxel for voxel: frame k of the SEG (the source instance at slice k) is slice k of the NIfTI, rows by columns
    pixels = seg.get_pixels_by_source_instance(uids, combine_segments=True, assert_missing_frames_are_empty=True)
    np.testing.assert_array_equal(pixels, labels.transpose(2, 1, 0))
    # the source: frame of reference, series, instances; patient and study copied, nothing made up
    source = pydicom.dcmread(series / "1-08.dcm")
    assert seg.SOPClassUID == "1.2.840.10008.5.1.4.1.1.66.4" and seg.SegmentationType == "BINARY"
    assert seg.FrameOfReferenceUID == source.FrameOfReferenceUID
    (referenced,) = seg.ReferencedSeriesSequence
    assert referenced.SeriesInstanceUID == source.SeriesInstanceUID
    assert sorted(i.ReferencedSOPInstanceUID for i in referenced.ReferencedInstanceSequence) == sorted(uids)
    assert {item.ReferencedSOPInstanceUID for frame in seg.PerFrameFunctionalGroupsSequence
            for item in frame.DerivationImageSequence[0].SourceImageSequence} <= set(uids)
    for keyword in (*PATIENT, "StudyInstanceUID"):
        assert str(seg[keyword].value) == str(source[keyword].value), keyword
    assert "PatientBirthDate" not in source and not seg.get("PatientBirthDate")
    # the segments: the model's foreground classes, the algorithm medattn with its version and the model's id
    assert [s.SegmentLabel for s in seg.SegmentSequence] == CLASSES[1:]
    algorithm = seg.SegmentSequence[0].SegmentationAlgorithmIdentificationSequence[0]
    assert algorithm.AlgorithmName == "medattn" and algorithm.AlgorithmVersion == "0.1.0"
    assert f"model_id={seg.ManufacturerModelName}" in algorithm.AlgorithmParameters
    assert seg.SeriesDescription == "medattn output SYNTHETIC: segmentation"
    # new UIDs, unique across runs
    other = segs[1][0]
    np.testing.assert_array_equal(segs[1][1], labels)
    new = {seg.SOPInstanceUID, seg.SeriesInstanceUID, other.SOPInstanceUID, other.SeriesInstanceUID}
    assert len(new) == 4 and not new & {source.SOPInstanceUID, source.SeriesInstanceUID, *uids}


def test_the_segmentation_report_gives_each_structures_volume_and_references_its_segment(series_and_model, capsys):
    """Issue 51: beside the Segmentation, a TID 1500 SR: one volumetric group per class, its Volume in mm3 as the CSV
    gives it, referencing that segment of the Segmentation; the evidence lists the series and the Segmentation."""
    hd = pytest.importorskip("highdicom")
    from test_dicom_report import evidence, items, numbers

    root, series, uids, ck = series_and_model
    assert main(["predict", str(ck), str(series), "--out", str(root / "report.csv")]) == 0
    report = root / "report_labels" / "series_sr.dcm"
    assert f"wrote 1 DICOM SR measurement report object(s) referencing their DICOM source: {report}" \
        in capsys.readouterr().out
    (row,) = _rows(root / "report.csv")
    seg = hd.seg.segread(root / "report_labels" / "series_seg.dcm")
    sr = hd.sr.srread(report)
    groups = sr.content.get_volumetric_roi_measurement_groups()
    assert [g.finding_type.meaning for g in groups] == CLASSES[1:]
    for group, name in zip(groups, CLASSES[1:]):
        (volume,) = group.get_measurements()
        assert volume.name.meaning == "Volume" and volume.unit.value == "mm3"
        assert volume.value == pytest.approx(float(row[f"volume_mm3_{name}"]), rel=1e-6)
    ds = pydicom.dcmread(report)  # plain pydicom: values, units, references
    assert numbers(ds) == [("Volume", pytest.approx(float(row[f"volume_mm3_{n}"]), rel=1e-6), "mm3")
                           for n in CLASSES[1:]]
    segments = [i.ReferencedSOPSequence[0] for i in items(ds, "IMAGE")]
    assert [(s.ReferencedSOPInstanceUID, int(s.ReferencedSegmentNumber)) for s in segments] == [
        (seg.SOPInstanceUID, 1), (seg.SOPInstanceUID, 2)]
    source = pydicom.dcmread(series / "1-08.dcm")
    assert evidence(ds) == {source.SeriesInstanceUID: set(uids), seg.SeriesInstanceUID: {seg.SOPInstanceUID}}
    for keyword in (*PATIENT, "StudyInstanceUID"):
        assert str(ds[keyword].value) == str(source[keyword].value), keyword


@pytest.fixture(scope="module")
def dicom_slide_bag(tmp_path_factory):
    """A DICOM whole-slide image (the synthetic TIFF pyramid as a folder of VL WSI instances, patient and study set),
    its feature bag from `medattn wsi extract` and an untrained bag model on SYNTHETIC features."""
    pytest.importorskip("openslide")
    pytest.importorskip("wsidicom")
    tifffile = pytest.importorskip("tifffile")
    from dicom_wsi import write_dicom_slide
    from medattn.generators.slides import write_synthetic_cohort

    root = tmp_path_factory.mktemp("wsi")
    (tiff,) = write_synthetic_cohort(root / "plain", count=1, seed=3, shape=(384, 512))
    with tifffile.TiffFile(tiff) as source:
        levels = [level.asarray() for level in source.series[0].levels]
    slide = write_dicom_slide(root / "dicom" / "slide_000", levels, mpp=1.0, tile=64)
    for instance in sorted(slide.iterdir()):  # the scanner's patient and study on every instance
        ds = pydicom.dcmread(instance)
        for keyword, value in PATIENT.items():
            setattr(ds, keyword, value)
        ds.save_as(instance, enforce_file_format=True)
    assert main(["wsi", "extract", str(slide), "--out", str(root / "features"), "--extractor", "descriptor",
                 *SLIDE]) == 0
    task = TaskInfo("binary", "bag", 1, (32,), ["tumour"], synthetic=True)
    ck = save_checkpoint(root / "ck", "synthetic_wsi", ["model.name=vitwsi_tiny", "model.attention=seqnorm"], task)
    return root, slide, root / "features" / "slide_000.h5", ck


def test_explain_writes_bulk_annotations_of_the_tile_scores_on_a_dicom_slide(dicom_slide_bag, capsys):
    hd = pytest.importorskip("highdicom")
    import h5py

    root, slide, bag, ck = dicom_slide_bag
    out = root / "maps"
    assert main(["explain", str(ck), str(bag), "--slides", str(slide.parent), "--out", str(out)]) == 0
    assert f"wrote 1 DICOM Microscopy Bulk Simple Annotations object(s) referencing their DICOM source: " \
           f"{out / 'slide_000_tiles.dcm'}" in capsys.readouterr().out
    assert (out / "slide_000.png").is_file()  # the map drawn on the DICOM slide's thumbnail
    ann = hd.ann.annread(out / "slide_000_tiles.dcm")
    (group,) = ann.get_annotation_groups()
    assert group.graphic_type == hd.ann.GraphicTypeValues.POLYGON and ann.AnnotationCoordinateType == "2D"
    polygons = group.get_graphic_data(coordinate_type="2D")
    names, values, units = group.get_measurements()
    (method,) = {row["method"] for row in _rows(out / "summary.csv")}
    assert [n.CodeMeaning for n in names] == [f"{method} score"] and units[0].CodeValue == "1"
    rows = _rows(out / "slide_000_tiles.csv")
    with h5py.File(bag) as f:
        side = float(f.attrs["patch_size_level0"])
        assert len(rows) == len(f["coords"]) == len(polygons) > 5
    for row, polygon, value in zip(rows, polygons, values[:, 0]):
        x, y = float(row["x_level0_px"]), float(row["y_level0_px"])
        np.testing.assert_array_equal(polygon, [[x, y], [x + side, y], [x + side, y + side], [x, y + side]])
        assert value == pytest.approx(float(row["score"]), rel=1e-6, abs=1e-12)
    # the base level of the slide: its series, instance and frame of reference; patient and study copied
    base = pydicom.dcmread(slide / "level0.dcm", stop_before_pixels=True)
    assert ann.FrameOfReferenceUID == base.FrameOfReferenceUID
    (referenced,) = ann.ReferencedSeriesSequence
    assert referenced.SeriesInstanceUID == base.SeriesInstanceUID
    assert [i.ReferencedSOPInstanceUID for i in referenced.ReferencedInstanceSequence] == [base.SOPInstanceUID]
    assert ann.ReferencedImageSequence[0].ReferencedSOPInstanceUID == base.SOPInstanceUID
    for keyword in (*PATIENT, "StudyInstanceUID"):
        assert str(ann[keyword].value) == str(base[keyword].value), keyword
    assert ann.SeriesDescription == f"medattn output SYNTHETIC: {method} tile scores"
    assert ann.SeriesInstanceUID not in {base.SeriesInstanceUID} and ann.SOPInstanceUID != base.SOPInstanceUID


def test_without_highdicom_the_commands_write_what_they_did_and_say_how_to_get_dicom(series_and_model,
                                                                                      dicom_slide_bag, monkeypatch,
                                                                                      capsys):
    for name in [n for n in sys.modules if n == "highdicom" or n.startswith("highdicom.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "highdicom", None)  # import highdicom now fails as if it were not installed
    root, series, _, ck = series_and_model
    capsys.readouterr()
    assert main(["predict", str(ck), str(series), "--out", str(root / "plain.csv")]) == 0
    printed = capsys.readouterr().out
    assert "DICOM Segmentation not written for 1 DICOM input(s): it needs highdicom (pip install " \
           "'medattn[dicom]')" in printed
    assert "DICOM SR measurement report not written for 1 DICOM input(s): it needs highdicom" in printed
    assert sorted(p.name for p in (root / "plain_labels").iterdir()) == ["series_labels.nii.gz"]
    root, slide, bag, ck = dicom_slide_bag
    assert main(["explain", str(ck), str(bag), "--slides", str(slide.parent), "--out", str(root / "no_dicom")]) == 0
    printed = capsys.readouterr().out
    assert "DICOM Microscopy Bulk Simple Annotations not written for 1 DICOM input(s): it needs highdicom (pip " \
           "install 'medattn[dicom]')" in printed
    assert sorted(p.name for p in (root / "no_dicom").iterdir()) == [
        "slide_000.png", "slide_000_tiles.csv", "slide_000_tiles.geojson", "slide_000_tiles.h5", "summary.csv"]


def test_a_series_lacking_a_uid_gets_no_segmentation_and_missing_identifiers_stay_empty(tmp_path):
    """Nothing is made up: a series without a FrameOfReferenceUID gets no Segmentation (one line says why); one
    without a PatientID or PatientName gets a Segmentation whose PatientID and PatientName are empty."""
    hd = pytest.importorskip("highdicom")
    from medattn.data.readers.volumes import read_dicom_series
    from medattn.outputs import OutputFolder
    from medattn.runtime.dicom_results import SegmentationWriter

    uids = write_ct_series(tmp_path / "anonymous", np.zeros((3, 4, 5)))
    for path in sorted((tmp_path / "anonymous").iterdir()):
        ds = pydicom.dcmread(path)
        del ds.PatientID, ds.PatientName
        ds.save_as(path, enforce_file_format=True)
    write_ct_series(tmp_path / "no_frame", np.zeros((3, 4, 5)))
    for path in sorted((tmp_path / "no_frame").iterdir()):
        ds = pydicom.dcmread(path)
        del ds.FrameOfReferenceUID
        ds.save_as(path, enforce_file_format=True)
    writer = SegmentationWriter("run/unet3d/epoch1", "ab" * 32, synthetic=False)
    out = OutputFolder(tmp_path / "out")
    labels = np.zeros((5, 4, 3), np.uint8)
    labels[1:3, 1:3, 1] = 2
    for name in ("anonymous", "no_frame"):
        _, affine = read_dicom_series(tmp_path / name)
        writer.write(labels, affine, tmp_path / name, CLASSES, out, name)
    assert writer.notes() == [
        f"wrote 1 DICOM Segmentation object(s) referencing their DICOM source: {tmp_path / 'out/anonymous_seg.dcm'}",
        f"DICOM Segmentation not written for {tmp_path / 'no_frame'}: the source has no FrameOfReferenceUID (it is "
        f"copied, never made up)"]
    seg = hd.seg.segread(tmp_path / "out/anonymous_seg.dcm")
    assert seg.PatientID == "" and str(seg.PatientName) == "" and seg.AccessionNumber == PATIENT["AccessionNumber"]
    assert seg.SeriesDescription == "medattn output: segmentation"
    pixels = seg.get_pixels_by_source_instance(uids, combine_segments=True, assert_missing_frames_are_empty=True)
    np.testing.assert_array_equal(pixels, labels.transpose(2, 1, 0))
