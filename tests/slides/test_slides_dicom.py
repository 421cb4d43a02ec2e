"""DICOM whole-slide images (a folder of VL Whole Slide Microscopy instances, one per level) through wsidicom behind
OpenSlide's interface: the same regions, levels, microns per pixel and kept tiles as the same pyramid in a TIFF."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("openslide")
pytest.importorskip("wsidicom")
tifffile = pytest.importorskip("tifffile")

from dicom_wsi import write_dicom_slide  # noqa: E402
from medattn.cli import main  # noqa: E402
from medattn.errors import UserError  # noqa: E402
from medattn.generators.slides import write_synthetic_cohort  # noqa: E402
from medattn.slides.reader import list_slides, open_slide, slide_mpp, thumbnail  # noqa: E402
from medattn.slides.tiling import read_tiles  # noqa: E402

SMALL = ["--patch-um", "64", "--patch-px", "32", "--thumbnail-px", "256", "--no-progress"]


@pytest.fixture
def slides(tmp_path):
    """A synthetic TIFF slide and the same pyramid as a DICOM folder (uncompressed frames of 64 px)."""
    (tiff,) = write_synthetic_cohort(tmp_path / "plain", count=1, seed=3, shape=(384, 512))
    with tifffile.TiffFile(tiff) as source:
        levels = [level.asarray() for level in source.series[0].levels]
    return tiff, write_dicom_slide(tmp_path / "dicom" / "slide_000", levels, mpp=1.0, tile=64), levels


def test_regions_levels_thumbnail_and_mpp_equal_openslide_on_the_same_pyramid(slides):
    tiff, folder, _ = slides
    a = open_slide(tiff)
    for given in (folder, folder / "level1.dcm"):  # the folder, or any instance of it
        b = open_slide(given)
        assert type(b).__name__ == "DicomSlide"
        assert b.level_dimensions == a.level_dimensions
        assert b.level_downsamples == pytest.approx(a.level_downsamples)
        assert slide_mpp(b, folder) == 1.0
        for level, (x, y, w, h) in [(0, (0, 0, 100, 70)), (0, (130, 250, 64, 64)), (1, (96, 40, 50, 30)),
                                    (0, (480, 360, 64, 64))]:  # the last runs past the image: transparent there
            expected = np.asarray(a.read_region((x, y), level, (w, h)))
            actual = np.asarray(b.read_region((x, y), level, (w, h)))
            visible = expected[..., 3] > 0
            assert (actual[..., 3] > 0).tolist() == visible.tolist()
            assert np.array_equal(actual[visible], expected[visible])
        assert np.abs(thumbnail(b, 128)[0].astype(int) - thumbnail(a, 128)[0].astype(int)).mean() < 2.0


def test_jpeg_frames_decode_close_to_the_source(slides, tmp_path):
    _, _, levels = slides
    slide = open_slide(write_dicom_slide(tmp_path / "jpeg", levels, mpp=1.0, tile=64, jpeg=True))
    region = np.asarray(slide.read_region((64, 64), 0, (200, 150)))[..., :3].astype(int)
    assert np.abs(region - levels[0][64:214, 64:264]).mean() < 4.0  # JPEG at quality 95, 4:2:0


def test_tiling_a_dicom_folder_keeps_the_tiles_the_tiff_keeps(slides, tmp_path):
    tiff, folder, _ = slides
    assert main(["wsi", "tile", str(tiff), "--out", str(tmp_path / "t_plain"), *SMALL]) == 0
    assert main(["wsi", "tile", str(folder.parent), "--out", str(tmp_path / "t_dicom"), *SMALL]) == 0
    kept_plain, _ = read_tiles(tmp_path / "t_plain", tiff)
    kept_dicom, _ = read_tiles(tmp_path / "t_dicom", folder)
    assert len(kept_plain) > 5 and np.array_equal(kept_plain, kept_dicom)


def test_listing_finds_dicom_folders_as_slides_and_refuses_instances_among_other_slides(slides, tmp_path):
    tiff, folder, levels = slides
    second = write_dicom_slide(folder.parent / "slide_001", levels[1:], mpp=4.0, tile=64)
    assert list_slides([folder.parent]) == [folder, second]  # a folder of DICOM slide folders
    assert list_slides([folder]) == [folder]  # one slide's folder
    assert list_slides([folder / "level0.dcm"]) == [folder]  # an instance stands for its slide
    (tiff.parent / "stray.dcm").write_bytes((folder / "level0.dcm").read_bytes())
    with pytest.raises(UserError, match="folder of their own"):
        list_slides([tiff.parent])
    (tmp_path / "empty_series").mkdir()
    (tmp_path / "empty_series" / "x.dcm").write_bytes(b"not dicom")
    with pytest.raises(UserError, match="wsidicom"):
        open_slide(tmp_path / "empty_series")
