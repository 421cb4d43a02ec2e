"""End to end on SYNTHETIC slides through the command line: medattn wsi synthetic -> wsi tile -> wsi extract
(weight-free descriptor) -> medattn train (wsi_bags, the packaged synthetic_slides config) -> a test AUROC;
and the command shapes of issue 12 (options every script may rely on)."""

import json

import h5py
import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("openslide")
pytest.importorskip("tifffile")

from medattn.cli import build_parser, main  # noqa: E402
from medattn.errors import UserError  # noqa: E402
from medattn.generators.slides import load_truth, write_synthetic_cohort  # noqa: E402
from medattn.slides import read_tiles  # noqa: E402
from pictures import colour_bar_span, glass_fraction  # noqa: E402

SMALL = ["--patch-um", "64", "--patch-px", "32", "--thumbnail-px", "256", "--no-progress"]


def test_slides_to_tiles_to_features_to_a_trained_model(tmp_path, capsys):
    slides, tiles, features = tmp_path / "slides", tmp_path / "tiles", tmp_path / "features"
    write_synthetic_cohort(slides, count=8, seed=3, shape=(384, 512))  # small slides; the command: below
    assert main(["wsi", "tile", str(slides), "--out", str(tiles), "--mpp", "1", *SMALL]) == 0
    assert main(["wsi", "extract", str(slides), "--out", str(features), "--tiles", str(tiles),
                 "--extractor", "descriptor", "--skip-bad", *SMALL]) == 0
    printed = capsys.readouterr().out
    assert "8 done" in printed and "(descriptor on cpu)" in printed
    stems = [f"slide_{i:03d}" for i in range(8)]
    assert sorted(p.name for p in tiles.iterdir()) == sorted(f"{s}.{k}" for s in stems for k in ("csv", "json", "png"))
    assert sorted(p.name for p in features.iterdir()) == [f"{s}.h5" for s in stems]
    for stem in stems:
        with h5py.File(features / f"{stem}.h5") as f:
            kept, _ = read_tiles(tiles, slides / f"{stem}.tif")
            assert f["features"].shape == (len(kept), 32) and np.array_equal(f["coords"][:], kept)

    run = tmp_path / "run"
    tables = [f"data.{t}={slides / t}.csv" for t in ("slide_table", "clinical_table")]
    assert main(["train", "synthetic_slides", f"data.feature_dir={features}", *tables,
                 "train.epochs=2", "eval.bootstrap=20", "--out", str(run), "--no-progress"]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["data"] == "wsi_bags" and results["n_train"] == 4 and results["test"]["n"] == 2
    assert 0.0 <= results["test"]["auroc"] <= 1.0  # one tumour and one normal slide held out
    assert (run / "predictions_test.csv").is_file()

    # the tile map on the slide itself, not on a blank canvas (explain --slides), with a colour bar
    for slides_given in (["--slides", str(slides)], []):
        out = tmp_path / f"maps{len(slides_given)}"
        assert main(["explain", str(run), str(features / "slide_000.h5"), *slides_given, "--out", str(out)]) == 0
    on_slide, blank = tmp_path / "maps2" / "slide_000.png", tmp_path / "maps0" / "slide_000.png"
    # the scores as QuPath objects: one square per tile at its level-0 corner, the score as a measurement
    geojson = json.loads((tmp_path / "maps2" / "slide_000_tiles.geojson").read_text())
    with h5py.File(features / "slide_000.h5") as f:
        coords, side = f["coords"][:], int(f.attrs["patch_size_level0"])
    with h5py.File(tmp_path / "maps2" / "slide_000_tiles.h5") as f:
        scores = f["scores"][:]
    assert geojson["type"] == "FeatureCollection" and len(geojson["features"]) == len(coords)
    for feature, (x, y), score in zip(geojson["features"], coords, scores):
        ring = feature["geometry"]["coordinates"][0]
        assert ring == [[x, y], [x + side, y], [x + side, y + side], [x, y + side], [x, y]]
        assert feature["properties"]["objectType"] == "tile"
        assert feature["properties"]["measurements"]["gradxinput score"] == pytest.approx(score)
    assert glass_fraction(on_slide) > 0.1 and glass_fraction(blank) < 0.01
    for figure in (on_slide, blank):
        assert Image.open(figure).size[0] >= 900
        assert colour_bar_span(figure, "RdBu_r") > 0.8  # gradxinput: signed, red adds, blue takes away


def test_extract_tiles_by_itself_without_tiles(tmp_path, capsys):
    slides = tmp_path / "slides"
    assert main(["wsi", "synthetic", str(slides), "--count", "2"]) == 0
    assert main(["wsi", "tile", str(slides), "--out", str(tmp_path / "tiles"), *SMALL]) == 0
    assert main(["wsi", "extract", str(slides), "--out", str(tmp_path / "features"), *SMALL]) == 0  # shape of the issue
    assert "2 done" in capsys.readouterr().out.splitlines()[-1]
    for slide in sorted(slides.glob("*.tif")):
        kept, _ = read_tiles(tmp_path / "tiles", slide)
        with h5py.File(tmp_path / "features" / f"{slide.stem}.h5") as f:
            assert np.array_equal(f["coords"][:], kept) and f.attrs["extractor"] == "descriptor"  # the default


def test_a_rerun_with_other_settings_is_refused_saying_which_and_overwrite_redoes_it(tmp_path, capsys):
    """`wsi tile` kept the old tiles and said "already done" when run again with other filters."""
    slides, tiles = tmp_path / "slides", tmp_path / "tiles"
    write_synthetic_cohort(slides, count=1, seed=3, shape=(384, 512))
    assert main(["wsi", "tile", str(slides), "--out", str(tiles), *SMALL]) == 0
    assert main(["wsi", "tile", str(slides), "--out", str(tiles), *SMALL]) == 0
    assert "0 done, 1 already done" in capsys.readouterr().out
    capsys.readouterr()
    assert main(["wsi", "tile", str(slides), "--out", str(tiles), *SMALL, "--min-sharpness", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert "slide_000.json: tiled with other settings (--min-sharpness 20.0 -> 5.0)" in err and "\n" not in err
    assert main(["wsi", "tile", str(slides), "--out", str(tiles), *SMALL, "--min-sharpness", "5", "--overwrite"]) == 0
    assert "1 done" in capsys.readouterr().out
    assert json.loads((tiles / "slide_000.json").read_text())["settings"]["min_sharpness"] == 5.0


@pytest.mark.parametrize("command", ["tile", "extract"])
def test_command_shapes_take_the_documented_options(command):
    argv = ["wsi", command, "SLIDES_DIR", "--out", "OUT", "--mpp", "0.5", "--patch-um", "128", "--patch-px", "224",
            "--skip-bad"] + (["--extractor", "resnet50:retccl.pth"] if command == "extract" else [])
    args = build_parser(argv).parse_args(argv)
    assert (str(args.slides[0]), str(args.out), args.mpp, args.patch_um, args.patch_px, args.skip_bad) == (
        "SLIDES_DIR", "OUT", 0.5, 128.0, 224, True)
    if command == "extract":
        assert args.extractor == "resnet50:retccl.pth" and args.tiles is None
        assert build_parser(argv[:5]).parse_args(argv[:5]).extractor == "descriptor"


def test_heatmap_scales_scores_to_their_own_range_or_to_percentiles():
    import matplotlib

    from medattn.slides import draw_heatmap

    thumb = np.full((10, 30, 3), 200, np.uint8)
    coords = np.array([[0, 0], [10, 0], [20, 0]])
    ends = [np.round(np.array(matplotlib.colormaps["viridis"](v)[:3]) * 255) for v in (0.0, 1.0)]
    image = np.asarray(draw_heatmap(thumb, (1.0, 1.0), coords, np.array([0.02, 0.03, 0.04]), 10, alpha=1.0,
                                    cmap="viridis", outline=False))
    assert (image[:, :10] == ends[0]).all() and (image[:, 20:] == ends[1]).all()  # attention-sized scores span it
    ranked = np.asarray(draw_heatmap(thumb, (1.0, 1.0), coords, np.array([0.0, 0.001, 1.0]), 10, alpha=1.0,
                                     cmap="viridis", percentile=True, outline=False))
    middle = np.round(np.array(matplotlib.colormaps["viridis"](0.5)[:3]) * 255)
    assert np.abs(ranked[:, 10:20].astype(float) - middle).max() <= 1  # the middle rank, not the bottom colour


def test_heatmap_mass_on_a_region_and_its_chance_level():
    from medattn.slides import heatmap_mass, tile_overlap

    mask = np.zeros((40, 60), bool)
    mask[:20, :30] = True  # the top-left 30 x 20 px
    coords = np.array([[0, 0], [20, 0], [40, 0], [0, 20]])  # 20-px tiles: inside, half inside, outside, outside
    overlap = tile_overlap(mask, coords, 20)
    assert overlap.tolist() == [1.0, 0.5, 0.0, 0.0]
    assert heatmap_mass(np.ones(4), overlap) == overlap.mean() == 0.375  # uniform scores: the chance level
    assert heatmap_mass(np.array([3.0, 2.0, 0.0, 5.0]), overlap) == 0.4
    for scores in (np.array([1.0, -1.0, 1.0, 1.0]), np.zeros(4), np.ones(3)):
        with pytest.raises(UserError, match="heatmap mass"):
            heatmap_mass(scores, overlap)


def test_the_synthetic_cohort_keeps_its_ground_truth(tmp_path):
    paths = write_synthetic_cohort(tmp_path, count=2, shape=(256, 384))
    normal, tumour = (load_truth(p) for p in paths)
    assert set(normal) == {"tissue", "blurry", "tumour", "dust"} and normal["tissue"].shape == (256, 384)
    assert not normal["tumour"].any() and tumour["tumour"].any() and (tumour["tumour"] <= tumour["tissue"]).all()
    assert sorted(p.name for p in tmp_path.glob("*.tif")) == ["slide_000.tif", "slide_001.tif"]


def test_stamp_layout_loads_through_the_wsi_bags_loader(tmp_path, capsys):
    from medattn.data import build_datasets
    from medattn.data.readers.bags import read_slide

    slides = tmp_path / "slides"
    write_synthetic_cohort(slides, count=2, shape=(256, 384))
    argv = ["wsi", "extract", str(slides), "--mpp", "0.5", "--patch-um", "32", "--patch-px", "32",
            "--thumbnail-px", "256", "--min-tissue-area-um2", "0", "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "clam")]) == 0
    assert main([*argv, "--out", str(tmp_path / "stamp"), "--layout", "stamp"]) == 0
    with h5py.File(tmp_path / "stamp" / "slide_001.h5") as f:
        assert sorted(f) == ["coords", "feats"] and f.attrs["unit"] == "um" and f.attrs["feat_type"] == "tile"
        assert (f.attrs["tile_size_um"], f.attrs["tile_size_px"]) == (32.0, 32)
    clam_features, clam_coords = read_slide(tmp_path / "clam" / "slide_001.h5")
    stamp_features, stamp_coords = read_slide(tmp_path / "stamp" / "slide_001.h5")
    assert torch.equal(stamp_features, clam_features) and torch.equal(stamp_coords, clam_coords * 0.5)  # microns
    bundle = build_datasets({"kind": "wsi_bags", "feature_dir": str(tmp_path / "stamp"), "label_columns": ["TUMOUR"],
                             "slide_table": str(slides / "slide_table.csv"),
                             "clinical_table": str(slides / "clinical_table.csv"),
                             "val_fraction": 0.0, "test_fraction": 0.0})
    assert len(bundle.train) == 2 and bundle.train[1]["input"].shape == clam_features.shape
    capsys.readouterr()
    assert main([*argv, "--out", str(tmp_path / "stamp")]) == 2  # the CLAM layout asked of a STAMP folder: refused
    assert "exists with other settings (layout=stamp)" in capsys.readouterr().err
    assert main([*argv, "--out", str(tmp_path / "stamp"), "--layout", "stamp"]) == 0  # resumes: already done
    assert "2 already done" in capsys.readouterr().out


def test_skip_bad_says_in_the_last_line_that_slides_failed(tmp_path, capsys):
    """``wsi tile --skip-bad`` exits 0 with a broken slide left out; its last line says so."""
    from medattn.cli import main

    assert main(["wsi", "synthetic", "--out", str(tmp_path / "slides"), "--count", "2"]) == 0
    (tmp_path / "slides" / "broken.tif").write_bytes(b"II*\x00 not a slide")
    capsys.readouterr()
    assert main(["wsi", "tile", str(tmp_path / "slides"), "--out", str(tmp_path / "tiles"), "--skip-bad",
                 "--no-progress"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("WARNING: 1 of 3 slide(s) failed") and "--skip-bad" in last


def test_synthetic_refuses_a_users_slide_or_table_unless_overwrite(tmp_path, capsys):
    """`wsi synthetic DIR` replaced a user's own slide_table.csv and slide_000.tif with exit 0."""
    slides = tmp_path / "slides"
    slides.mkdir()
    (slides / "slide_000.tif").write_bytes(b"the user's slide")
    (slides / "slide_table.csv").write_text("the user's table")
    assert main(["wsi", "synthetic", str(slides), "--count", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "slide_000.tif exists" in err and "--overwrite" in err and "\n" not in err
    (slides / "slide_000.tif").unlink()
    assert main(["wsi", "synthetic", str(slides), "--count", "1"]) == 2  # checked before the first slide is written
    assert "slide_table.csv exists" in capsys.readouterr().err and not (slides / "slide_000.tif").exists()
    assert (slides / "slide_table.csv").read_text() == "the user's table"
    assert main(["wsi", "synthetic", str(slides), "--count", "1", "--overwrite"]) == 0
    assert (slides / "slide_table.csv").read_text().splitlines() == ["PATIENT,FILENAME", "patient_000,slide_000"]
    assert sorted(p.name for p in slides.iterdir()) == ["clinical_table.csv", "slide_000.tif", "slide_table.csv",
                                                        "truth"]
    assert load_truth(slides / "slide_000.tif")["tissue"].any()
