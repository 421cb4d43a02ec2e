"""predict's results on DICOM inputs as DICOM (issue 51): a Comprehensive 3D SR holding a TID 1500 measurement report
of a classifier's probabilities (and its decisions), a survival model's risk (named a risk, never a probability) and a
segmentation's sizes, referencing the source study, series and instances (and the Segmentation); a 2D DICOM image
given to a slice segmenter gets a DICOM Segmentation. Each is read back by highdicom and by plain pydicom."""

from __future__ import annotations

import csv

import numpy as np
import pydicom
import pytest
from PIL import Image
from pydicom.dataset import FileDataset, FileMetaDataset
from pydicom.uid import DigitalXRayImageStorageForPresentation, ExplicitVRLittleEndian, generate_uid

from dicom_series_files import planes, stack, write_series
from engine_data import save_checkpoint
from medattn.cli import main
from medattn.data.base import TaskInfo

PATIENT = {"PatientID": "MA-0051", "PatientName": "Test^Phantom", "PatientSex": "F", "StudyID": "S51",
           "AccessionNumber": "ACC51", "StudyDate": "20250102", "ReferringPhysicianName": "Ref^Doctor"}
SR_CLASS = "1.2.840.10008.5.1.4.1.1.88.34"  # Comprehensive 3D SR


def write_dx(path, pixels: np.ndarray, spacing=(0.5, 0.4)):
    """``pixels`` (rows, columns) as one digital radiograph (DX, for presentation) of :data:`PATIENT`."""
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = DigitalXRayImageStorageForPresentation
    meta.MediaStorageSOPInstanceUID, meta.TransferSyntaxUID = generate_uid(), ExplicitVRLittleEndian
    ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
    ds.StudyInstanceUID, ds.SeriesInstanceUID = generate_uid(), generate_uid()
    for keyword, value in PATIENT.items():
        setattr(ds, keyword, value)
    ds.Modality, ds.Rows, ds.Columns = "DX", *pixels.shape
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    ds.PixelSpacing = list(spacing)
    ds.PixelData = np.ascontiguousarray(pixels, dtype=np.uint16).tobytes()
    ds.save_as(path, enforce_file_format=True)
    return ds


def numbers(dataset) -> list[tuple[str, float, str]]:
    """Every NUM content item of an SR, read with plain pydicom: (concept meaning, value, UCUM unit)."""
    found = []
    for item in dataset.get("ContentSequence", []):
        if item.ValueType == "NUM":
            value = item.MeasuredValueSequence[0]
            found.append((item.ConceptNameCodeSequence[0].CodeMeaning, float(value.NumericValue),
                          value.MeasurementUnitsCodeSequence[0].CodeValue))
        found += numbers(item)
    return found


def items(dataset, value_type: str) -> list:
    """Every content item of ``value_type`` of an SR, at any depth (plain pydicom)."""
    found = []
    for item in dataset.get("ContentSequence", []):
        found += [item] * (item.ValueType == value_type) + items(item, value_type)
    return found


def evidence(dataset) -> dict[str, set[str]]:
    """The SR's evidence: {SeriesInstanceUID: {SOPInstanceUID}} of its CurrentRequestedProcedureEvidenceSequence."""
    return {series.SeriesInstanceUID: {i.ReferencedSOPInstanceUID for i in series.ReferencedSOPSequence}
            for study in dataset.CurrentRequestedProcedureEvidenceSequence for series in study.ReferencedSeriesSequence}


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_a_classifier_on_a_dicom_image_writes_an_sr_of_its_probability_and_decision(tmp_path, capsys):
    hd = pytest.importorskip("highdicom")
    source = write_dx(tmp_path / "cxr.dcm", np.random.default_rng(0).integers(0, 4000, (20, 24)))
    task = TaskInfo("binary", "image2d", 1, (1, 16, 16), ["nodule"], synthetic=True)
    ck = save_checkpoint(tmp_path / "ck", "synthetic_cxr", ["model.name=resnet2d_tiny", "model.attention=null"], task,
                         mean=[0.5], std=[0.25])
    assert main(["predict", str(ck), str(tmp_path / "cxr.dcm"), "--out", str(tmp_path / "p.csv"),
                 "--threshold", "0.3"]) == 0
    path = tmp_path / "p_dicom" / "cxr_sr.dcm"
    assert f"wrote 1 DICOM SR measurement report object(s) referencing their DICOM source: {path}" \
        in capsys.readouterr().out
    (row,) = rows(tmp_path / "p.csv")
    # highdicom: a TID 1500 report, one image-level group with the probability and the decision at the threshold
    sr = hd.sr.srread(path)
    (group,) = sr.content.get_image_measurement_groups()
    (measurement,) = group.get_measurements()
    assert measurement.name.meaning == "probability of nodule" and measurement.unit.value == "1"
    assert measurement.value == pytest.approx(float(row["prob_nodule"]), abs=1e-6)
    (decision,) = group.get_qualitative_evaluations()
    assert decision.name.meaning == "nodule at threshold 0.3000"
    assert decision.value.meaning == ("Present" if float(row["prob_nodule"]) >= 0.3 else "Absent")
    # plain pydicom: the values, units and references; patient and study copied
    ds = pydicom.dcmread(path)
    assert ds.SOPClassUID == SR_CLASS and ds.Modality == "SR" and ds.CompletionFlag == "COMPLETE"
    assert ds.ContentSequence and ds.ConceptNameCodeSequence[0].CodeValue == "126000"  # Imaging Measurement Report
    assert numbers(ds) == [("probability of nodule", pytest.approx(float(row["prob_nodule"]), abs=1e-6), "1")]
    assert evidence(ds) == {source.SeriesInstanceUID: {source.SOPInstanceUID}}
    assert ds.CurrentRequestedProcedureEvidenceSequence[0].StudyInstanceUID == source.StudyInstanceUID
    (image,) = items(ds, "IMAGE")  # the group's source image
    assert image.ReferencedSOPSequence[0].ReferencedSOPInstanceUID == source.SOPInstanceUID
    for keyword in (*PATIENT, "StudyInstanceUID"):
        assert str(ds[keyword].value) == str(source[keyword].value), keyword
    assert ds.SeriesDescription == "medattn output SYNTHETIC: measurement report"
    assert ds.SeriesInstanceUID != source.SeriesInstanceUID and ds.SOPInstanceUID != source.SOPInstanceUID
    assert f"model_id={row['model_id']}" in {p.TextValue for p in items(ds, "TEXT")}  # the algorithm's parameters


def _predict_series(tmp_path, task: TaskInfo, capsys) -> dict:
    """``medattn predict`` of a tiny 3D model for ``task`` on the series in ``tmp_path/mri``, its SR into
    ``tmp_path/reports`` -> the CSV's one row."""
    ck = save_checkpoint(tmp_path / "ck", "synthetic_breast_mri", ["model.name=resnet3d_tiny", "model.attention=null"],
                         task, normalize="zscore")
    assert main(["predict", str(ck), str(tmp_path / "mri"), "--out", str(tmp_path / "r.csv"), "--dicom-dir",
                 str(tmp_path / "reports")]) == 0
    capsys.readouterr()
    (row,) = rows(tmp_path / "r.csv")
    return row


def test_a_survival_model_on_a_dicom_series_writes_an_sr_of_its_risk_never_a_probability(tmp_path, capsys):
    hd = pytest.importorskip("highdicom")
    uid = write_series(tmp_path / "mri", planes(8, 18, 20), stack((1, 0, 0, 0, 1, 0), 8))
    for file in (tmp_path / "mri").iterdir():
        ds = pydicom.dcmread(file)
        for keyword, value in PATIENT.items():
            setattr(ds, keyword, value)
        ds.save_as(file, enforce_file_format=True)
    row = _predict_series(tmp_path, TaskInfo("survival", "volume3d", 1, (1, 16, 16, 8), ["risk"], synthetic=False),
                          capsys)
    sr = hd.sr.srread(tmp_path / "reports" / "mri_sr.dcm")
    (group,) = sr.content.get_image_measurement_groups()
    (measurement,) = group.get_measurements()
    assert measurement.name.meaning == "log relative risk (higher = earlier event)"
    assert measurement.value == pytest.approx(float(row["risk"]), abs=1e-6)
    ds = pydicom.dcmread(tmp_path / "reports" / "mri_sr.dcm")
    assert [(name, unit) for name, _, unit in numbers(ds)] == [("log relative risk (higher = earlier event)", "1")]
    assert "probab" not in str(ds).lower()  # a risk is never called a probability
    headers = [pydicom.dcmread(f, stop_before_pixels=True) for f in (tmp_path / "mri").iterdir()]
    assert evidence(ds) == {uid: {h.SOPInstanceUID for h in headers}}  # every instance of the series
    assert ds.PatientID == PATIENT["PatientID"] and ds.StudyInstanceUID == headers[0].StudyInstanceUID
    assert ds.SeriesDescription == "medattn output: measurement report"


def test_a_slice_segmenter_given_a_2d_dicom_image_writes_its_segmentation_and_areas(tmp_path, capsys):
    hd = pytest.importorskip("highdicom")
    source = write_dx(tmp_path / "slice.dcm", np.random.default_rng(1).integers(0, 4000, (20, 24)))
    names = ["background", "liver", "lesion"]
    task = TaskInfo("segmentation", "image2d", 3, (1, 16, 16), names, synthetic=True)
    ck = save_checkpoint(tmp_path / "ck", "synthetic_mri_slices", ["model.name=vit_s8_seg_tiny",
                                                                    "model.attention=softmax"], task,
                         normalize="zscore", slice_axis=2)
    assert main(["predict", str(ck), str(tmp_path / "slice.dcm"), "--out", str(tmp_path / "s.csv")]) == 0
    printed = capsys.readouterr().out
    folder = tmp_path / "s_labels"
    assert f"wrote 1 DICOM Segmentation object(s) referencing their DICOM source: {folder / 'slice_seg.dcm'}" in printed
    assert sorted(p.name for p in folder.iterdir()) == ["slice_labels.png", "slice_seg.dcm", "slice_sr.dcm"]
    labels = np.asarray(Image.open(folder / "slice_labels.png"))
    assert labels.shape == (20, 24) and labels.any()
    seg = hd.seg.segread(folder / "slice_seg.dcm")
    pixels = seg.get_pixels_by_source_instance([source.SOPInstanceUID], combine_segments=True,
                                               assert_missing_frames_are_empty=True)
    np.testing.assert_array_equal(pixels[0], labels)  # the same map as the PNG, on the image's pixels
    assert [s.SegmentLabel for s in seg.SegmentSequence] == names[1:] and seg.PatientID == PATIENT["PatientID"]
    assert seg.ReferencedSeriesSequence[0].SeriesInstanceUID == source.SeriesInstanceUID
    # the report: each structure's area (pixels x PixelSpacing), referencing its segment of the Segmentation
    (row,) = rows(tmp_path / "s.csv")
    ds = pydicom.dcmread(folder / "slice_sr.dcm")
    assert numbers(ds) == [("Area", pytest.approx(int(row[f"voxels_{n}"]) * 0.5 * 0.4), "mm2") for n in names[1:]]
    assert evidence(ds) == {source.SeriesInstanceUID: {source.SOPInstanceUID}, seg.SeriesInstanceUID:
                            {seg.SOPInstanceUID}}
    segments = [(i.ReferencedSOPSequence[0].ReferencedSOPInstanceUID,
                 int(i.ReferencedSOPSequence[0].ReferencedSegmentNumber)) for i in items(ds, "IMAGE")]
    assert segments == [(seg.SOPInstanceUID, 1), (seg.SOPInstanceUID, 2)]


def test_a_multiclass_report_names_the_predicted_class_and_left_right_models_report_each_half(tmp_path, capsys):
    hd = pytest.importorskip("highdicom")
    write_dx(tmp_path / "a.dcm", np.random.default_rng(2).integers(0, 4000, (20, 24)))
    names = ["normal", "benign", "malignant"]
    task = TaskInfo("multiclass", "image2d", 3, (1, 16, 16), names)
    ck = save_checkpoint(tmp_path / "ck", "synthetic_cxr", ["model.name=resnet2d_tiny", "model.attention=null"], task,
                         mean=[0.5], std=[0.25])
    a = str(tmp_path / "a.dcm")
    assert main(["predict", str(ck), a, a, "--out", str(tmp_path / "m.csv")]) == 0  # one file twice: one report
    (group,) = hd.sr.srread(tmp_path / "m_dicom" / "a_sr.dcm").content.get_image_measurement_groups()
    row = rows(tmp_path / "m.csv")[0]
    assert [(m.name.meaning, m.value) for m in group.get_measurements()] == [
        (f"probability of {n}", pytest.approx(float(row[f"prob_{n}"]), abs=1e-6)) for n in names]
    (decision,) = group.get_qualitative_evaluations()
    assert (decision.name.meaning, decision.value.meaning) == ("predicted class", row["pred_label"])
    write_series(tmp_path / "breast", planes(8, 16, 24), stack((1, 0, 0, 0, 1, 0), 8))
    task = TaskInfo("binary", "volume3d", 1, (1, 16, 12, 8), ["cancer"])
    ck = save_checkpoint(tmp_path / "ck3", "synthetic_breast_mri", ["model.name=resnet3d_tiny",
                                                                     "model.attention=null"], task,
                         normalize="zscore", split_sides=True)
    assert main(["predict", str(ck), str(tmp_path / "breast"), "--out", str(tmp_path / "s.csv")]) == 0
    capsys.readouterr()
    sides = {row["side"]: float(row["prob_cancer"]) for row in rows(tmp_path / "s.csv")}
    assert sorted(sides) == ["left", "right"]
    groups = hd.sr.srread(tmp_path / "s_dicom" / "breast_sr.dcm").content.get_image_measurement_groups()
    assert {g.tracking_identifier: g.get_measurements()[0].value for g in groups} == {
        f"medattn classification ({side} half)": pytest.approx(p, abs=1e-6) for side, p in sides.items()}


def test_a_competing_risks_model_reports_each_causes_risk_by_name(tmp_path, capsys):
    """One measurement per cause, named for the cause (not the cause-1 risk as an unnamed 'risk')."""
    hd = pytest.importorskip("highdicom")
    write_series(tmp_path / "mri", planes(8, 18, 20), stack((1, 0, 0, 0, 1, 0), 8))
    task = TaskInfo("competing_risks", "volume3d", 2, (1, 16, 16, 8), ["cancer", "other"], synthetic=False)
    row = _predict_series(tmp_path, task, capsys)
    (group,) = hd.sr.srread(tmp_path / "reports" / "mri_sr.dcm").content.get_image_measurement_groups()
    found = {m.name.meaning: m.value for m in group.get_measurements()}
    assert found == {f"log cause-specific hazard ratio of {cause} (higher = earlier)":
                     pytest.approx(float(row[f"risk_{cause}"]), abs=1e-6) for cause in ("cancer", "other")}
