"""The ``medattn`` command line: a thin layer over the library.

Each command lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int``;
this file only wires them into argparse. Errors meant for the user (:class:`medattn.errors.UserError`)
print one line and exit with status 2, with no traceback (``--debug`` shows it); every other exception
is a bug and shows its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys

from medattn import __version__
from medattn.errors import UserError

COMMANDS = {
    "demo": "medattn.commands.demo",
    "train": "medattn.commands.train",
    "eval": "medattn.commands.evaluate",
    "predict": "medattn.commands.predict",
    "models": "medattn.commands.models",
    "wsi": "medattn.commands.wsi",
}
BENCHES = {
    "attention": "medattn.bench.attention",
    "scaling": "medattn.bench.scaling",
    "binary": "medattn.bench.binary",
    "pam": "medattn.bench.pam",
}


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors on one line, like every other error (the usage is in ``--help``)."""

    def error(self, message: str):
        print(f"medattn: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def _load(module_name: str):
    """Import a command module; None while that capability is not installed in this version."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name == module_name:
            return None
        raise


def _debug_option(parser: argparse.ArgumentParser, default=argparse.SUPPRESS) -> None:
    """``--debug`` before or after the command name (a command's parser leaves an unset value alone)."""
    parser.add_argument("--debug", action="store_true", default=default,
                        help="show the full traceback of errors in the input too")


def _add_commands(subparsers, table: dict[str, str]) -> None:
    for name, module_name in table.items():
        module = _load(module_name)
        if module is None:
            continue
        doc = (module.__doc__ or "").strip().splitlines()
        parser = subparsers.add_parser(name, help=doc[0] if doc else None, description=module.__doc__,
                                       formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(parser)
        _debug_option(parser)
        parser.set_defaults(run=module.run)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="medattn", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"medattn {__version__}")
    _debug_option(parser, default=False)
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_commands(subparsers, COMMANDS)
    bench = subparsers.add_parser("bench", help="benchmarks: time and memory, written as CSV/JSON/PNG")
    _add_commands(bench.add_subparsers(dest="bench", required=True), BENCHES)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse stops collecting positionals once an option has been seen, so `key=value` overrides
    # given after options arrive here; they join the command's overrides wherever they stood.
    overrides = [token for token in extra if "=" in token and not token.startswith("-")]
    if len(overrides) != len(extra) or (overrides and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if overrides:
        args.overrides = [*args.overrides, *overrides]
    try:
        return int(args.run(args) or 0)
    except UserError as error:
        if args.debug:
            raise
        print(f"medattn: error: {error}", file=sys.stderr)
        return 2


HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"


def entry() -> None:
    """Console entry point: restart once with glibc's huge-page malloc, then run :func:`main`.

    PyTorch's CPU tensors of 32 MiB and more are mmap-ed fresh by glibc at every allocation and
    page-faulted back in, which dominated time on large sequences (docs/performance.md). With
    ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` glibc backs them with transparent huge pages. The tunable
    is read only at process start, hence the single re-exec. ``MEDATTN_MALLOC=default`` turns it off.
    """
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if (os.environ.get("MEDATTN_MALLOC", "hugepages") != "default" and platform.libc_ver()[0] == "glibc"
            and "glibc.malloc.hugetlb" not in tunables):
        os.environ["GLIBC_TUNABLES"] = f"{tunables}:{HUGE_PAGES_TUNABLE}" if tunables else HUGE_PAGES_TUNABLE
        os.execv(sys.executable, [sys.executable, "-m", "medattn", *sys.argv[1:]])
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
