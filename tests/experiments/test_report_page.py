"""report.html: one self-contained page per run, cross-validation and comparison, rendered by headless Chromium
where it is installed (Debian's ``chromium``)."""

from __future__ import annotations

import html.parser
import json
import shutil
import subprocess

import pytest

from engine_data import TINY_DRAWN
from medattn.cli import main


class _Page(html.parser.HTMLParser):
    """Images (their src) and the visible text of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.images, self.text = [], []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs)["src"])

    def handle_data(self, data):
        self.text.append(data)


def _read(path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def _render(path) -> str | None:
    """The DOM Chromium renders from ``path`` (None where Chromium is absent)."""
    browser = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    if browser is None:
        return None
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", path.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_run_writes_one_page_with_its_summary_warnings_and_pictures(tmp_path):
    run = tmp_path / "run"
    assert main(["train", "synthetic_cxr", *TINY_DRAWN, "--out", str(run), "--no-progress"]) == 0
    page = _read(run / "report.html")
    text = " ".join(page.text)
    results = json.loads((run / "results.json").read_text())
    assert "SYNTHETIC data" in text and "vit2d_tiny" in text and "best epoch" in text
    assert all(warning in text for warning in results["warnings"])
    assert results["heatmaps"] == ["heatmaps/1.png", "heatmaps/2.png", "heatmaps/3.png"]  # eval.heatmaps: 3
    assert len(page.images) == 5 and all(src.startswith("data:image/png;base64,") for src in page.images)
    assert "http" not in (run / "report.html").read_text()  # self-contained: nothing fetched
    rendered = _render(run / "report.html")
    if rendered is None:
        pytest.skip("Chromium is not installed here (apt install chromium renders the page in CI)")
    assert "best epoch" in rendered and rendered.count("<img") == 5


@pytest.mark.parametrize("kind, overrides", [
    ("synthetic_cxr", ["model.name=resnet2d_tiny", "model.attention=null", "data.image_size=32"]),
    ("synthetic_breast_mri", ["model.name=vit3d_tiny", "data.volume_size=[16, 16, 8]"]),
    ("synthetic_wsi", ["model.name=vitwsi_tiny", "data.num_instances=[10, 30]", "data.feature_dim=16"]),
])
def test_the_page_shows_what_the_model_looks_at_in_its_highest_scored_test_cases(tmp_path, kind, overrides):
    """Images beside their map (here a CNN's gradient x input), volumes as three slices, bags as tiles: each with
    a colour bar (opaque: the map's translucency once faded it) and a title naming the case."""
    from pictures import colour_bar_span

    run = tmp_path / "run"
    argv = ["train", kind, "data.num_samples=[24, 12, 12]", "train.epochs=1", "train.threads=1", "eval.bootstrap=0",
            "eval.heatmaps=2", *overrides]
    assert main([*argv, "--out", str(run), "--no-progress"]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["heatmaps"] == ["heatmaps/1.png", "heatmaps/2.png"]
    assert len(_read(run / "report.html").images) == 4
    maps = {"RdBu_r": colour_bar_span(run / "heatmaps/1.png", "RdBu_r"),
            "inferno": colour_bar_span(run / "heatmaps/1.png", "inferno")}
    assert max(maps.values()) > 0.8, maps


def test_a_heatmap_that_fails_costs_the_run_nothing_but_a_warning(tmp_path, monkeypatch):
    from medattn.explain import cases

    def broken(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(cases, "explain", broken)
    run = tmp_path / "run"
    assert main(["train", "synthetic_cxr", *TINY_DRAWN, "--out", str(run), "--no-progress"]) == 0
    results = json.loads((run / "results.json").read_text())
    assert "heatmaps" not in results and (run / "report.html").is_file()
    assert "no heatmaps for report.html (RuntimeError: out of memory)" in results["warnings"]


@pytest.fixture(scope="module")
def slide_cohort(tmp_path_factory):
    """8 small SYNTHETIC slides (``slides/``, with their slide and clinical tables) and their bags (``features/``,
    the weight-free descriptor), and the train arguments of a one-epoch wsi_bags run on them drawing 2 cases."""
    pytest.importorskip("openslide")
    pytest.importorskip("tifffile")
    from medattn.generators.slides import write_synthetic_cohort

    root = tmp_path_factory.mktemp("cohort")
    slides, features = root / "slides", root / "features"
    write_synthetic_cohort(slides, count=8, seed=3, shape=(384, 512))
    assert main(["wsi", "extract", str(slides), "--out", str(features), "--extractor", "descriptor", "--skip-bad",
                 "--patch-um", "64", "--patch-px", "32", "--thumbnail-px", "256", "--no-progress"]) == 0
    argv = ["train", "synthetic_slides", f"data.feature_dir={features}", f"data.slide_table={slides}/slide_table.csv",
            f"data.clinical_table={slides}/clinical_table.csv", "train.epochs=1", "train.threads=1",
            "eval.bootstrap=0", "eval.heatmaps=2", "--no-progress"]
    return slides, argv


def test_a_bag_run_given_its_slides_draws_its_cases_on_the_slide_thumbnails(tmp_path, slide_cohort):
    """Training on wsi_bags drew its case heatmaps on a blank canvas: --slides DIR (data.slides_dir) draws them over
    the slides, as medattn explain --slides does, and config.yaml records the folder."""
    import yaml

    from pictures import glass_fraction

    slides, argv = slide_cohort
    run = tmp_path / "run"
    assert main([*argv, "--slides", str(slides), "--out", str(run)]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["heatmaps"] == ["heatmaps/1.png", "heatmaps/2.png"]
    assert all(glass_fraction(run / name) > 0.1 for name in results["heatmaps"])  # the slide's glass around its tissue
    assert not [w for w in results["warnings"] if "report.html" in w]
    assert yaml.safe_load((run / "config.yaml").read_text())["data"]["slides_dir"] == str(slides)


def test_a_slide_missing_from_slides_dir_is_a_warning_and_its_case_is_drawn_on_a_blank_canvas(tmp_path, slide_cohort):
    from pictures import glass_fraction

    _, argv = slide_cohort
    run, elsewhere = tmp_path / "run", tmp_path / "other_slides"
    elsewhere.mkdir()
    assert main([*argv, f"data.slides_dir={elsewhere}", "--out", str(run)]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["heatmaps"] == ["heatmaps/1.png", "heatmaps/2.png"]
    assert all(glass_fraction(run / name) < 0.01 for name in results["heatmaps"])
    missing = [w for w in results["warnings"] if w.startswith("report.html: test case")]
    assert len(missing) == 2 and all(f".tif is not in {elsewhere}; its heatmap is drawn at the tile coordinates on a "
                                     f"blank canvas" in w for w in missing), missing
    assert all(w in " ".join(_read(run / "report.html").text) for w in missing)


def test_a_slides_folder_that_does_not_exist_is_refused_before_training(tmp_path, slide_cohort, capsys):
    _, argv = slide_cohort
    capsys.readouterr()
    assert main([*argv, "--slides", str(tmp_path / "nowhere"), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"medattn: error: slides_dir {tmp_path / 'nowhere'}: folder not found (the folder of the scanner " \
                  f"files the bags were extracted from)"
    assert not (tmp_path / "run").exists()


def test_a_patient_whose_bag_joins_several_slides_is_drawn_on_none_of_them(tmp_path):
    from types import SimpleNamespace

    from medattn.data.input_kinds import KINDS
    from medattn.explain.cases import case_slide

    bags = next(kind for kind in KINDS.values() if kind.instances)
    dataset = SimpleNamespace(records=[SimpleNamespace(paths=(tmp_path / "a.h5", tmp_path / "b.h5"))])
    assert case_slide(dataset, 0, bags, tmp_path) == (None, {}, "its bag joins 2 slides (a.h5, b.h5)")
