"""A bag knows which slide it came from, beyond the file name (issue 49): ``wsi extract`` records the slide's
dimensions, size and digest (``slide_identity``), and ``explain --slides`` draws a bag only on that slide. Before,
pointed at another cohort whose slides bear the same names, explain drew the tiles on another slide's glass and
reported "2 of 2 bag map(s) drawn on their slide"."""

from __future__ import annotations

import json

import h5py
import pytest

pytest.importorskip("openslide")
pytest.importorskip("tifffile")

from engine_data import save_checkpoint  # noqa: E402
from medattn.cli import main  # noqa: E402
from medattn.data.base import TaskInfo  # noqa: E402
from medattn.errors import UserError  # noqa: E402
from medattn.generators.slides import write_synthetic_cohort  # noqa: E402
from medattn.slides import TileSettings, build_extractor, extract_slides  # noqa: E402

IDENTITY_ATTR = "slide_identity"  # medattn.slides.identity.IDENTITY_ATTR, spelled out (before: a failure, not an error)

SMALL = TileSettings(patch_um=64, patch_px=32, thumbnail_px=256)


@pytest.fixture(scope="module")
def cohorts(tmp_path_factory):
    """Two cohorts of two slides each with the same names and dimensions (other seeds), and the first one's bags."""
    root = tmp_path_factory.mktemp("identity")
    first = write_synthetic_cohort(root / "a", count=2, seed=0, shape=(384, 512))
    write_synthetic_cohort(root / "b", count=2, seed=7, shape=(384, 512))
    extract_slides(first, root / "bags", build_extractor("descriptor"), SMALL)
    return root


def test_extract_records_the_slide_identity(cohorts):
    from medattn.slides.identity import recorded

    with h5py.File(cohorts / "bags" / "slide_000.h5") as f:
        found = recorded(dict(f.attrs))
    slide = cohorts / "a" / "slide_000.tif"
    assert found["width"] == 512 and found["height"] == 384 and found["bytes"] == slide.stat().st_size
    assert len(found["digest"]) == 64


def test_a_rerun_over_bags_of_another_slide_of_the_same_name_is_refused(cohorts, tmp_path):
    import shutil

    out = tmp_path / "bags"
    shutil.copytree(cohorts / "bags", out)
    other = [cohorts / "b" / "slide_000.tif"]
    with pytest.raises(UserError, match=r"slide_000\.h5: exists with other settings \(made from another slide"):
        extract_slides(other, out, build_extractor("descriptor"), SMALL)
    assert [r.status for r in extract_slides([cohorts / "a" / "slide_000.tif"], out, build_extractor("descriptor"),
                                             SMALL)] == ["skipped"]  # its own slide: done


@pytest.fixture(scope="module")
def model(cohorts):
    return save_checkpoint(cohorts / "ck", "synthetic_wsi", ["model.name=abmil_tiny", "model.attention=null"],
                           TaskInfo("binary", "bag", 1, (32,), ["tumour"], synthetic=True))


def test_explain_draws_a_bag_only_on_the_slide_it_came_from(cohorts, model, tmp_path, capsys):
    bags = [str(cohorts / "bags" / f"slide_00{i}.h5") for i in range(2)]
    capsys.readouterr()
    assert main(["explain", str(model), *bags, "--out", str(tmp_path / "own"), "--slides", str(cohorts / "a"),
                 "--method", "attention"]) == 0
    assert "2 of 2 bag map(s) drawn on their slide" in capsys.readouterr().out
    assert main(["explain", str(model), *bags, "--out", str(tmp_path / "other"), "--slides", str(cohorts / "b"),
                 "--method", "attention"]) == 0
    printed = capsys.readouterr()
    assert "0 of 2 bag map(s) drawn on their slide, 2 slide(s) not found or not the bag's slide" in printed.out
    warnings = [line for line in printed.err.splitlines() if "warning" in line]
    assert len(warnings) == 2 and all("is not the slide the bag was extracted from" in w for w in warnings)
    assert "another slide of the same name" in warnings[0]
    assert main(["explain", str(model), bags[0], "--out", str(tmp_path / "one"), "--slides", str(cohorts / "b"),
                 "--method", "attention"]) == 2  # the one file explained: refused
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "slide_000.tif is not the slide the bag was extracted from" in err
    assert not (tmp_path / "one").exists()


def test_a_bag_without_identity_is_drawn_by_name_with_a_warning(cohorts, model, tmp_path, capsys):
    import shutil

    old = tmp_path / "slide_000.h5"
    shutil.copy(cohorts / "bags" / "slide_000.h5", old)
    with h5py.File(old, "a") as f:
        del f.attrs[IDENTITY_ATTR]
    capsys.readouterr()
    assert main(["explain", str(model), str(old), "--out", str(tmp_path / "out"), "--slides", str(cohorts / "b"),
                 "--method", "attention"]) == 0
    printed = capsys.readouterr()
    assert "1 of 1 bag map(s) drawn on their slide" in printed.out
    assert "1 bag(s) drawn on a slide matched by file name only" in printed.err


def test_a_slide_of_other_dimensions_is_named_so(cohorts, tmp_path):
    from medattn.generators.slides import write_synthetic_slide
    from medattn.slides.identity import mismatch

    write_synthetic_slide(tmp_path / "slide_000.tif", shape=(256, 512), seed=0, levels=2)
    with h5py.File(cohorts / "bags" / "slide_000.h5") as f:
        expected = json.loads(f.attrs[IDENTITY_ATTR])
    assert mismatch(tmp_path / "slide_000.tif", expected).startswith("it is 512 x 256 px, the bag's slide 512 x 384 px")
    assert mismatch(cohorts / "a" / "slide_000.tif", expected) == ""
