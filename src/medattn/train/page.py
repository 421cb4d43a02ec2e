"""One self-contained HTML page a person opens: ``report.html`` beside a run's, a cross-validation's or a
comparison's files.

The page holds everything inline (no network, no side files): a title with the SYNTHETIC mark where it applies,
the verdict and every warning first, the summary as a table, and the run's pictures (ROC with n and CI, training
curves with the kept epoch, compare.png) embedded as base64 PNGs. Text is HTML-escaped. It is written last,
after the files it shows.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from medattn.outputs import OutputFolder
from medattn.vocabulary.task_types import TASK_TYPES

from .report import recipe_text, span, survival_lines

STYLE = ("body{font-family:sans-serif;max-width:60em;margin:2em auto;color:#222}"
         "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #bbb;padding:.3em .6em;text-align:left}"
         ".warning{background:#fff3cd;border-left:4px solid #d39e00;padding:.4em .8em;margin:.3em 0}"
         ".synthetic{color:#b00000;font-weight:bold}img{max-width:100%;margin:.5em 0}")


def _table(rows: list[list]) -> str:
    """The first row is the header, left out when all its cells are empty (a table of name-value pairs)."""
    head, *body = rows
    cells = "".join(f"<th>{html.escape(str(c))}</th>" for c in head)
    header = f"<tr>{cells}</tr>" if any(str(c) for c in head if c is not None) else ""
    lines = "".join("<tr>" + "".join(f"<td>{html.escape('' if c is None else str(c))}</td>" for c in row) + "</tr>"
                    for row in body)
    return f"<table>{header}{lines}</table>"


#: What each of a page's pictures shows, in a sentence (its file name is given after it).
CAPTIONS = {
    "roc_test.png": "ROC curve on the test split: sensitivity (true positive rate) against 1 - specificity (false "
                    "positive rate) over all thresholds; the title gives the AUROC with its 95% interval and n.",
    "km_test.png": "Kaplan-Meier curves of the test cases the model ranks in the higher and the lower half of risk "
                   "(censored cases marked +, numbers at risk below); the title gives the C-index with its 95% "
                   "interval and n, the legend the log-rank p-value.",
    "calibration_test.png": "Calibration at one time on the test split: each quarter of predicted survival's mean "
                            "predicted survival against its Kaplan-Meier observed survival; the dotted line marks "
                            "perfect calibration (docs/survival.md).",
    "predicted_test.png": "Predicted against true values on the test split; the line marks perfect agreement.",
    "training_curves.png": "Training curves: loss on the training and validation splits (left) and the validation "
                           "score (right) per epoch; the dashed line marks the kept epoch.",
    "compare.png": "The compared models' scores over the seeds.",
}
#: A task type's own sentence for its figure (``TaskType.figure_caption``), where it gives one.
CAPTIONS.update({f"{kind.figure}_test.png": kind.figure_caption for kind in TASK_TYPES.values()
                 if kind.figure and kind.figure_caption})
#: The figure of each task type's test split (``TaskType.figure``: roc, km, ...), in the registry's order.
FIGURES = list(dict.fromkeys(f"{kind.figure}_test.png" for kind in TASK_TYPES.values() if kind.figure))


def caption(name: str) -> str:
    """A readable sentence for the picture ``name`` (relative to the page's folder)."""
    if name in CAPTIONS:
        return CAPTIONS[name]
    path = Path(name)
    if path.parent.name == "heatmaps" and path.stem.isdigit():
        return (f"Test case ranked {path.stem} by predicted probability: the input beside the map of what the "
                f"model looked at (the title gives the case, its probability and its true label).")
    end, _, rank = path.stem.partition("_")
    if path.parent.name == "heatmaps" and end in ("highest", "lowest") and rank.isdigit():
        return (f"Test case of the {end} prediction, number {rank} (a risk: log relative risk, higher = earlier "
                f"event; or a predicted value): what each tile or pixel contributes to it (a signed map: red raises "
                f"it, blue lowers it; the title gives the case, its prediction and what was observed).")
    return path.stem.replace("_", " ").capitalize() + "."


def _image(folder: Path, name: str) -> str:
    data = base64.b64encode((folder / name).read_bytes()).decode()
    text = caption(name)
    return f'<figure><img alt="{html.escape(text)}" src="data:image/png;base64,{data}">' \
           f'<figcaption>{html.escape(text)} <small>({html.escape(name)})</small></figcaption></figure>'


#: How the summary names a metric: each task type's metric key -> its label (``TaskType.metric``, ``metric_label``).
ABBREVIATIONS = {kind.metric: kind.metric_label for kind in TASK_TYPES.values() if kind.metric}


def number(value: float | None) -> str:
    """A table cell of a figure: three decimals, empty for a missing value."""
    return "" if value is None else f"{value:.3f}"


def write_page(out: OutputFolder, title: str, synthetic: bool, summary: list[list], warnings: list[str],
               images: list[str]) -> Path:
    """``report.html`` in ``out``: ``title``, the warnings, the ``summary`` table (first row: header) and the PNGs of
    ``images`` (names in the folder; missing ones are left out)."""
    folder = out.folder
    mark = '<p class="synthetic">SYNTHETIC data: not real patients, not a clinical result</p>' if synthetic else ""
    notes = "".join(f'<div class="warning">{html.escape(w)}</div>' for w in warnings)
    pictures = "".join(_image(folder, name) for name in images if (folder / name).is_file())
    page = (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{mark}{notes}{_table(summary)}"
            f"{pictures}</body></html>")
    return out.save_text("report.html", page)


def _rate(rate: dict) -> str:
    if rate.get("value") is None:
        return "undefined"
    return f"{rate['value']:.3f} (95% CI {span(rate['ci_low'], rate['ci_high'])})"


def operating_rows(points: list[dict]) -> list[list[str]]:
    """The operating point(s) as table rows: the threshold chosen on validation (Youden's J) and the test
    sensitivity and specificity there, with Wilson intervals and counts, as ``medattn eval`` prints them."""
    rows = []
    for p in points:
        rows.append([f"operating point ({p['output']})",
                     f"threshold {p['threshold']:.3f} (chosen on validation, Youden's J): test sensitivity "
                     f"{_rate(p['sensitivity'])} [{p['tp']} of {p['tp'] + p['fn']}], specificity "
                     f"{_rate(p['specificity'])} [{p['tn']} of {p['tn'] + p['fp']}]"])
    return rows


def run_page(run_dir: Path, results: dict) -> Path:
    """The page of one training run (results.json's content)."""
    test = results.get("test", {})
    metric = results.get("metric", "")
    ci = "" if test.get("ci_low") is None else f" (95% CI {span(test['ci_low'], test['ci_high'])})"
    value = test.get(metric)
    provenance = results.get("provenance", {})
    rows = [["", ""], ["data", results.get("data")], ["model", results.get("model")],
            ["attention", results.get("attention")], ["best epoch", f"{results.get('best_epoch')} of "
                                                                    f"{results.get('epochs')}"],
            [f"test {ABBREVIATIONS.get(metric, metric)}",
             "undefined" if value is None else f"{value:.4f}{ci}, n={test.get('n')}"],
            *operating_rows(results.get("operating_point", [])),
            *[[part.strip() for part in line.split("  ", 1)] for line in survival_lines(test)],  # Brier, calibration
            ["learned", "yes" if results.get("learning", {}).get("learned", True) else "NO: not a result"],
            *([["recipe", recipe_text(results["recipe"])]] if results.get("recipe") else []),
            *[[name, provenance[key]] for name, key in (
                ("model id", "model_id"), ("checkpoint weights SHA-256", "weights_sha256"), ("date", "date"),
                ("medattn version", "medattn_version")) if provenance.get(key)],
            ["time", f"{results.get('elapsed_seconds', results.get('train_seconds', 0)):.1f} s"]]
    title = f"{results.get('model')} {results.get('attention') or ''} on {results.get('data')}".replace("  ", " ")
    return write_page(OutputFolder.within(run_dir), title, bool(results.get("synthetic")), rows,
                      results.get("warnings", []),
                      [*FIGURES, "calibration_test.png", "training_curves.png", *results.get("heatmaps", [])])
