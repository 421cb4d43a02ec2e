"""The README's and docs' examples run, so the docs cannot go stale.

* Every ```python block of README.md and docs/*.md is executed as written, in a fresh namespace inside a
  temporary folder that holds the files the examples name (``slide.h5``: a CLAM-layout feature bag).
* Every concrete ``medattn ...`` command line of a ```bash block (README.md, docs/, benchmarks/README.md)
  is parsed by the real argument parser; synopsis lines (with ``[...]``, ``...`` or ``a | b``) are skipped.
  For ``medattn train`` the packaged config and its overrides are resolved and validated as well.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import h5py
import numpy as np
import pytest

from medattn.cli import build_parser
from medattn.config import config_path, load_config
from medattn.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]


def blocks(language: str) -> list[tuple[str, str]]:
    """(``file:line``, code) of every fenced block of ``language`` in the docs."""
    found = []
    for path in DOCS:
        text = path.read_text()
        for match in re.finditer(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M):
            line = text[:match.start()].count("\n") + 1
            found.append((f"{path.relative_to(ROOT)}:{line}", match.group(1)))
    return found


def command_lines() -> list[tuple[str, str]]:
    """Concrete ``medattn`` commands (continuations joined, comments dropped) from the bash blocks."""
    commands = []
    for where, code in blocks("bash"):
        for line in code.replace("\\\n", " ").splitlines():
            line = line.split("#")[0].strip()
            if line.startswith("medattn ") and not re.search(r"\[|\.\.\.| \| ", line):
                commands.append((where, line))
    return commands


PYTHON_BLOCKS = blocks("python")
COMMANDS = command_lines()


def test_the_docs_have_examples():
    assert len(PYTHON_BLOCKS) >= 3 and len(COMMANDS) >= 10


@pytest.mark.parametrize("where, code", PYTHON_BLOCKS, ids=[w for w, _ in PYTHON_BLOCKS])
def test_python_example_runs(where, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with h5py.File("slide.h5", "w") as f:  # README's streaming example reads a CLAM-layout bag
        f["features"] = np.random.default_rng(0).standard_normal((3000, 2048), dtype=np.float32)
        f["coords"] = np.zeros((3000, 2), dtype=np.int64)
    exec(compile(code, where, "exec"), {"__name__": "__doc_example__"})


@pytest.mark.parametrize("where, line", COMMANDS, ids=[f"{w} {c[:50]}" for w, c in COMMANDS])
def test_command_line_parses(where, line):
    argv = shlex.split(line)[1:]
    args, extra = build_parser().parse_known_args(argv)
    assert all("=" in token and not token.startswith("-") for token in extra), f"{where}: unknown {extra}"
    if args.command == "train":
        try:
            config_path(args.config)
        except UserError:
            return  # the user's own file, named for illustration
        load_config(args.config, [*args.overrides, *extra])


NUMERIC = re.compile(r"\d\.\d|\d+ ?(s|ms|MiB|GiB|x)\b")
RECORDED = re.compile(r"recorded at commit `([0-9a-f]{7,40})`")


def measured_tables() -> list[tuple[str, str | None]]:
    """(``file:line``, the commit its marker names or None) of every table of figures in the docs."""
    found = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            if not lines[i].startswith("|"):
                i += 1
                continue
            end = next((j for j in range(i, len(lines)) if not lines[j].startswith("|")), len(lines))
            if NUMERIC.search("\n".join(lines[i:end])):
                marker = next((m.group(1) for line in lines[end:end + 3] if (m := RECORDED.search(line))), None)
                found.append((f"{path.relative_to(ROOT)}:{i + 1}", marker))
            i = end
    return found


def test_every_table_of_figures_carries_the_commit_it_was_recorded_at():
    """Figures cannot all be re-run in a test (hours of training, a machine's speed), so each table of them is
    followed by "*Figures recorded at commit `abc1234` (date).*", a commit of this repository (checked where its
    history is at hand); a reader sees how old the numbers are, and ``git checkout`` gives the code that made them."""
    import shutil
    import subprocess

    tables = measured_tables()
    assert len(tables) >= 40
    assert [where for where, commit in tables if commit is None] == []
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists() or subprocess.run(
            [git, "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True).stdout.strip() \
            != "false":
        pytest.skip("no full git history here to look the commits up in")
    unknown = [(where, commit) for where, commit in tables
               if subprocess.run([git, "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT).returncode != 0]
    assert unknown == []


GENERATED = re.compile(r"^<!-- generated by medattn\.docs_tables: (\w+) -->\n((?:\|.*(?:\n|$))*)", re.M)


def generated_tables() -> dict[str, list[tuple[str, str]]]:
    """name -> [(doc, table)] for every ``<!-- generated by medattn.docs_tables: NAME -->`` block of the docs."""
    found: dict[str, list[tuple[str, str]]] = {}
    for path in DOCS:
        for match in GENERATED.finditer(path.read_text()):
            found.setdefault(match.group(1), []).append((str(path.relative_to(ROOT)), match.group(2).rstrip("\n")))
    return found


def test_the_kind_and_preset_tables_are_the_catalogues():
    """The one table of data kinds (docs/data.md) and the one of model presets (docs/models.md) are those that
    :mod:`medattn.docs_tables` makes from the catalogue, so a kind or preset added, removed or changed there shows
    here; other docs link to these tables instead of repeating them."""
    from medattn.docs_tables import TABLES

    found = generated_tables()
    assert sorted(found) == sorted(TABLES)
    for name, (doc, make) in TABLES.items():
        assert [where for where, _ in found[name]] == [f"docs/{doc}"], f"the {name} table belongs in docs/{doc} only"
        assert found[name][0][1] == make(), f"docs/{doc}: the {name} table is not the catalogue's; " \
                                            "paste the output of `python -m medattn.docs_tables`"


def test_a_kind_or_preset_the_tables_do_not_know_is_caught(monkeypatch):
    from medattn import catalogue
    from medattn.docs_tables import data_kinds_table, presets_table

    table = presets_table()
    monkeypatch.setitem(catalogue.PRESETS, "vit9d", ("VisionTransformer", {"depth": 1}))
    assert presets_table() != table and "| `vit9d` | `VisionTransformer` | `depth=1` |" in presets_table()
    monkeypatch.setitem(catalogue.DATA_KINDS, "new_kind", ("new_module", "build_new_kind"))
    with pytest.raises(ValueError, match="new_kind"):
        data_kinds_table()


def heading_anchors(path: Path) -> set[str]:
    """GitHub's anchors of the headings of a markdown file (lower case, punctuation dropped, spaces to hyphens)."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def test_links_to_the_kind_table_pages_and_the_performance_pages_lead_to_a_heading():
    """The kinds table's "keys" links, and every link into docs/performance*.md, name a heading that exists."""
    from medattn.docs_tables import KIND_NOTES

    links = [(f"medattn.docs_tables.KIND_NOTES[{kind!r}]", ROOT / "docs", where)
             for kind, (_, _, where) in KIND_NOTES.items()]
    for path in DOCS:
        links += [(str(path.relative_to(ROOT)), path.parent, target)
                  for target in re.findall(r"\]\(([^)\s]*performance[^)\s]*\.md#[^)\s]+)\)", path.read_text())]
    bad = [(where, target) for where, folder, target in links
           if target.partition("#")[2] not in heading_anchors(folder / target.partition("#")[0])]
    assert bad == []
