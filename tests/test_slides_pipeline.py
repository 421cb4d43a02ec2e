"""End to end on SYNTHETIC slides through the command line: medattn wsi synthetic -> wsi tile -> wsi extract
(weight-free descriptor) -> medattn train (wsi_bags, the packaged synthetic_slides config) -> a test AUROC;
and the command shapes of issue 12 (options every script may rely on)."""

import json

import h5py
import numpy as np
import pytest

pytest.importorskip("openslide")
pytest.importorskip("tifffile")

from medattn.cli import build_parser, main  # noqa: E402
from medattn.slides import read_tiles, write_synthetic_cohort  # noqa: E402

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
