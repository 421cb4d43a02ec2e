"""report.html: one self-contained page per run, cross-validation and comparison, rendered by headless Chromium
where it is installed (Debian's ``chromium``)."""

from __future__ import annotations

import html.parser
import json
import shutil
import subprocess

import pytest

from engine_data import TINY
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
    assert main(["train", "synthetic_cxr", *TINY, "--out", str(run), "--no-progress"]) == 0
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
    assert main(["train", "synthetic_cxr", *TINY, "--out", str(run), "--no-progress"]) == 0
    results = json.loads((run / "results.json").read_text())
    assert "heatmaps" not in results and (run / "report.html").is_file()
    assert "no heatmaps for report.html (RuntimeError: out of memory)" in results["warnings"]
