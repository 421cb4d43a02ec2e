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

from medattn.runtime.outputs import save_text

STYLE = ("body{font-family:sans-serif;max-width:60em;margin:2em auto;color:#222}"
         "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #bbb;padding:.3em .6em;text-align:left}"
         ".warning{background:#fff3cd;border-left:4px solid #d39e00;padding:.4em .8em;margin:.3em 0}"
         ".synthetic{color:#b00000;font-weight:bold}img{max-width:100%;margin:.5em 0}")


def _table(rows: list[list]) -> str:
    head, *body = rows
    cells = "".join(f"<th>{html.escape(str(c))}</th>" for c in head)
    lines = "".join("<tr>" + "".join(f"<td>{html.escape('' if c is None else str(c))}</td>" for c in row) + "</tr>"
                    for row in body)
    return f"<table><tr>{cells}</tr>{lines}</table>"


def _image(path: Path) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f'<figure><img alt="{html.escape(path.name)}" src="data:image/png;base64,{data}">' \
           f"<figcaption>{html.escape(path.name)}</figcaption></figure>"


def number(value: float | None) -> str:
    """A table cell of a figure: three decimals, empty for a missing value."""
    return "" if value is None else f"{value:.3f}"


def write_page(folder: Path, title: str, synthetic: bool, summary: list[list], warnings: list[str],
               images: list[str]) -> Path:
    """``folder/report.html``: ``title``, the warnings, the ``summary`` table (first row: header) and the PNGs of
    ``images`` (names in ``folder``; missing ones are left out)."""
    folder = Path(folder)
    mark = '<p class="synthetic">SYNTHETIC data: not real patients, not a clinical result</p>' if synthetic else ""
    notes = "".join(f'<div class="warning">{html.escape(w)}</div>' for w in warnings)
    pictures = "".join(_image(folder / name) for name in images if (folder / name).is_file())
    page = (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{mark}{notes}{_table(summary)}"
            f"{pictures}</body></html>")
    path = folder / "report.html"
    return save_text(path, page)


def run_page(run_dir: Path, results: dict) -> Path:
    """The page of one training run (results.json's content)."""
    test = results.get("test", {})
    metric = results.get("metric", "")
    ci = "" if test.get("ci_low") is None else f" ({test['ci_low']:.3f}-{test['ci_high']:.3f})"
    value = test.get(metric)
    rows = [["", ""], ["data", results.get("data")], ["model", results.get("model")],
            ["attention", results.get("attention")], ["best epoch", f"{results.get('best_epoch')} of "
                                                                    f"{results.get('epochs')}"],
            [f"test {metric}", "undefined" if value is None else f"{value:.4f}{ci}, n={test.get('n')}"],
            ["learned", "yes" if results.get("learning", {}).get("learned", True) else "NO: not a result"],
            ["time", f"{results.get('elapsed_seconds', results.get('train_seconds', 0)):.1f} s"]]
    title = f"{results.get('model')} {results.get('attention') or ''} on {results.get('data')}".replace("  ", " ")
    return write_page(run_dir, title, bool(results.get("synthetic")), rows, results.get("warnings", []),
                      ["roc_test.png", "training_curves.png", *results.get("heatmaps", [])])
