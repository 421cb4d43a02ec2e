"""report.html and its figures for a clinical reader (issue 36): titles inside their figures, no empty table
header, captions in sentences, class names, whole epochs, the operating point and provenance, chance intervals
in [0, 1] written "a to b"."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from test_report_page import _read

from engine_data import TINY, TINY_DRAWN
from medattn.cli import main

#: The issue's title: model, split, AUROC with its interval, n and the SYNTHETIC mark.
LONG = "vit2d_tiny seqnorm, test: AUROC 0.750 (95% CI 0.238 to 1.000), n=8 (SYNTHETIC data)"


def _titles_inside(fig) -> list[str]:
    """The titles (axes titles and the figure's suptitle) of ``fig`` drawn outside the figure."""
    fig.canvas.draw()
    texts = [ax.title for ax in fig.axes] + ([fig._suptitle] if getattr(fig, "_suptitle", None) else [])
    outside = []
    for text in texts:
        if not text.get_text():
            continue
        box = text.get_window_extent()
        if box.x0 < fig.bbox.x0 or box.x1 > fig.bbox.x1 or box.y0 < fig.bbox.y0 or box.y1 > fig.bbox.y1:
            outside.append(text.get_text())
    return outside


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One tiny 2-epoch run, with every figure saved checked for clipped titles and every heatmap heading kept."""
    from medattn import outputs
    from medattn.explain import cases

    patch = pytest.MonkeyPatch()
    clipped, headings = {}, []
    original = outputs.OutputFolder.save_figure

    def checked(self, name, fig, **kwargs):  # every figure a writer saves through its folder
        clipped[str(name).rsplit("/", 1)[-1]] = _titles_inside(fig)
        return original(self, name, fig, **kwargs)

    class Recorded(cases.CasePictures):
        def __init__(self, title, *args):
            headings.append(title)
            super().__init__(title, *args)

    patch.setattr(outputs.OutputFolder, "save_figure", checked)
    patch.setattr(cases, "CasePictures", Recorded)
    folder = tmp_path_factory.mktemp("reader") / "run"
    argv = [a for a in TINY_DRAWN if not a.startswith("train.epochs")]
    try:
        assert main(["train", "synthetic_cxr", *argv, "train.epochs=2", "--out", str(folder), "--no-progress"]) == 0
    finally:
        patch.undo()
    return folder, clipped, headings


def test_the_roc_title_lies_inside_its_figure():
    from medattn import metrics

    rng = np.random.default_rng(0)
    labels = np.array([0, 1] * 10)[:, None]
    figure = metrics.roc_figure(rng.random((20, 1)), labels, "binary", LONG, ["cardiomegaly"])
    assert _titles_inside(figure) == []
    assert "0.238 to 1.000" in figure.axes[0].get_title().replace("\n", " ")  # broken at a comma, not inside


def test_no_title_of_a_run_figure_is_clipped(run):
    _, clipped, _ = run
    assert {"roc_test.png", "training_curves.png"} <= set(clipped)
    assert all(not outside for outside in clipped.values()), clipped


def test_the_summary_table_has_no_empty_header_row(run):
    text = (run[0] / "report.html").read_text()
    assert "<th></th>" not in text


def test_captions_are_sentences_not_file_names(run):
    text = (run[0] / "report.html").read_text()
    captions = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<figcaption>(.*?)</figcaption>", text)]
    assert len(captions) == 5
    for name, found in zip(["roc_test.png", "training_curves.png", "heatmaps/1.png"], captions):
        sentence = found.strip().removesuffix(f"({name})").strip()
        assert sentence != name and len(sentence.split()) > 8 and sentence.endswith("."), found
    assert captions[0].startswith("ROC curve on the test split")


def test_labels_print_as_class_names(run):
    _, _, headings = run
    assert headings and all(re.search(r"label (no )?cardiomegaly$", h) for h in headings), headings
    from medattn.data.base import TaskInfo
    from medattn.train.report import class_labels

    binary = TaskInfo("binary", "image2d", 1, (1, 8, 8), ["cardiomegaly"])
    assert class_labels(np.array([[1.0], [0.0]]), binary) == ["cardiomegaly", "no cardiomegaly"]
    multiclass = TaskInfo("multiclass", "image2d", 3, (1, 8, 8), ["a", "b", "c"])
    assert class_labels(np.array([2, 0]), multiclass) == ["c", "a"]
    multilabel = TaskInfo("multilabel", "image2d", 2, (1, 8, 8), ["effusion", "mass"])
    assert class_labels(np.array([[1, 1], [0, 0]]), multilabel) == ["effusion, mass", "none"]


def test_epoch_ticks_are_whole_numbers(tmp_path):
    from medattn.outputs import OutputFolder
    from medattn.train.report import plot_curves

    rows = [{"epoch": e, "train_loss": 1 / e, "val_loss": 1.1 / e, "val_auroc": 0.5 + e / 10} for e in (1, 2)]
    for axis in plot_curves(rows, "val_auroc", OutputFolder.within(tmp_path), LONG, best_epoch=2, name="curves.png"):
        low, high = axis.get_xlim()
        ticks = [t for t in axis.get_xticks() if low <= t <= high]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_the_page_shows_the_operating_point_and_provenance_as_eval_does(run):
    import medattn
    from medattn.runtime.trained import weights_sha256

    folder = run[0]
    text = " ".join(_read(folder / "report.html").text)
    results = json.loads((folder / "results.json").read_text())
    provenance = results["provenance"]
    assert provenance["model_id"] == "synthetic_cxr/vit2d_tiny/seqnorm/epoch" + str(results["best_epoch"])
    assert provenance["weights_sha256"] == weights_sha256(folder / "checkpoints/best")
    assert provenance["medattn_version"] == medattn.__version__
    for shown in (provenance["model_id"], provenance["weights_sha256"], provenance["date"], "medattn version",
                  medattn.__version__, "operating point", "sensitivity", "specificity"):
        assert shown in text, shown
    assert main(["eval", str(folder), "synthetic_cxr", *TINY, "--no-progress"]) == 0
    evaluated = json.loads((folder / "eval_synthetic_cxr_test/eval.json").read_text())
    assert results["operating_point"] == evaluated["operating_point"]
    point = evaluated["operating_point"][0]
    assert f"threshold {point['threshold']:.3f}" in text
    assert f"sensitivity {point['sensitivity']['value']:.3f}" in text
    assert f"specificity {point['specificity']['value']:.3f}" in text


def test_chance_intervals_are_clipped_and_written_a_to_b(run):
    from medattn.data.base import TaskInfo
    from medattn.train.objectives import objective_for
    from medattn.train.verdict import judge

    rows = [{"epoch": 1, "train_loss": 0.7, "val_auroc": 0.5}, {"epoch": 2, "train_loss": 0.6, "val_auroc": 0.5}]
    binary = objective_for(TaskInfo("binary", "image2d", 1, (1, 8, 8)))
    verdict = judge(rows, "val_auroc", binary, val_labels=np.array([[1], [0]]))  # the issue's -0.480-1.480
    assert verdict["chance_interval"] == [0.0, 1.0]
    assert "(0.000 to 1.000 at 95%" in verdict["reasons"][0]
    text = (run[0] / "report.html").read_text()
    assert not re.search(r"-?\d\.\d{3}-\d\.\d{3}", text)  # no "a-b" interval (a minus sign read as a dash)
