"""Argument types and help formatting shared by the command modules (:mod:`medattn.commands`) and the benches.

A command module never imports another command module (``docs/architecture.md``); a helper two commands
need lives here. Imports nothing from medattn, so ``medattn --help`` stays light.
"""

from __future__ import annotations

import argparse
import re

#: reST roles (``:mod:`x```, ``:func:`~a.b.c```, ``:meth:`text <target>```) and inline literals, as docstrings
#: write them.
_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`(~?)([^`<]*?)\s*(?:<[^`>]*>)?`")
_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)
_EMPHASIS = re.compile(r"(?<![\w*`])\*([A-Za-z][^*\n]*?)\*(?![\w*])")


def plain(text: str | None) -> str | None:
    """``text`` (a docstring or help) as the terminal shows it: reST roles and inline literals reduced to their text
    (``:func:`~medattn.a.b``` -> ``b``, ````x```` -> ``x``), ``*emphasis*`` to the word. None stays None."""
    if not text:
        return text

    def role(match: re.Match) -> str:
        tilde, target = match.groups()
        return target.rsplit(".", 1)[-1] if tilde else target

    return _EMPHASIS.sub(r"\1", _LITERAL.sub(r"\1", _ROLE.sub(role, text)))


def _shown(action: argparse.Action) -> str:
    """An option's default as it would be typed: a list space-separated where the option takes several words
    (``nargs``), comma-separated where it takes one (a comma list)."""
    value = action.default
    if isinstance(value, (list, tuple)):
        return ("," if action.nargs is None else " ").join(str(item) for item in value)
    return str(value)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """medattn's help: a command's description as written (its docstring, :func:`plain`), and every option's help
    ending with its default when it has one (not None, False or empty) that the help does not already mention."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "%(default)s" in text and isinstance(default, (list, tuple)):  # as typed, not as a Python list
            return text.replace("%(default)s", _shown(action).replace("%", "%%"))
        if (not action.option_strings or action.required or "default" in text.lower()
                or default is None or default is False or default is argparse.SUPPRESS
                or (isinstance(default, (list, tuple, str)) and not default)
                or isinstance(action, (argparse._StoreConstAction, argparse._VersionAction))):
            return text
        return f"{text} (default: {_shown(action).replace('%', '%%')})"


def apply_help_style(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` and every sub-parser under it :class:`HelpFormatter` and help without reST markup
    (descriptions, option helps and the sub-command lines), whatever the command module wrote."""
    parser.formatter_class = HelpFormatter
    parser.description = plain(parser.description)
    for action in parser._actions:
        if isinstance(action.help, str):
            action.help = plain(action.help)
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                choice.help = plain(choice.help)
            for sub in action.choices.values():
                apply_help_style(sub)


def add_device_option(parser: argparse.ArgumentParser) -> None:
    """``--device`` of the commands that run a trained model (eval, predict, explain): where it runs, named as
    ``train.device`` names devices; the device it was trained on is recorded in the checkpoint, not obeyed."""
    parser.add_argument("--device", default="auto", metavar="DEVICE",
                        help="where the model runs: auto (the best this machine has: CUDA, else MPS, else CPU), cpu, "
                             "mps, cuda or cuda:N, whatever train.device it was trained with")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value
