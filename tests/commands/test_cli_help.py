"""Help that explains itself (issue 36): every command and sub-command of the parser, walked, not listed by hand, has
a description, every option a help that states its default, and no reST markup reaches the terminal; each
``--help`` answers with status 0, those outside ``bench`` without importing torch."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

import pytest

from medattn.cli import build_parser, main
from medattn.cli_args import HelpFormatter, apply_help_style, plain

#: reST as docstrings write it: inline literals and roles (``:mod:`x```, ``:py:func:`y```).
MARKUP = re.compile(r"``|:[a-z]+:`")


def parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command words, parser) for ``parser`` and every sub-parser under it, depth first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, (*path, name))


def has_default(action: argparse.Action) -> bool:
    """Whether an option has a default worth stating: a value, not None, False, nothing or a flag's."""
    default = action.default
    return not (action.required or default is None or default is False or default is argparse.SUPPRESS
                or (isinstance(default, (list, tuple, str)) and not default)
                or isinstance(action, (argparse._StoreConstAction, argparse._VersionAction, argparse._HelpAction)))


def help_problems(parser: argparse.ArgumentParser, name: str = "medattn") -> list[str]:
    """What a reader of ``parser``'s help and its sub-commands' misses, one line each (empty: nothing)."""
    problems = []
    for path, sub in parsers(parser):
        where = " ".join([name, *path])
        if not (sub.description or "").strip():
            problems.append(f"{where}: no description")
        formatter = sub._get_formatter()
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            label = "/".join(action.option_strings) or action.dest
            if isinstance(action, argparse._SubParsersAction):
                lines = {choice.dest: choice.help for choice in action._choices_actions}
                problems += [f"{where} {choice}: no line in {where} --help" for choice in action.choices
                             if not (lines.get(choice) or "").strip()]
                continue
            if action.help is argparse.SUPPRESS:
                continue
            shown = formatter._expand_help(action) if action.help else ""
            if not shown.strip():
                problems.append(f"{where} {label}: no help")
            elif action.option_strings and has_default(action) and "default" not in shown.lower():
                problems.append(f"{where} {label}: help does not state the default {action.default!r}")
        text = sub.format_help()
        found = [m.start() for m in MARKUP.finditer(text)]
        if found:
            problems.append(f"{where}: reST markup in --help, {len(found)} time(s), first in "
                            f"{text[max(found[0] - 20, 0):found[0] + 20]!r}")
    return problems


def test_every_command_explains_itself():
    """The whole parser, benches and wsi's sub-commands included (built without argv, every command imported)."""
    assert help_problems(build_parser()) == []


def test_the_check_finds_what_is_missing():
    """A parser with each fault: the check above names every one."""
    parser = argparse.ArgumentParser(prog="fake", description="A fake command.")
    parser.add_argument("--silent", type=int, default=3)
    parser.add_argument("--said", type=int, default=3, help="says nothing of it")
    parser.add_argument("--stated", type=int, default=3, help="a count (default %(default)s)")
    parser.add_argument("--flag", action="store_true", help="a flag has no default to state")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("bare")
    sub.add_parser("marked", help="a line", description="Uses ``literal`` and :func:`medattn.x`.")
    problems = help_problems(parser, "fake")
    assert problems[:-1] == ["fake --silent: no help", "fake --said: help does not state the default 3",
                             "fake bare: no line in fake --help", "fake bare: no description"]
    assert problems[-1].startswith("fake marked: reST markup in --help, 3 time(s)")
    apply_help_style(parser)  # medattn's style states the default and takes the markup out
    assert help_problems(parser, "fake") == ["fake --silent: no help", "fake bare: no line in fake --help",
                                             "fake bare: no description"]


def test_plain_text_of_docstrings():
    assert plain("``medattn`` runs :func:`~medattn.train.fit` and :mod:`medattn.slides` (:meth:`A.b <x>`)") == \
        "medattn runs fit and medattn.slides (A.b)"
    assert plain("the *core* and 2 * 3 * 4, `single` stays") == "the core and 2 * 3 * 4, `single` stays"
    parser = argparse.ArgumentParser(formatter_class=HelpFormatter)
    parser.add_argument("--lens", type=lambda t: t.split(","), default=["1", "2"], help="lengths")
    parser.add_argument("--tasks", nargs="+", default=["a", "b"], help="tasks")
    parser.add_argument("--rate", type=float, default=0.5, help="rate in %%")
    text = " ".join(parser.format_help().split())
    assert "lengths (default: 1,2)" in text and "tasks (default: a b)" in text and "rate in % (default: 0.5)" in text


def _help_argvs() -> list[list[str]]:
    return [[*path, "--help"] for path, _ in parsers(build_parser())]


def test_every_help_answers_and_outside_bench_without_torch():
    """Each ``--help`` exits 0; outside ``bench`` in a process that never imports torch (the benches import it)."""
    light = [argv for argv in _help_argvs() if argv[0] != "bench" or argv == ["bench", "--help"]]
    code = ("import json, sys\nfrom medattn.cli import main\n"
            "for argv in json.loads(sys.argv[1]):\n"
            "    try:\n        main(argv)\n    except SystemExit as exit:\n"
            "        assert exit.code == 0, (argv, exit.code)\n"
            "    else:\n        raise AssertionError(f'{argv} did not exit')\n"
            "    assert 'torch' not in sys.modules, f'{argv} imported torch'\n")
    result = subprocess.run([sys.executable, "-c", code, json.dumps(light)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert ["wsi", "extract", "--help"] in light and ["bench", "--help"] in light
    assert not MARKUP.search(result.stdout)
    assert result.stdout.count("usage: medattn") == len(light)


@pytest.mark.parametrize("argv", [argv for argv in _help_argvs() if argv[0] == "bench" and len(argv) > 2],
                         ids=" ".join)
def test_bench_help_answers(argv, capsys):
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: medattn bench") and not MARKUP.search(out)


def test_named_outputs_and_inputs_in_help(capsys):
    """What the issue found missing: explain's GeoJSON and 3D preview, predict's .pt2, the defaults of options."""
    def shown(*argv: str) -> str:
        with pytest.raises(SystemExit):
            main([*argv, "--help"])
        return " ".join(capsys.readouterr().out.split())

    explain = shown("explain")
    assert "_tiles.geojson" in explain and "_preview.png" in explain and "coords_unit" in explain
    predict = shown("predict")
    assert ".pt2" in predict and "(default PATIENT)" in predict and "(default FILENAME)" in predict
    assert "per forward pass (default 8)" in predict
    assert "(default 64)" in shown("wsi", "extract") and "(default: 0)" in shown("demo")
