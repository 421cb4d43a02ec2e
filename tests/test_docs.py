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

ROOT = Path(__file__).resolve().parents[1]
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
