"""The scanner behind the registry house tests (``test_input_kinds.py``, ``test_task_types.py``): the lines of a
module that decide by a registered name instead of asking the registry's object."""

from __future__ import annotations

import ast


def _is_name(node: ast.AST, names) -> bool:
    """Whether ``node`` is one of ``names`` as a literal, or a tuple, list or set literal holding one."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in names
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(_is_name(e, names) for e in node.elts)


def name_branches(code: str, names) -> list[int]:
    """The lines of ``code`` that decide by one of ``names``: a comparison with it (``==``, ``!=``, ``in``, ...), a
    ``match`` case on it, a table keyed by it (the line of each such key) or a look-up with it (a subscript,
    ``.get``/``.pop``/``.setdefault``). Passing the name on (``TaskInfo("binary", "bag", ...)``, a config value) is
    not a branch."""
    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Dict):
            found += [key.lineno for key in node.keys if key is not None and _is_name(key, names)]
            continue
        if isinstance(node, ast.Compare):
            hit = any(_is_name(n, names) for n in (node.left, *node.comparators))
        elif isinstance(node, ast.Subscript):
            hit = _is_name(node.slice, names)
        elif isinstance(node, ast.MatchValue):
            hit = _is_name(node.value, names)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            hit = node.func.attr in ("get", "pop", "setdefault") and bool(node.args) and _is_name(node.args[0], names)
        else:
            hit = False
        if hit:
            found.append(node.lineno)
    return sorted(found)
