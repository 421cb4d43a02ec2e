"""`commands/` holds only parsing and printing (issue 50): the work of a command sits in the library.

Generated from ``cli.COMMANDS``: each command module is read with :mod:`ast` (not imported) and must be a thin
layer, in this checkable sense:

* at module level only the docstring, imports, constants (at most :data:`MAX_CONSTANTS`: argument choices and
  help texts) and functions; no class anywhere and no function defined inside another (a closure holding a
  pool's state is orchestration, not printing);
* at most :data:`MAX_FUNCTIONS` functions (``add_arguments``, ``run``, ``interrupted`` and a subcommand's
  parsers and runs), none over :data:`MAX_FUNCTION_LINES` lines;
* none of :data:`FORBIDDEN_IMPORTS`: no process pool, thread, subprocess or file-tree work and no torch or numpy
  (a model is trained, run and measured by library code, which the command calls).

Before issue 50 `commands/demo.py` (294 lines: its jobs, process pool and report) broke four of these; it now
calls :func:`medattn.experiments.demo.run_demo`. Each rule is also fed a planted command, so that it is seen to
fail.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from medattn.cli import COMMANDS

MAX_FUNCTIONS = 8
MAX_FUNCTION_LINES = 75
MAX_CONSTANTS = 4
FORBIDDEN_IMPORTS = ("torch", "numpy", "concurrent", "multiprocessing", "threading", "subprocess", "shutil",
                     "asyncio", "socket", "signal")


def command_file(module: str) -> Path:
    """The source of a command module, found without importing it (as ``cli`` reads its help summary)."""
    return Path(importlib.util.find_spec(module).origin)


def _imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and not node.level:
        return [node.module or ""]
    return []


def violations(code: str) -> list[str]:
    """What in a command module's source is more than parsing and printing (empty: nothing)."""
    tree = ast.parse(code)
    found = []
    constants = 0
    for index, node in enumerate(tree.body):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            constants += 1
        elif not (isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef))
                  or (index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))):
            found.append(f"line {node.lineno}: {type(node).__name__} at module level (only imports, constants and "
                         f"functions)")
    if constants > MAX_CONSTANTS:
        found.append(f"{constants} module-level constants (at most {MAX_CONSTANTS}; tables belong to the library)")
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    if len(functions) > MAX_FUNCTIONS:
        found.append(f"{len(functions)} functions (at most {MAX_FUNCTIONS})")
    for function in functions:
        lines = function.end_lineno - function.lineno + 1
        if lines > MAX_FUNCTION_LINES:
            found.append(f"{function.name}: {lines} lines (at most {MAX_FUNCTION_LINES})")
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            found.append(f"line {node.lineno}: class {node.name}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node not in functions:
            found.append(f"line {node.lineno}: function {node.name} inside another function or class")
        for name in _imported(node):
            if name.split(".")[0] in FORBIDDEN_IMPORTS:
                found.append(f"line {node.lineno}: imports {name}")
    return found


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_only_parses_and_prints(command):
    path = command_file(COMMANDS[command])
    assert violations(path.read_text(encoding="utf-8")) == [], \
        f"{path}: move the work into the library and call it from run(args)"


HEAD = '"""Planted command."""\nfrom __future__ import annotations\nimport argparse\n\n'
THIN = HEAD + ("def add_arguments(parser):\n    parser.add_argument('--out')\n\n\n"
               "def run(args):\n    print(args.out)\n    return 0\n")
PLANTED = {
    "a process pool": (HEAD + "from concurrent.futures import ProcessPoolExecutor\n", "imports concurrent.futures"),
    "a pool imported in run": (THIN.replace("    print(args.out)\n", "    import multiprocessing\n"),
                               "imports multiprocessing"),
    "a thread": (THIN.replace("    print", "    import threading\n    print"), "imports threading"),
    "torch": (THIN.replace("    print", "    import torch\n    print"), "imports torch"),
    "a file tree copied": (HEAD + "import shutil\n", "imports shutil"),
    "a class": (THIN + "\n\nclass Job:\n    pass\n", "class Job"),
    "a closure": (THIN.replace("    print(args.out)\n", "    def done(job):\n        print(job)\n"),
                  "function done inside another"),
    "too many functions": (HEAD + "".join(f"def f{i}():\n    pass\n\n\n" for i in range(MAX_FUNCTIONS + 1)),
                           f"{MAX_FUNCTIONS + 1} functions"),
    "a long function": (HEAD + "def run(args):\n" + "    print(args)\n" * MAX_FUNCTION_LINES,
                        f"run: {MAX_FUNCTION_LINES + 1} lines"),
    "a task table": (HEAD + "".join(f"T{i} = {i}\n" for i in range(MAX_CONSTANTS + 1)),
                     f"{MAX_CONSTANTS + 1} module-level constants"),
    "a loop at module level": (HEAD + "for name in ('a', 'b'):\n    print(name)\n", "For at module level"),
}


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_each_rule_fails_on_a_planted_command(case):
    code, expected = PLANTED[case]
    assert any(expected in found for found in violations(code)), violations(code)


def test_a_thin_command_passes():
    assert violations(THIN) == []
