"""The slide pictures a person reads (issue 36): the tiling grid (outlines that keep their colour, a legend with
counts, a scale bar), the score overlay (tile outlines, a scale bar or "no scale", the slide's prediction for the
title); `wsi extract --tiles` telling what the tiling dropped; the SYNTHETIC mark following the slides into the
tiles and the bags. All on SYNTHETIC slides."""

import json

import h5py
import numpy as np
import pytest
from PIL import Image

pytest.importorskip("openslide")
pytest.importorskip("tifffile")

from medattn.cli import main  # noqa: E402
from medattn.generators.slides import render, write_pyramid, write_synthetic_cohort, write_synthetic_slide  # noqa: E402  # noqa: E402
from medattn.slides import (  # noqa: E402
    bag_is_synthetic,
    draw_grid,
    draw_heatmap,
    grid_legend,
    is_synthetic,
    open_slide,
    prediction_text,
    slide_overlay,
)
from medattn.slides.figures import NO_SCALE, TILE_OUTLINE, outline_width, scale_bar  # noqa: E402
from medattn.slides.tiling import COLOURS  # noqa: E402

SMALL = ["--patch-um", "64", "--patch-px", "32", "--thumbnail-px", "256", "--no-progress"]


def _lab(rgb) -> np.ndarray:
    """CIELAB (D65) of an sRGB colour: distances there are what the eye tells apart (about 2: just noticeable)."""
    c = np.asarray(rgb, dtype=np.float64) / 255
    c = np.where(c > 0.04045, ((c + 0.055) / 1.055) ** 2.4, c / 12.92)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ c
    f = np.cbrt(xyz / np.array([0.9505, 1.0, 1.089]))  # all of these colours are far above the linear toe
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def _distance(a, b) -> float:
    return float(np.linalg.norm(_lab(a) - _lab(b)))


def test_the_grid_outlines_keep_their_colour_scale_with_the_cell_and_a_legend_names_each_with_its_count():
    thumb = np.full((80, 200, 3), 240, np.uint8)
    coords = np.array([[0, 0], [40, 0], [80, 0], [0, 40]])  # three cells side by side: kept, white, blurry
    status = np.array(["kept", "white", "blurry", "kept"])
    image = np.asarray(draw_grid(thumb, (1.0, 1.0), coords, 40, status, mpp=2.0, background=7))
    assert image.shape[0] > thumb.shape[0] and image.shape[1] == thumb.shape[1]  # a legend band below
    for (x, _), name in zip(coords[:3], status[:3]):  # 2 px inside each cell, on both sides: no neighbour paints it
        for column in (x, x + 1, x + 38, x + 39):
            assert tuple(image[20, column]) == COLOURS[name], (name, column)
        assert tuple(image[20, x + 2]) == (240, 240, 240)  # the cell's inside shows the tissue
    colours = list(COLOURS.values())
    assert min(_distance(a, b) for i, a in enumerate(colours) for b in colours[i + 1:]) > 50
    from medattn.generators.slides import BACKGROUND, NUCLEUS, STROMA

    for colour in colours:  # and apart from the glass, stroma and nuclei they are drawn on
        assert min(_distance(colour, other) for other in ((BACKGROUND,) * 3, STROMA, NUCLEUS)) > 40
    band = image[thumb.shape[0]:].reshape(-1, 3)
    for colour in colours:  # each swatch of the legend
        assert (band == colour).all(axis=1).any()
    assert [text for _, text in grid_legend(status, 7)] == [
        "kept 2", "white 1 (dropped)", "blurry 1 (dropped)", "background 7 (too little tissue, not outlined)"]
    big = np.asarray(draw_grid(np.full((400, 400, 3), 240, np.uint8), (1.0, 1.0), np.array([[0, 0]]), 400))
    assert outline_width(400) >= 10 and (big[200, :outline_width(400)] == COLOURS["kept"]).all()
    assert outline_width(4) == 2  # never a 1-px line


def test_the_written_grid_has_the_legend_and_the_scale_bar(tmp_path, capsys):
    slides = tmp_path / "slides"
    write_synthetic_cohort(slides, count=1, seed=3, shape=(384, 512))
    assert main(["wsi", "tile", str(slides), "--out", str(tmp_path / "tiles"), *SMALL]) == 0
    meta = json.loads((tmp_path / "tiles" / "slide_000.json").read_text())
    image = Image.open(tmp_path / "tiles" / "slide_000.png")
    assert image.width == 256 and image.height > 192  # thumbnail 256 x 192 above its legend
    assert meta["background"] + sum(meta["counts"].values()) == (512 // 64) * (384 // 64)


def test_scale_bar_lengths_and_no_scale():
    assert scale_bar(2048, 1.0) == (200, "200 µm")
    length, text = scale_bar(2048, 12.0)  # a 100,000-px slide at 0.25 um/px on a 2,048-px thumbnail
    assert text == "2 mm" and length == round(2000 / 12.0) and length <= 2048 / 5
    assert scale_bar(1000, None) == (0, NO_SCALE) == (0, "no scale: mpp unknown")


def test_overlay_tiles_are_outlined_so_a_near_zero_tile_reads_as_tiled():
    thumb = np.full((60, 120, 3), 200, np.uint8)
    coords, scores = np.array([[0, 0], [60, 0]]), np.array([0.0, 1.0])
    image = np.asarray(draw_heatmap(thumb, (1.0, 1.0), coords, scores, 60, alpha=1.0, cmap="gray_r"))
    assert tuple(image[30, 0]) == TILE_OUTLINE and tuple(image[30, 59]) == TILE_OUTLINE  # the near-zero tile
    assert tuple(image[30, 30]) == (255, 255, 255)  # its inside: the colour of 0 (white in gray_r)
    plain = np.asarray(draw_heatmap(thumb, (1.0, 1.0), coords, scores, 60, alpha=1.0, cmap="gray_r", outline=False))
    assert tuple(plain[30, 0]) == (255, 255, 255)
    tiny = np.asarray(draw_heatmap(thumb, (1.0, 1.0), coords, scores, 4, alpha=1.0, cmap="gray_r"))
    assert (tiny != TILE_OUTLINE).any(axis=-1).all()  # tiles of 4 px: no outline to hide their colour


def test_slide_overlay_has_a_scale_bar_band_and_says_when_the_scale_is_unknown(tmp_path):
    known = write_synthetic_slide(tmp_path / "known.tif", shape=(256, 384), levels=1).path
    unknown = write_synthetic_slide(tmp_path / "unknown.tif", shape=(256, 384), mpp=None, levels=1).path
    coords, scores = np.array([[0, 0], [64, 64]]), np.array([0.1, 0.9])
    for path in (known, unknown):  # an unknown mpp is said in the picture, not an error
        picture = slide_overlay(path, coords, scores, 64, thumbnail_px=384)
        assert picture.width == 384 and picture.height > 256
        assert slide_overlay(path, coords, scores, 64, thumbnail_px=384, legend=False).size == (384, 256)
    from medattn.slides.figures import with_legend

    bars = [_longest_black_run(np.asarray(with_legend(Image.new("RGB", (384, 10)), [], scale))[10:])
            for scale in (1.0, None)]
    assert bars[0] >= 50 > 20 > bars[1]  # a 50-um bar at 1 um/px; only text without a scale


def _longest_black_run(pixels: np.ndarray) -> int:
    """The longest horizontal run of black pixels in an image (h, w, 3)."""
    best = 0
    for row in (pixels == 0).all(axis=-1):
        run = 0
        for black in row:
            run = run + 1 if black else 0
            best = max(best, run)
    return best


def test_prediction_text_for_the_title():
    assert prediction_text([0.873], ["tumour"]) == "slide P(tumour) = 0.87"
    assert prediction_text([0.1, 0.7, 0.2], ["A", "B", "C"], "multiclass") == "slide: B (p = 0.70)"
    assert prediction_text([0.2, 0.9], ["a", "b"], "multilabel") == "slide P(a) = 0.20, P(b) = 0.90"


def test_extract_from_tiles_reports_what_the_tiling_dropped(tmp_path, capsys):
    slides, tiles = tmp_path / "slides", tmp_path / "tiles"
    write_synthetic_cohort(slides, count=2, seed=3, shape=(384, 512))
    assert main(["wsi", "tile", str(slides), "--out", str(tiles), *SMALL]) == 0
    counts = [json.loads((tiles / f"slide_00{i}.json").read_text())["counts"] for i in range(2)]
    white, blurry = (sum(c[k] for c in counts) for k in ("white", "blurry"))
    assert white + blurry > 0  # the filter found something to drop on these slides
    tiled = capsys.readouterr().out.splitlines()[-1]
    assert f"{white} white and {blurry} blurry dropped;" in tiled
    assert main(["wsi", "extract", str(slides), "--out", str(tmp_path / "features"), "--tiles", str(tiles),
                 *SMALL]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert f"{white} white and {blurry} blurry dropped when tiled (wsi tile)" in last, last


def test_the_synthetic_mark_follows_the_slides_into_tiles_and_bags(tmp_path, capsys):
    slides = tmp_path / "slides"
    assert main(["wsi", "synthetic", str(slides), "--count", "1"]) == 0
    write_pyramid(slides / "real.tif", render((384, 512), seed=1)[0], mpp=1.0, levels=1)  # unmarked, as a scanner's
    assert is_synthetic(open_slide(slides / "slide_000.tif")) and not is_synthetic(open_slide(slides / "real.tif"))
    assert main(["wsi", "tile", str(slides), "--out", str(tmp_path / "tiles"), *SMALL]) == 0
    assert json.loads((tmp_path / "tiles" / "slide_000.json").read_text())["synthetic"] is True
    assert json.loads((tmp_path / "tiles" / "real.json").read_text())["synthetic"] is False
    for tiles in ([], ["--tiles", str(tmp_path / "tiles")]):  # tiled on the fly, or from the tiles
        out = tmp_path / f"features{len(tiles)}"
        assert main(["wsi", "extract", str(slides), "--out", str(out), *tiles, *SMALL]) == 0
        assert bag_is_synthetic(out / "slide_000.h5") and not bag_is_synthetic(out / "real.h5")
        with h5py.File(out / "slide_000.h5") as f:
            assert f.attrs["synthetic"] == True  # noqa: E712 (numpy bool)


def test_wsi_bags_of_synthetic_slides_is_a_synthetic_task_and_of_unmarked_ones_not(tmp_path, capsys):
    from medattn.data import build_datasets

    slides = tmp_path / "slides"
    write_synthetic_cohort(slides, count=4, seed=3, shape=(384, 512))
    out = tmp_path / "features"
    assert main(["wsi", "extract", str(slides), "--out", str(out), *SMALL]) == 0
    cfg = {"kind": "wsi_bags", "feature_dir": str(out), "label_columns": ["TUMOUR"],
           "slide_table": str(slides / "slide_table.csv"), "clinical_table": str(slides / "clinical_table.csv"),
           "val_fraction": 0.0, "test_fraction": 0.0}
    assert build_datasets(cfg).task.synthetic is True
    for bag in out.glob("*.h5"):  # the mark removed: as bags of a scanner's slides
        with h5py.File(bag, "a") as f:
            del f.attrs["synthetic"]
    assert build_datasets(cfg).task.synthetic is False
