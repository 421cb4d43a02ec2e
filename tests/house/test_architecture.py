"""The floor plan of docs/architecture.md, enforced: every import under src/medattn obeys the doc's two tables.

The imports are read with :mod:`ast`, not by importing: every ``import`` statement at module level, inside a
function or under ``if TYPE_CHECKING``, relative imports resolved. ``from package import name`` is an import of
the module ``package.name`` where that module exists, else of ``package``. A *unit* is a top-level module or
package of medattn (``medattn`` itself for its ``__init__.py``).

* "Layers": a unit imports itself and units of lower layers; anything else only through the modules its row
  names. Every unit of the tree has exactly one row.
* "Rules": a unit must not import the units named, except the modules named (runtime never imports train,
  deploy, explain or commands; models import nothing of data but ``medattn.data.bag_rows``; no command imports
  another command).

* "Cycles": inside each unit, the modules import one another without a circle (a strongly connected component
  of more than one module), counting imports at module level and inside functions. Imports under
  ``if TYPE_CHECKING`` are left out of this one check: they never run, and a type named in an annotation (a
  loader takes a ``Record``) is not a dependency of the code's order.

Each checker is also fed fake violations, so that each rule is seen to fail.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
DOC = ROOT / "docs" / "architecture.md"

@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (or package)
    line: int

    def __str__(self) -> str:
        return f"{self.source} (line {self.line}) imports {self.target}"


@dataclass(frozen=True)
class Rule:
    unit: str
    forbidden: frozenset[str]
    allowed: tuple[str, ...]


# --- reading the tree ------------------------------------------------------------------------------------------

def source_modules(src: Path = SRC) -> dict[str, tuple[Path, bool]]:
    """module name -> (file, whether it is a package's ``__init__``) for every module under ``src/medattn``."""
    found = {}
    for path in sorted((src / "medattn").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def type_checking_nodes(tree: ast.AST) -> set[ast.AST]:
    """The nodes inside the body of an ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) block."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test).split("."):
            inside.update(child for statement in node.body for child in ast.walk(statement))
    return inside


def imports_in(module: str, code: str, package: bool, modules, run_time: bool = False) -> list[Import]:
    """The imports of medattn modules in ``code``, the source of ``module``; ``modules``: the known module names;
    ``run_time``: leave out the imports under ``if TYPE_CHECKING``."""
    here = module if package else module.rpartition(".")[0]
    found = []
    tree = ast.parse(code)
    skipped = type_checking_nodes(tree) if run_time else set()
    for node in ast.walk(tree):
        if node in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = here.split(".")[:len(here.split(".")) - node.level + 1]
                origin = ".".join(parts + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            targets = [f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules else origin
                     for alias in node.names]
        else:
            continue
        found += [Import(module, name, node.lineno) for name in dict.fromkeys(targets)
                  if name == "medattn" or name.startswith("medattn.")]
    return found


def tree_imports(run_time: bool = False) -> list[Import]:
    """Every import under src/medattn; ``run_time``: without those under ``if TYPE_CHECKING``."""
    modules = source_modules()
    return [imp for name, (path, package) in modules.items()
            for imp in imports_in(name, path.read_text(encoding="utf-8"), package, modules, run_time)]


def unit(module: str) -> str:
    return "medattn" if module == "medattn" else module.split(".")[1]


def within(module: str, prefixes) -> bool:
    """Whether ``module`` is one of ``prefixes`` or inside one of them."""
    return any(module == p or module.startswith(p + ".") for p in prefixes)


# --- reading the doc -------------------------------------------------------------------------------------------

def table_after(text: str, heading: str, header: list[str]) -> list[list[str]]:
    """The cells of the first markdown table after the line ``heading``, whose header must be ``header``."""
    lines = text.splitlines()
    if heading not in lines:
        raise AssertionError(f"docs/architecture.md has no heading {heading!r}")
    start = next(i for i in range(lines.index(heading), len(lines)) if lines[i].startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    if rows[0] != header or not re.fullmatch(r"[-| :]+", "|".join(rows[1])):
        raise AssertionError(f"the table under {heading!r} must have the header {header}, got {rows[0]}")
    return rows[2:]


def names(cell: str) -> list[str]:
    """The `backticked` names of a cell."""
    return re.findall(r"`([^`]+)`", cell)


def layer_table(text: str) -> tuple[dict[str, int], dict[str, tuple[str, ...]]]:
    """(unit -> layer, unit -> the modules it may import besides lower layers) of the "Layers" table."""
    layers, also = {}, {}
    for number, units, extra in table_after(text, "## Layers", ["layer", "units", "may also import"]):
        for name in names(units):
            if name in layers:
                raise AssertionError(f"unit {name!r} has two rows in the layer table")
            layers[name] = int(number)
            also[name] = tuple(names(extra))
    return layers, also


def rule_table(text: str) -> list[Rule]:
    return [Rule(name, frozenset(names(forbidden)), tuple(names(allowed)))
            for units, forbidden, allowed in table_after(text, "## Rules", ["unit", "must not import", "except"])
            for name in names(units)]


# --- the checks ------------------------------------------------------------------------------------------------

def layer_violations(imports, layers: dict[str, int], also: dict[str, tuple[str, ...]]) -> list[tuple[Import, str]]:
    found = []
    for imp in imports:
        a, b = unit(imp.source), unit(imp.target)
        unplaced = [u for u in (a, b) if u not in layers]
        if unplaced:
            found.append((imp, f"unit {unplaced[0]!r} has no row in the layer table of docs/architecture.md"))
        elif a != b and layers[b] >= layers[a] and not within(imp.target, also.get(a, ())):
            found.append((imp, f"layer {layers[a]} ({a}) may not import layer {layers[b]} ({b})"))
    return found


def rule_violations(imports, rules: list[Rule]) -> list[tuple[Import, str]]:
    return [(imp, f"{rule.unit} must not import {unit(imp.target)}") for rule in rules for imp in imports
            if unit(imp.source) == rule.unit and unit(imp.target) in rule.forbidden
            and not within(imp.target, rule.allowed)]


def unused_allowances(imports, also: dict[str, tuple[str, ...]], rules: list[Rule]) -> list[str]:
    """Exceptions of either table that no import uses any more (the doc would promise what the code does not)."""
    allowances = [(u, m) for u, modules in also.items() for m in modules]
    allowances += [(rule.unit, m) for rule in rules for m in rule.allowed]
    return [f"{u} may import {m}" for u, m in allowances
            if not any(unit(imp.source) == u and within(imp.target, (m,)) for imp in imports)]


def import_cycles(imports) -> list[list[str]]:
    """The circles among the modules of each unit: every strongly connected component of more than one module of
    the graph of ``imports`` within one unit (sorted module names, sorted by first name). Tarjan's algorithm."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if imp.source != imp.target and unit(imp.source) == unit(imp.target):
            graph.setdefault(imp.source, set()).add(imp.target)
            graph.setdefault(imp.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for after in sorted(graph[node]):
            if after not in index:
                visit(after)
                low[node] = min(low[node], low[after])
            elif after in stack:
                low[node] = min(low[node], index[after])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


@pytest.fixture(scope="module")
def doc():
    text = DOC.read_text(encoding="utf-8")
    return (*layer_table(text), rule_table(text))


@pytest.fixture(scope="module")
def imports():
    return tree_imports()


def test_every_unit_has_one_row_in_the_layer_table(doc):
    layers, _, rules = doc
    units = {unit(name) for name in source_modules()}
    assert sorted(units - set(layers)) == [], "place each new unit in the layer table of docs/architecture.md"
    assert sorted(set(layers) - units) == [], "the layer table names units that do not exist"
    assert {rule.unit for rule in rules} <= units


def test_imports_follow_the_layers(doc, imports):
    layers, also, _ = doc
    assert [f"{imp}: {why}" for imp, why in layer_violations(imports, layers, also)] == []


def test_imports_follow_the_rules(doc, imports):
    assert [f"{imp}: {why}" for imp, why in rule_violations(imports, doc[2])] == []


def test_every_exception_in_the_doc_is_used(doc, imports):
    layers, also, rules = doc
    assert unused_allowances(imports, also, rules) == []


def test_no_unit_has_an_import_cycle_among_its_modules():
    assert import_cycles(tree_imports(run_time=True)) == [], \
        "modules of one unit import one another in a circle: move what both need into a module below them"


def test_the_doc_states_the_rules_of_issue_39(doc):
    rules = {rule.unit: rule for rule in doc[2]}
    assert {"train", "deploy", "explain", "commands"} <= rules["runtime"].forbidden
    assert rules["runtime"].allowed == ()
    assert "data" in rules["models"].forbidden and rules["models"].allowed == ("medattn.data.bag_rows",)
    assert "commands" in rules["commands"].forbidden and rules["commands"].allowed == ()


# --- the checkers fail where they should -----------------------------------------------------------------------

def fake(module: str, code: str, package: bool = False) -> list[Import]:
    return imports_in(module, code, package, source_modules())


def test_imports_are_read_at_every_level():
    code = ("import os\nimport medattn.errors\nfrom medattn import text\n"
            "from medattn.data.kinds import bags\nfrom medattn.data import build_datasets\n"
            "from . import threshold\nfrom ..train.loop import fit\nfrom typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from medattn.explain import core\n"
            "def f():\n    from .. import config\n    class C:\n        def g(self):\n"
            "            import medattn.commands.predict as p\n")
    targets = {imp.target for imp in fake("medattn.runtime.fake", code)}
    assert targets == {"medattn.errors", "medattn.text", "medattn.data.kinds.bags", "medattn.data",
                       "medattn.runtime.threshold", "medattn.train.loop", "medattn.explain.core",
                       "medattn.commands.predict", "medattn.config"}
    assert {imp.target for imp in fake("medattn.deploy", "from .export import FORMATS", package=True)} == \
        {"medattn.deploy.export"}


@pytest.mark.parametrize("module, code, expected", [
    ("medattn.runtime.fake", "from medattn.train.loop import fit", "runtime must not import train"),
    ("medattn.runtime.fake", "def f():\n    from ..deploy import export", "runtime must not import deploy"),
    ("medattn.runtime.fake", "import medattn.explain.core", "runtime must not import explain"),
    ("medattn.runtime.fake", "from medattn.commands import predict", "runtime must not import commands"),
    ("medattn.models.fake", "def f():\n    from ..data.bags import read_slide", "models must not import data"),
    ("medattn.models.fake", "from medattn.data import build_datasets", "models must not import data"),
    ("medattn.commands.fake", "from .evaluate import run", "commands must not import commands"),
    ("medattn.commands.fake", "import medattn.commands.train", "commands must not import commands"),
], ids=["runtime-train", "runtime-deploy-in-function", "runtime-explain", "runtime-commands", "models-data-bags",
        "models-data-package", "commands-relative", "commands-absolute"])
def test_each_rule_reports_a_fake_violation(doc, module, code, expected):
    layers, also, rules = doc
    assert [why for _, why in rule_violations(fake(module, code), rules)] == [expected]
    if module.startswith("medattn.runtime"):  # the same import goes up the layers too
        assert len(layer_violations(fake(module, code), layers, also)) == 1


def test_the_allowed_exceptions_pass(doc):
    layers, also, rules = doc
    allowed = fake("medattn.models.fake", "from ..data.bag_rows import read_rows") \
        + fake("medattn.commands.fake", "from medattn.cli_args import positive_int")
    assert rule_violations(allowed, rules) == [] and layer_violations(allowed, layers, also) == []


def test_the_layer_checker_reports_upward_same_layer_and_unplaced_imports():
    layers, also = {"low": 0, "high": 1, "side": 1}, {"side": ("medattn.high.allowed",)}
    cases = {"medattn.low.a imports medattn.high.b": "layer 0 (low) may not import layer 1 (high)",
             "medattn.high.a imports medattn.side.b": "layer 1 (high) may not import layer 1 (side)",
             "medattn.new.a imports medattn.low.b": "unit 'new' has no row in the layer table of docs/architecture.md"}
    imports = [Import(*pair.split(" imports "), 1) for pair in cases]
    assert [why for _, why in layer_violations(imports, layers, also)] == list(cases.values())
    fine = [Import("medattn.high.a", "medattn.low.b", 1), Import("medattn.side.a", "medattn.high.allowed.x", 1),
            Import("medattn.low.a", "medattn.low.b", 1)]
    assert layer_violations(fine, layers, also) == []
    assert unused_allowances(fine[:1], also, []) == ["side may import medattn.high.allowed"]


def test_the_doc_tables_are_read_strictly():
    text = ("## Layers\n\n| layer | units | may also import |\n|---|---|---|\n"
            "| 0 | `a`, `b` | |\n| 1 | `c` | `medattn.a.x` |\n")
    assert layer_table(text) == ({"a": 0, "b": 0, "c": 1}, {"a": (), "b": (), "c": ("medattn.a.x",)})
    with pytest.raises(AssertionError, match="two rows"):
        layer_table(text + "| 2 | `a` | |\n")
    with pytest.raises(AssertionError, match="header"):
        layer_table(text.replace("may also import", "may import"))
    with pytest.raises(AssertionError, match="no heading"):
        rule_table(text)


def test_the_cycle_checker_finds_a_fake_cycle():
    code = {"medattn.data.fake_a": "from . import fake_b\nfrom .fake_d import z",
            "medattn.data.fake_b": "def f():\n    from .fake_c import x",  # a function-level import counts
            "medattn.data.fake_c": "import medattn.data.fake_a\nfrom medattn.deploy import fake_e",
            "medattn.data.fake_d": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .fake_a import y",
            "medattn.deploy.fake_e": "from medattn.data import fake_a"}  # across units: not a circle of a unit
    modules = {**source_modules(), **dict.fromkeys(code)}

    def graph(run_time: bool) -> list[Import]:
        return [imp for name, text in code.items() for imp in imports_in(name, text, False, modules, run_time)]

    circle = ["medattn.data.fake_a", "medattn.data.fake_b", "medattn.data.fake_c"]
    assert import_cycles(graph(run_time=True)) == [circle]
    assert import_cycles(graph(run_time=False)) == [sorted([*circle, "medattn.data.fake_d"])]  # the annotation's
    assert import_cycles([imp for imp in graph(run_time=True) if imp.source != "medattn.data.fake_b"]) == []
