"""`medattn wsi synthetic --format tiff|dicom|ome-tiff` (issue 51): every slide format the docs describe can be tried
from the command line. Each written format is read back by medattn's own slide reader (the same pyramid, microns per
pixel and pixels as the TIFF, marked SYNTHETIC) and by `wsi extract` (the same kept tiles, bags marked SYNTHETIC and
named as the slide table lists them)."""

from __future__ import annotations

import csv

import numpy as np
import pytest

pytest.importorskip("openslide")
pytest.importorskip("wsidicom")
pytest.importorskip("tifffile")

from medattn.cli import main  # noqa: E402
from medattn.generators.slides import load_truth  # noqa: E402
from medattn.slides import bag_is_synthetic, is_synthetic, list_slides  # noqa: E402
from medattn.slides.reader import open_slide, slide_mpp  # noqa: E402

SMALL = ["--patch-um", "128", "--patch-px", "32", "--thumbnail-px", "256", "--no-progress"]
FORMATS = {"tiff": ("TiffSlide", "slide_000.tif"), "dicom": ("DicomSlide", "slide_000"),
           "ome-tiff": ("OmeTiffSlide", "slide_000.ome.tif")}


@pytest.fixture(scope="module")
def cohorts(tmp_path_factory):
    """Two SYNTHETIC slides (one with a tumour) in each format, of one seed, and their bags from `wsi extract`."""
    root = tmp_path_factory.mktemp("formats")
    for name in FORMATS:
        assert main(["wsi", "synthetic", str(root / name), "--count", "2", "--format", name]) == 0
        assert main(["wsi", "extract", str(root / name), "--out", str(root / f"{name}_bags"), *SMALL]) == 0
    return root


def _table(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_each_format_is_read_back_as_the_same_synthetic_pyramid(cohorts):
    tiff = open_slide(cohorts / "tiff" / "slide_001.tif")
    for name, (reader, first) in FORMATS.items():
        slides = list_slides([cohorts / name])
        assert [s.name for s in slides] == [first, first.replace("000", "001")]
        slide = open_slide(slides[1])
        assert type(slide).__name__ == reader or (name == "tiff" and type(slide).__name__ == "OpenSlide")
        assert is_synthetic(slide), name  # the mark in the format's own description
        assert slide.level_dimensions == tiff.level_dimensions == ((2048, 1536), (512, 384), (128, 96))
        assert slide_mpp(slide, slides[1]) == pytest.approx(1.0)
        expected = np.asarray(tiff.read_region((300, 500), 0, (200, 150)))[..., :3].astype(int)
        actual = np.asarray(slide.read_region((300, 500), 0, (200, 150)))[..., :3].astype(int)
        if name == "dicom":  # JPEG baseline frames, as scanners store them: close, not equal
            assert np.abs(actual - expected).mean() < 3.0, name
        else:
            np.testing.assert_array_equal(actual, expected)
        truth = load_truth(slides[1])
        assert truth["tumour"].any() and truth["tissue"].shape == (1536, 2048)


def test_each_format_extracts_to_the_tiffs_tiles_with_bags_the_slide_table_names(cohorts):
    import h5py

    with h5py.File(cohorts / "tiff_bags" / "slide_000.h5") as f:
        coords = f["coords"][:]
    assert len(coords) > 5
    for name in FORMATS:
        rows = _table(cohorts / name / "slide_table.csv")
        assert [row["PATIENT"] for row in rows] == ["patient_000", "patient_001"]
        assert [row["TUMOUR"] for row in _table(cohorts / name / "clinical_table.csv")] == ["0", "1"]
        for row in rows:
            bag = cohorts / f"{name}_bags" / f"{row['FILENAME']}.h5"  # as the wsi_bags data kind finds it
            assert bag_is_synthetic(bag), name
        with h5py.File(cohorts / f"{name}_bags" / f"{rows[0]['FILENAME']}.h5") as f:
            np.testing.assert_array_equal(f["coords"][:], coords, err_msg=name)  # the same kept tiles


def test_a_dicom_slide_of_the_cohort_is_a_study_of_its_patient_and_is_not_written_over(cohorts, capsys):
    import pydicom

    folder = cohorts / "dicom" / "slide_001"
    headers = [pydicom.dcmread(p, stop_before_pixels=True) for p in sorted(folder.iterdir())]
    assert [h.ImageType[2] for h in headers] == ["VOLUME"] * 3
    assert {h.SOPClassUID for h in headers} == {"1.2.840.10008.5.1.4.1.1.77.1.6"}
    assert len({h.StudyInstanceUID for h in headers}) == len({h.SeriesInstanceUID for h in headers}) == 1
    assert {(h.PatientID, str(h.PatientName)) for h in headers} == {("patient_001", "SYNTHETIC^patient_001")}
    assert headers[0].ImageComments.startswith("SYNTHETIC slide written by medattn")
    before = folder.joinpath("level0.dcm").stat().st_mtime_ns
    assert main(["wsi", "synthetic", str(cohorts / "dicom"), "--count", "2", "--format", "dicom"]) == 2
    assert f"{cohorts / 'dicom' / 'slide_000'} exists and this command did not write it" in capsys.readouterr().err
    assert folder.joinpath("level0.dcm").stat().st_mtime_ns == before


def test_explain_annotates_a_synthetic_dicom_slide_of_the_cohort(cohorts, capsys):
    """The DICOM slides take explain's DICOM bulk annotations of the tile scores, copying their patient."""
    hd = pytest.importorskip("highdicom")
    from engine_data import save_checkpoint
    from medattn.data.base import TaskInfo

    task = TaskInfo("binary", "bag", 1, (32,), ["tumour"], synthetic=True)
    ck = save_checkpoint(cohorts / "ck", "synthetic_wsi", ["model.name=vitwsi_tiny", "model.attention=seqnorm"], task)
    out = cohorts / "maps"
    assert main(["explain", str(ck), str(cohorts / "dicom_bags" / "slide_001.h5"), "--slides", str(cohorts / "dicom"),
                 "--out", str(out)]) == 0
    assert "1 of 1 bag map(s) drawn on their slide" in capsys.readouterr().out
    annotations = hd.ann.annread(out / "slide_001_tiles.dcm")
    assert annotations.PatientID == "patient_001" and str(annotations.PatientName) == "SYNTHETIC^patient_001"
    assert annotations.SeriesDescription.startswith("medattn output SYNTHETIC")
