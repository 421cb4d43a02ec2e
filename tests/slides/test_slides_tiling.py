"""Whole-slide reading and tiling on SYNTHETIC pyramidal TIFFs (medattn.slides): mpp, tissue mask, grid,
white and blurry patches, coordinates, the tile command and its one-line errors."""

import csv
import json

import numpy as np
import pytest

pytest.importorskip("openslide")
pytest.importorskip("tifffile")

from medattn.cli import main  # noqa: E402
from medattn.errors import UserError  # noqa: E402
from medattn.generators.slides import write_synthetic_slide  # noqa: E402
from medattn.slides import (  # noqa: E402
    TileSettings,
    best_level,
    candidate_grid,
    list_slides,
    open_slide,
    otsu_threshold,
    patch_geometry,
    sharpness,
    slide_mpp,
    thumbnail,
    tile_slide,
    tissue_mask,
    white_fraction,
    write_tiles,
)
from medattn.slides.tiling import COLOURS  # noqa: E402

SHAPE = (768, 1024)
SMALL = TileSettings(patch_um=64, patch_px=32, thumbnail_px=512)


@pytest.fixture(scope="module")
def slide(tmp_path_factory):
    return write_synthetic_slide(tmp_path_factory.mktemp("slides") / "synthetic.tif", shape=SHAPE)


@pytest.fixture(scope="module")
def tiles(slide):
    return tile_slide(slide.path, SMALL)


def _fraction(mask: np.ndarray, x: int, y: int, size: int) -> float:
    return float(mask[y:y + size, x:x + size].mean())


def test_openslide_reads_the_synthetic_pyramid_and_its_mpp(slide, tmp_path):
    s = open_slide(slide.path)
    assert s.properties["openslide.vendor"] == "generic-tiff"
    assert s.dimensions == (SHAPE[1], SHAPE[0]) and s.level_count == 3
    assert s.level_downsamples == pytest.approx((1, 4, 16), rel=1e-3)
    assert slide_mpp(s, slide.path) == pytest.approx(1.0)
    other = write_synthetic_slide(tmp_path / "half.tif", shape=(256, 256), mpp=0.5, levels=1)
    assert slide_mpp(open_slide(other.path), other.path) == pytest.approx(0.5)


def test_mpp_override_and_missing_mpp(tmp_path):
    bare = write_synthetic_slide(tmp_path / "bare.tif", shape=(256, 256), mpp=None, levels=1).path
    s = open_slide(bare)
    with pytest.raises(UserError, match=r"bare\.tif.*--mpp"):
        slide_mpp(s, bare)
    assert slide_mpp(s, bare, override=2.0) == 2.0
    assert patch_geometry(s, 2.0, 64, 32).size0 == 32  # 64 um at 2 um/px
    with pytest.raises(UserError, match="--mpp"):
        slide_mpp(s, bare, override=-1.0)


@pytest.mark.parametrize("content", [b"", b"not a slide at all" * 100])
def test_unreadable_files_name_the_file(tmp_path, content):
    path = tmp_path / "broken.svs"
    path.write_bytes(content)
    with pytest.raises(UserError, match=r"broken\.svs: not a slide OpenSlide can read"):
        open_slide(path)
    with pytest.raises(UserError, match="file not found"):
        open_slide(tmp_path / "missing.svs")


def test_best_level_never_reads_below_the_needed_resolution():
    downsamples = (1.0, 4.0002, 16.001)
    assert best_level(downsamples, 4.0) == 1  # a scanner's 4.0002 counts as 4
    assert best_level(downsamples, 3.9) == 0
    assert best_level(downsamples, 15.0) == 1
    assert best_level(downsamples, 100.0) == 2
    assert best_level(downsamples, 0.5) == 0


def test_otsu_splits_two_populations():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(0.1, 0.02, 5000), rng.normal(0.6, 0.05, 2000)])
    t = otsu_threshold(values)
    assert (values[:5000] > t).mean() + (values[5000:] <= t).mean() < 0.005


def test_tissue_mask_finds_the_blobs_and_not_the_background_or_dust(slide):
    thumb, (dx, dy) = thumbnail(open_slide(slide.path), 256)
    mask = tissue_mask(thumb, min_area=10)
    truth = slide.tissue[:: round(dy), :: round(dx)][: mask.shape[0], : mask.shape[1]]
    iou = (mask & truth).sum() / (mask | truth).sum()
    assert iou > 0.9
    dust = slide.dust[:: round(dy), :: round(dx)][: mask.shape[0], : mask.shape[1]]
    assert mask[dust].mean() < 0.01
    assert tissue_mask(np.full((64, 64, 3), 243, np.uint8) + np.random.default_rng(0).integers(
        0, 4, (64, 64, 3), dtype=np.uint8), min_area=1).sum() == 0  # an empty slide stays empty


def test_tissue_mask_fills_holes_and_drops_specks():
    rgb = np.full((100, 100, 3), 240, np.uint8)
    rgb[20:60, 20:60] = (200, 100, 170)  # a tissue piece of 1600 px ...
    rgb[35:45, 35:45] = 240  # ... with a hole (a vessel lumen)
    rgb[80:83, 80:83] = (200, 100, 170)  # a speck of 9 px
    mask = tissue_mask(rgb, min_area=100, median=1)
    assert mask[20:60, 20:60].all() and mask.sum() == 1600


def test_quality_measures_on_crafted_patches():
    rng = np.random.default_rng(0)
    white = np.full((32, 32, 3), 240, np.uint8)
    texture = rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)
    assert white_fraction(white) == 1.0 and white_fraction(texture) < 0.1
    flat = np.full((32, 32, 3), 150, np.uint8)
    assert sharpness(flat) == 0.0 and sharpness(texture) > 1000
    # texture in colour only: red and blue stripes of one grey level (luma 0.299 R = 0.114 B) are sharp
    stripes = np.zeros((64, 64, 3), np.uint8)
    stripes[:, ::2, 0], stripes[:, 1::2, 2] = 76, 200  # 0.299 * 76 = 22.7 = 0.114 * 200 (to a grey level)
    grey = stripes.astype(np.float32) @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
    assert np.ptp(grey) < 0.5 and sharpness(stripes) > 1000


def test_candidate_grid_in_level0_pixels():
    mask = np.zeros((10, 10), bool)
    mask[2:6, 4:8] = True  # thumbnail px; downsample 10 -> level-0 x 40..80, y 20..60
    coords, fraction = candidate_grid(mask, (10.0, 10.0), (100, 100), 20, 0.5)
    assert coords.tolist() == [[40, 20], [60, 20], [40, 40], [60, 40]]
    assert fraction == pytest.approx(1.0)


def test_kept_patches_land_on_sharp_tissue_and_the_others_are_dropped(slide, tiles):
    size = tiles.geometry.size0
    assert size == 64 and tiles.geometry.patch_px == 32
    counts = tiles.counts()
    assert counts["kept"] >= 20 and counts["white"] >= 1 and counts["blurry"] >= 3
    for (x, y), status, white in zip(tiles.coords, tiles.status, tiles.white):
        tissue, blurry = _fraction(slide.tissue, x, y, size), _fraction(slide.blurry, x, y, size)
        if status == "kept":
            assert tissue >= 0.4 and blurry < 0.5 and _fraction(slide.dust, x, y, size) == 0
        if tissue == 1.0 and blurry == 1.0:
            assert status == "blurry"
        if status == "white":
            assert white > SMALL.max_white and tissue < 0.6
    interior = [s for (x, y), s in zip(tiles.coords, tiles.status)
                if _fraction(slide.tissue & ~slide.blurry, x, y, size) == 1.0 and
                _fraction(slide.blurry, max(x - 32, 0), max(y - 32, 0), size + 64) == 0]
    assert interior and all(s == "kept" for s in interior)


def test_the_thresholds_are_options(slide, tiles):
    lenient = tile_slide(slide.path, TileSettings(**{**SMALL.__dict__, "min_sharpness": 0.0, "max_white": 1.0}))
    assert lenient.counts()["kept"] == len(lenient.coords) == len(tiles.coords)


def test_write_tiles_outputs(tiles, tmp_path):
    paths = write_tiles(tiles, tmp_path)
    with open(paths["csv"]) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(tiles.coords)
    kept = [(int(r["x"]), int(r["y"])) for r in rows if r["status"] == "kept"]
    assert kept == [tuple(c) for c in tiles.kept.tolist()]
    meta = json.loads(paths["json"].read_text())
    assert meta["mpp"] == 1.0 and meta["geometry"]["size0"] == 64 and meta["counts"] == tiles.counts()
    from PIL import Image

    image = np.asarray(Image.open(paths["png"]))
    x, y = tiles.kept[0] / np.array(tiles.downsample)
    assert tuple(image[int(y) + 1, int(x)]) == COLOURS["kept"]  # the kept grid is drawn in bluish green


def test_tile_command(slide, tmp_path, capsys):
    argv = ["wsi", "tile", str(slide.path), "--out", str(tmp_path / "t"), "--patch-um", "64", "--patch-px", "32",
            "--thumbnail-px", "512", "--no-progress"]
    assert main(argv) == 0
    assert "1 done" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["synthetic.csv", "synthetic.json", "synthetic.png"]
    assert main(argv) == 0
    assert "1 already done" in capsys.readouterr().out


def _one_error_line(capsys, argv) -> str:
    assert main([*argv, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("medattn: error: ")
    return err[0]


def test_tile_command_bad_inputs(tmp_path, capsys):
    bare = write_synthetic_slide(tmp_path / "bare.tif", shape=(256, 256), mpp=None, levels=1).path
    blank = tmp_path / "blank"
    blank.mkdir()
    from medattn.generators.slides import write_pyramid

    write_pyramid(blank / "empty.tif", np.full((256, 256, 3), 243, np.uint8), mpp=1.0, levels=1)
    out = str(tmp_path / "out")
    assert "bare.tif" in _one_error_line(capsys, ["wsi", "tile", str(bare), "--out", out, "--patch-um", "64"])
    assert "no tissue" in _one_error_line(capsys, ["wsi", "tile", str(blank), "--out", out, "--patch-um", "64"])
    assert "--max-white" in _one_error_line(capsys, ["wsi", "tile", str(bare), "--out", out, "--max-white", "2"])
    assert "not found" in _one_error_line(capsys, ["wsi", "tile", str(tmp_path / "nope"), "--out", out])
    (tmp_path / "none").mkdir()
    assert "no slide files" in _one_error_line(capsys, ["wsi", "tile", str(tmp_path / "none"), "--out", out])
    assert main(["wsi", "tile", str(bare), str(blank), "--out", out, "--patch-um", "64", "--mpp", "1",
                 "--skip-bad", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "skipped" in printed and "empty.tif" in printed and "1 done" in printed


def test_list_slides_refuses_two_slides_with_one_name(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "s.svs").write_bytes(b"x")
    with pytest.raises(UserError, match="share the name 's'"):
        list_slides([tmp_path / "a", tmp_path / "b"])
