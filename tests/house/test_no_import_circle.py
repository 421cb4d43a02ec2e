"""No import circle anywhere in src/medattn, counting every import: at module level, inside functions and under
``if TYPE_CHECKING`` (issue 50: the nine-module circle of data/ lived on under ``TYPE_CHECKING``).

``tests/house/test_architecture.py`` checks the circles of each unit at run time; this one is stricter: one graph of
the whole package (a circle through two units counts too), and an annotation is an arrow like any import, because a
type named in an annotation still has to sit below the code that names it. A circle is broken by moving the leaf type
down (a module of dataclasses that imports nothing above it: ``vocabulary.record.Record``,
``vocabulary.preprocessing.Preprocessing``), not by hiding the import.

The imports are read with :mod:`ast` by ``test_architecture``'s reader (relative imports resolved; ``from package
import name`` is the module ``package.name`` where it exists, else the package).
"""

from __future__ import annotations

from test_architecture import Import, imports_in, source_modules, tree_imports


def circles(imports: list[Import]) -> list[list[str]]:
    """Every strongly connected component of more than one module of the graph of ``imports`` (sorted names,
    sorted by first name). Tarjan's algorithm, iterative."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        graph.setdefault(imp.source, set())
        graph.setdefault(imp.target, set())
        if imp.source != imp.target:
            graph[imp.source].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            after = next(successors, None)
            if after is not None:
                if after not in index:
                    index[after] = low[after] = len(index)
                    stack.append(after)
                    on_stack.add(after)
                    work.append((after, iter(sorted(graph[after]))))
                elif after in on_stack:
                    low[node] = min(low[node], index[after])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while not component or component[-1] != node:
                    component.append(stack.pop())
                    on_stack.discard(component[-1])
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_no_import_circle_in_the_package_counting_type_checking_imports():
    found = circles(tree_imports(run_time=False))
    assert found == [], "import circles (TYPE_CHECKING imports included): " + "; ".join(
        " <-> ".join(circle) for circle in found) + " -- move the leaf type they share down (a module of dataclasses)"


def planted(code: dict[str, str]) -> list[Import]:
    modules = {**source_modules(), **dict.fromkeys(code)}
    return [imp for name, text in code.items() for imp in imports_in(name, text, False, modules)]


def test_a_planted_circle_closed_under_type_checking_is_caught():
    """The circle of issue 50 in miniature: a table module above the readers that annotate with its record."""
    code = {"medattn.data.fake_tables": "from .readers.fake_reader import load\n",
            "medattn.data.readers.fake_reader": "from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
                                                "if TYPE_CHECKING:\n    from ..fake_tables import Record\n"
                                                "def load(record: Record): ...\n",
            "medattn.data.fake_leaf": "from dataclasses import dataclass\n"}
    assert circles(planted(code)) == [["medattn.data.fake_tables", "medattn.data.readers.fake_reader"]]
    # the cure: the record in a leaf both import
    code["medattn.data.readers.fake_reader"] = "from ..fake_leaf import Record\ndef load(record: Record): ...\n"
    assert circles(planted(code)) == []


def test_a_planted_circle_through_two_units_and_a_function_is_caught():
    code = {"medattn.data.fake_a": "def f():\n    from medattn.deploy.fake_b import g\n",
            "medattn.deploy.fake_b": "from ..data import fake_a\n",
            "medattn.deploy.fake_c": "from . import fake_b\n"}  # imports the circle without being in it
    assert circles(planted(code)) == [["medattn.data.fake_a", "medattn.deploy.fake_b"]]
