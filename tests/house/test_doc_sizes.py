"""Docs a user reads, decisions a maintainer reads (issue 50): no reference page of docs/ over about 400 lines.

A reference page says how to do a thing, every key and every output; the decision log and the performance history
say why and what was measured on the way, and grow with the project, so they are exempt by name
(:data:`HISTORY`). Pages still over the bar that are to be split are named in :data:`TO_SPLIT`, each with its
reason; that list may only shrink: a page in it that is no longer over the bar fails the test until it is taken
out. docs/index.md links every page, so a new page is found from one place.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LIMIT = 400
#: Not reference pages: they grow with the project.
HISTORY = {
    "decisions.md": "the decision log: why the defaults are what they are, and the measurements behind them",
    "performance-history.md": "the figures of earlier rounds that later measurements replaced",
}
#: Reference pages over the bar, to be split (issue 50 split training.md, 899 lines, and performance.md, 813).
TO_SPLIT = {
    "realistic.md": "the realistic benchmark's members, results and their history",
    "slides.md": "the slide pipeline; its heatmap sections could make a page of their own",
}


def line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def over_the_bar(sizes: dict[str, int]) -> list[str]:
    """The reference pages of ``sizes`` (page -> lines) over :data:`LIMIT` that no list exempts."""
    return sorted(f"docs/{name}: {lines} lines" for name, lines in sizes.items()
                  if lines > LIMIT and name not in HISTORY and name not in TO_SPLIT)


def page_sizes() -> dict[str, int]:
    return {path.name: line_count(path) for path in sorted(DOCS.glob("*.md"))}


def test_no_reference_page_is_over_the_bar():
    assert over_the_bar(page_sizes()) == [], \
        f"split the page into reference pages of at most {LIMIT} lines; move decisions and measured history into " \
        "docs/decisions.md or docs/performance-history.md"


def test_the_exempt_pages_exist_and_those_to_split_are_still_over():
    sizes = page_sizes()
    assert sorted(name for name in {*HISTORY, *TO_SPLIT} if name not in sizes) == []
    assert [name for name in TO_SPLIT if sizes[name] <= LIMIT] == [], "take the page out of TO_SPLIT: it is split"


def test_a_planted_long_page_is_caught():
    assert over_the_bar({"new.md": LIMIT + 1, "short.md": LIMIT}) == [f"docs/new.md: {LIMIT + 1} lines"]
    assert over_the_bar({"decisions.md": 5 * LIMIT}) == []


def test_the_index_links_every_page():
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([\w.-]+\.md)(?:#[^)]*)?\)", index))
    assert sorted(set(page_sizes()) - linked - {"index.md"}) == [], "add the page to docs/index.md"
    assert sorted(linked - set(page_sizes())) == []
