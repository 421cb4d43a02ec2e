"""OME-TIFF slides (pyramid in SubIFDs, which OpenSlide does not read) through tifffile behind OpenSlide's interface:
the same regions, thumbnail, microns per pixel and kept tiles as the same pyramid written as a plain tiled TIFF."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("openslide")
tifffile = pytest.importorskip("tifffile")

from medattn.cli import main  # noqa: E402
from medattn.generators.slides import write_synthetic_cohort  # noqa: E402
from medattn.slides.reader import open_slide, slide_mpp, thumbnail  # noqa: E402
from medattn.slides.tiling import read_tiles  # noqa: E402

SMALL = ["--patch-um", "64", "--patch-px", "32", "--thumbnail-px", "256", "--no-progress"]


def as_ome_tiff(tiff, path, mpp: float = 1.0, tile: int = 64):
    """The pyramid of the plain TIFF ``tiff`` rewritten as an OME-TIFF: level 0 with its levels in SubIFDs."""
    with tifffile.TiffFile(tiff) as source:
        levels = [level.asarray() for level in source.series[0].levels]
    with tifffile.TiffWriter(path, bigtiff=True, ome=True) as out:
        out.write(levels[0], subifds=len(levels) - 1, tile=(tile, tile), photometric="rgb", compression="zlib",
                  metadata={"axes": "YXS", "PhysicalSizeX": mpp, "PhysicalSizeY": mpp})
        for level in levels[1:]:
            out.write(level, subfiletype=1, tile=(tile, tile), photometric="rgb", compression="zlib")
    return levels


@pytest.fixture
def slides(tmp_path):
    plain, ome = tmp_path / "plain", tmp_path / "ome"
    ome.mkdir()
    (tiff,) = write_synthetic_cohort(plain, count=1, seed=3, shape=(384, 512))
    as_ome_tiff(tiff, ome / "slide_000.ome.tif")
    return tiff, ome / "slide_000.ome.tif"


def test_regions_levels_thumbnail_and_mpp_equal_openslide_on_the_same_pyramid(slides):
    tiff, ome = slides
    a, b = open_slide(tiff), open_slide(ome)
    assert type(b).__name__ == "OmeTiffSlide"
    assert b.level_dimensions == a.level_dimensions and b.level_downsamples == pytest.approx(a.level_downsamples)
    assert slide_mpp(b, ome) == 1.0
    for level, (x, y, w, h) in [(0, (0, 0, 100, 70)), (0, (130, 250, 64, 64)), (1, (96, 40, 50, 30)),
                                (0, (480, 360, 64, 64))]:  # the last runs past the image: transparent there
        expected = np.asarray(a.read_region((x, y), level, (w, h)))
        actual = np.asarray(b.read_region((x, y), level, (w, h)))
        visible = expected[..., 3] > 0
        assert (actual[..., 3] > 0).tolist() == visible.tolist()
        assert np.array_equal(actual[visible], expected[visible])
    assert np.abs(thumbnail(b, 128)[0].astype(int) - thumbnail(a, 128)[0].astype(int)).mean() < 2.0


def test_tiling_an_ome_tiff_keeps_the_tiles_the_plain_tiff_keeps(slides, tmp_path):
    tiff, ome = slides
    assert main(["wsi", "tile", str(tiff), "--out", str(tmp_path / "t_plain"), *SMALL]) == 0
    assert main(["wsi", "tile", str(ome), "--out", str(tmp_path / "t_ome"), *SMALL]) == 0
    kept_plain, _ = read_tiles(tmp_path / "t_plain", tiff)
    kept_ome, _ = read_tiles(tmp_path / "t_ome", ome)
    assert len(kept_plain) > 5 and np.array_equal(kept_plain, kept_ome)
