"""The ``medattn`` command line: a thin layer over the library.

Each command lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int``;
this file only wires them into argparse. Only the module of the command being run is imported (the
others are listed with the first line of their docstring, read from the source), so ``medattn --help``
and usage errors answer without importing torch. Errors meant for the user (:class:`medattn.errors.UserError`)
print one line and exit with status 2, with no traceback (``--debug`` shows it); Ctrl-C prints one line
(with what the command kept and how to go on, when its module defines ``interrupted(args) -> str``) and
exits with 130, SIGTERM likewise with 143 (:mod:`medattn.termination`); every other exception is a bug and shows
its traceback.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

from medattn import __version__, allocator
from medattn.cli_args import HelpFormatter, apply_help_style, plain
from medattn.errors import UserError, machine_problem
from medattn.termination import Terminated, sigterm_as_interrupt

COMMANDS = {
    "demo": "medattn.commands.demo",
    "train": "medattn.commands.train",
    "pretrain": "medattn.commands.pretrain",
    "plan": "medattn.commands.plan",
    "cv": "medattn.commands.cv",
    "compare": "medattn.commands.compare",
    "eval": "medattn.commands.evaluate",
    "predict": "medattn.commands.predict",
    "export": "medattn.commands.export",
    "inpaint": "medattn.commands.inpaint",
    "models": "medattn.commands.models",
    "wsi": "medattn.commands.wsi",
    "explain": "medattn.commands.explain",
    "realistic": "medattn.commands.realistic",
}
BENCHES = {
    "attention": "medattn.bench.attention",
    "scaling": "medattn.bench.scaling",
    "binary": "medattn.bench.binary",
    "pam": "medattn.bench.pam",
    "extract": "medattn.bench.extract",
    "diffusion": "medattn.diffusion.benchmark",
}

BENCH_HELP = "Benchmarks: time and peak memory on this machine, written as CSV/JSON/PNG."
BENCH_DESCRIPTION = """Benchmarks of this machine: time and peak memory, written as CSV and JSON (and PNG) to --out.

Each bench below refuses results already in its --out unless given --overwrite; medattn bench NAME --help lists its
options and says what it measures (docs/performance.md)."""


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors on one line, like every other error (the usage is in ``--help``)."""

    def error(self, message: str):
        print(f"medattn: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def _find_spec(module_name: str):
    """The spec of ``module_name``, found without importing it or the packages above it (``find_spec`` would run
    their ``__init__``: ``medattn.diffusion``'s imports torch); None if absent."""
    top, *parts = module_name.split(".")
    spec = importlib.util.find_spec(top)
    for part in parts:
        if spec is None or spec.submodule_search_locations is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(f"{spec.name}.{part}", spec.submodule_search_locations)
    return spec


def _summary(module_name: str) -> str | None:
    """First docstring line of a command module, read from its source without importing it; None if absent."""
    spec = _find_spec(module_name)
    if spec is None or spec.origin is None:
        return None
    doc = ast.get_docstring(ast.parse(Path(spec.origin).read_text(encoding="utf-8"))) or ""
    return plain(doc.strip().splitlines()[0]) if doc.strip() else ""


def _first_word(argv: list[str]) -> str | None:
    """The first token of ``argv`` that is not an option (the command, or the bench under ``bench``)."""
    return next((token for token in argv if not token.startswith("-")), None)


def _debug_option(parser: argparse.ArgumentParser, default=argparse.SUPPRESS) -> None:
    """``--debug`` before or after the command name (a command's parser leaves an unset value alone)."""
    parser.add_argument("--debug", action="store_true", default=default,
                        help="show the full traceback of errors in the input too")


def _add_commands(subparsers, table: dict[str, str], argv: list[str] | None) -> None:
    """One sub-parser per command of ``table``; with ``argv`` only the command it names is imported and
    given its arguments (the others are a help line), without ``argv`` every command is."""
    chosen = None if argv is None else _first_word(argv)
    for name, module_name in table.items():
        summary = _summary(module_name)
        if summary is None:  # that capability is not installed in this version
            continue
        if argv is not None and name != chosen:
            subparsers.add_parser(name, help=summary)
            continue
        module = importlib.import_module(module_name)
        parser = subparsers.add_parser(name, help=summary, description=module.__doc__, formatter_class=HelpFormatter)
        module.add_arguments(parser)
        _debug_option(parser)
        apply_help_style(parser)  # the sub-commands a module adds too (wsi tile, ...)
        parser.set_defaults(run=module.run, interrupted=getattr(module, "interrupted", None))


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser; given the ``argv`` it will parse, it imports only the command named there."""
    parser = _Parser(prog="medattn", description=plain(__doc__.splitlines()[0]), formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"medattn {__version__}")
    _debug_option(parser, default=False)
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_commands(subparsers, COMMANDS, argv)
    bench = subparsers.add_parser("bench", help=BENCH_HELP, description=BENCH_DESCRIPTION,
                                  formatter_class=HelpFormatter)
    bench_argv = None if argv is None else argv[argv.index("bench") + 1:] if _first_word(argv) == "bench" else []
    _add_commands(bench.add_subparsers(dest="bench", required=True), BENCHES, bench_argv)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args, extra = parser.parse_known_args(argv)
    # argparse stops collecting positionals once an option has been seen, so `key=value` overrides
    # given after options arrive here; they join the command's overrides wherever they stood.
    overrides = [token for token in extra if "=" in token and not token.startswith("-")]
    if len(overrides) != len(extra) or (overrides and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if overrides:
        args.overrides = [*args.overrides, *overrides]
    try:
        with sigterm_as_interrupt():
            return int(args.run(args) or 0)
    except UserError as error:
        if args.debug:
            raise
        print(f"medattn: error: {error}", file=sys.stderr)
        return 2
    except (OSError, MemoryError) as error:
        problem = machine_problem(error)
        if problem is None or args.debug:
            raise
        print(f"medattn: error: {problem}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:
        if args.debug:
            raise
        what_now = args.interrupted(args) if getattr(args, "interrupted", None) else ""
        name, status = ("SIGTERM", 143) if isinstance(stop, Terminated) else ("Ctrl-C", 130)  # 128 + the signal
        print(f"\nmedattn: interrupted ({name}){': ' + what_now if what_now else ''}", file=sys.stderr)
        return status


#: Commands that allocate no large tensors, so they start without the allocator restart.
LIGHT_COMMANDS = ("models",)
#: Commands that train (or time training), started with freed memory kept for reuse; the others run models and
#: start with huge pages only, which keep a streaming inference's memory flat (medattn.allocator).
TRAINING_COMMANDS = ("demo", "train", "cv", "compare", "bench")


def entry() -> None:
    """Console entry point: restart once with medattn's glibc malloc settings, then run :func:`main`.

    glibc maps every block of 32 MiB and more fresh and page-faults it in at each allocation, which
    dominated large training steps; the restart sets ``GLIBC_TUNABLES`` for the mode of
    :mod:`medattn.allocator` (freed memory kept for reuse for :data:`TRAINING_COMMANDS`, huge pages for the
    others). Tunables are read only at process start, hence the single re-exec, made only for commands that
    compute (not for help, the version, ``medattn models`` or a command line without a command).
    ``MEDATTN_MALLOC`` chooses the mode for every command (``default``: glibc's own behaviour).
    """
    argv = sys.argv[1:]
    command = _first_word(argv)
    computes = command not in (None, *LIGHT_COMMANDS) and not {"-h", "--help", "--version"} & set(argv)
    try:
        tunables = computes and allocator.startup_tunables("reuse" if command in TRAINING_COMMANDS else "hugepages")
    except ValueError as error:
        print(f"medattn: error: {error}", file=sys.stderr)
        sys.exit(2)
    if tunables:
        os.environ["GLIBC_TUNABLES"] = tunables
        os.execv(sys.executable, [sys.executable, "-m", "medattn", *sys.argv[1:]])
    try:
        sys.exit(main())
    except BrokenPipeError:  # output piped into a reader that stopped early (`medattn models | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at interpreter exit
        sys.exit(141)  # 128 + SIGPIPE, as a shell reports it


if __name__ == "__main__":
    sys.exit(main())
