"""One writer on the ground floor (issue 50): the output module's path primitives are its own, writers take a folder,
and the metrics and plot modules draw without saving.

Read with :mod:`ast`, not by importing; ``from medattn import outputs``, ``import medattn.outputs as o`` and relative
imports (``from ..outputs import x``, ``from .. import outputs``) are resolved.

* No module outside ``medattn.outputs`` (src, tests, benchmarks) uses a name of it with a leading underscore: its
  private helpers (``_safe_name``, ``_temporary_name``, ``_csv_text``, ...) are the policy's internals.
* The path primitives (:data:`PRIMITIVES`: a path, no policy) are used in ``src/`` only by the modules of
  :data:`NOT_YET_CONVERTED`, each with the names it still uses: a list that only shrinks. A new writer takes an
  ``OutputFolder`` (the command's, or ``OutputFolder.within(folder)`` for a folder whose policy its caller applied),
  never a bare path; a module converted leaves the list (the test fails until its entry goes).
* The metrics and plot modules (:func:`metrics_and_plot_modules`) write nothing, by the write scan of
  ``write_scan.py`` (every form of a write it knows), and import nothing of ``medattn.outputs``: they return figures
  and values, and their callers save through the folder.

Each checker is also fed planted code, so that it is seen to fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from write_scan import scan

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "medattn"
OUTPUTS = "medattn.outputs"

#: The public path primitives of medattn.outputs: they write to any path and decide nothing.
PRIMITIVES = frozenset({"atomic", "save_csv", "save_dicts", "append_csv", "save_figure", "remove"})
#: The former primitives made private once no writer outside the module used them: each a leading underscore or gone.
MADE_PRIVATE = frozenset({"save_text", "save_json", "save_image", "atomic_write", "file_stem", "safe_name",
                          "temporary_name", "csv_text", "dicts_text"})

#: Modules of src/medattn (relative paths) that still write through a path primitive, with the primitives they use:
#: the first hop of issue 50 is done (metrics, config, slide heatmaps, benches, caches, pretrain, eval's diagram,
#: compare's figure, the report pages, results.json, the case pictures, survival calibration,
#: explain's summary and tile files, bag and NIfTI files, the task types' split writers and a run's metrics.csv and
#: training curves); these take a path from a long caller chain (the slide generators, the run-folder transaction).
NOT_YET_CONVERTED: dict[str, frozenset[str]] = {
    "generators/slides.py": frozenset({"atomic"}),  # write_synthetic_slide(path): the slide generators
    "train/rundir.py": frozenset({"remove"}),  # the run-folder transaction itself (a writer of its own)
}


def metrics_and_plot_modules(package: Path = PACKAGE) -> list[Path]:
    """The top-level metric modules (``metrics*.py``, ``clinical_metrics.py``), ``survival_plots.py`` and the bench's
    figures (``bench/plots.py``)."""
    found = [*package.glob("metrics*.py"), package / "clinical_metrics.py", package / "survival_plots.py",
             package / "bench" / "plots.py"]
    return sorted(path for path in found if path.is_file())


def module_name(path: Path, package: Path = PACKAGE) -> str:
    """``<package>/a/b.py`` -> ``medattn.a.b`` (a package's ``__init__`` its package); a test or bench file: its
    stem (it has no relative imports)."""
    try:
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
    except ValueError:
        return path.stem
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def uses_of_outputs(code: str, module: str, package: bool = False) -> set[str]:
    """The names of medattn.outputs that ``code`` (the source of ``module``) imports or reads as an attribute of the
    module: ``from medattn.outputs import x`` (absolute or relative), ``outputs.x`` after ``from medattn import
    outputs`` or ``import medattn.outputs as o``."""
    here = module if package else module.rpartition(".")[0]
    tree = ast.parse(code)
    names, aliases = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            origin = node.module or ""
            if node.level:
                parts = here.split(".")[:len(here.split(".")) - node.level + 1]
                origin = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                if origin == OUTPUTS:
                    names.add(alias.name)
                elif f"{origin}.{alias.name}" == OUTPUTS:
                    aliases.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            aliases.update(alias.asname for alias in node.names if alias.name == OUTPUTS and alias.asname)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            names.add(node.attr)
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
              and ast.unparse(node.value) == OUTPUTS):  # import medattn.outputs; medattn.outputs.x
            names.add(node.attr)
    return names


def files(*roots: Path) -> list[Path]:
    return sorted(path for root in roots for path in root.rglob("*.py") if ".venv" not in path.parts)


def private_uses(paths) -> list[str]:
    found = []
    for path in paths:
        if path == PACKAGE / "outputs.py":
            continue
        used = uses_of_outputs(path.read_text(encoding="utf-8"), module_name(path), path.name == "__init__.py")
        found += [f"{path.relative_to(ROOT)} uses medattn.outputs.{name}" for name in sorted(used)
                  if name.startswith("_") and not name.startswith("__")]
    return found


def primitive_users(package: Path = PACKAGE) -> dict[str, frozenset[str]]:
    found = {}
    for path in files(package):
        if path == package / "outputs.py":
            continue
        used = uses_of_outputs(path.read_text(encoding="utf-8"), module_name(path, package),
                               path.name == "__init__.py")
        if used & PRIMITIVES:
            found[path.relative_to(package).as_posix()] = frozenset(used & PRIMITIVES)
    return found


def saving(path: Path) -> list[str]:
    """What the module ``path`` writes (the write scan) or imports of medattn.outputs."""
    code = path.read_text(encoding="utf-8")
    found = [f"line {line} ({function}): {what}" for line, function, what in scan(code)]
    found += [f"imports medattn.outputs.{name}" for name in sorted(uses_of_outputs(code, module_name(path)))]
    return found


def test_no_module_uses_a_private_name_of_the_output_module():
    assert private_uses(files(ROOT / "src", ROOT / "tests", ROOT / "benchmarks")) == []


def test_only_the_listed_modules_still_write_through_a_path_primitive():
    """A writer takes a folder: a new use of a path primitive fails, and so does an entry that is no longer used (a
    module converted leaves the list)."""
    assert primitive_users() == NOT_YET_CONVERTED


def test_the_metrics_and_plot_modules_never_save():
    modules = metrics_and_plot_modules()
    assert {"metrics.py", "clinical_metrics.py", "survival_plots.py", "plots.py"} <= {p.name for p in modules}
    assert {path.relative_to(PACKAGE).as_posix(): saving(path) for path in modules} == \
        {path.relative_to(PACKAGE).as_posix(): [] for path in modules}


def test_the_output_module_names_no_primitive_it_lacks():
    code = (PACKAGE / "outputs.py").read_text(encoding="utf-8")
    defined = {node.name for node in ast.parse(code).body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    assert PRIMITIVES <= defined and "OutputFolder" in defined
    assert defined & MADE_PRIVATE == set()


# --- the checkers fail where they should -----------------------------------------------------------------------

@pytest.mark.parametrize("code, module, expected", [
    ("from medattn.outputs import _safe_name", "medattn.slides.fake", {"_safe_name"}),
    ("from ..outputs import save_json, OutputFolder", "medattn.data.fake", {"save_json", "OutputFolder"}),
    ("from ...outputs import atomic", "medattn.data.readers.fake", {"atomic"}),
    ("from .. import outputs\ndef f(p):\n    outputs._csv_text(None, [])", "medattn.train.fake", {"_csv_text"}),
    ("from medattn import outputs as o\no.save_figure(p, f)", "medattn.bench.fake", {"save_figure"}),
    ("import medattn.outputs as out\nout._temporary_name(p)", "test_fake", {"_temporary_name"}),
    ("import medattn.outputs\nmedattn.outputs.remove(p)", "test_fake", {"remove"}),
    ("from medattn.explain.outputs import save_dicts\nfrom .outputs import colour_range", "medattn.explain.fake",
     set()),  # explain's own module named outputs is another module
], ids=["absolute", "relative", "relative-deep", "module-attribute", "module-alias", "import-as", "dotted",
        "explain-outputs"])
def test_the_reader_finds_every_use(code, module, expected):
    assert uses_of_outputs(code, module) == expected


def test_a_planted_private_use_and_a_new_primitive_user_fail(tmp_path):
    package = tmp_path / "src" / "medattn"
    (package / "data").mkdir(parents=True)
    (package / "data" / "sneaky.py").write_text("from ..outputs import _safe_name, save_csv\n")
    used = uses_of_outputs((package / "data" / "sneaky.py").read_text(), "medattn.data.sneaky")
    assert used == {"_safe_name", "save_csv"}
    assert primitive_users(package) == {"data/sneaky.py": frozenset({"save_csv"})}


def test_a_planted_save_in_a_metrics_module_fails(tmp_path):
    planted = {"metrics_fake.py": "def plot(fig, path):\n    fig.savefig(path)\n",
               "metrics_other.py": "from medattn.outputs import save_figure\n",
               "metrics_clean.py": "def figure():\n    import matplotlib.pyplot as plt\n    return plt.figure()\n"}
    for name, code in planted.items():
        (tmp_path / name).write_text(code)
    found = {path.name: saving(path) for path in metrics_and_plot_modules(tmp_path)}
    assert found["metrics_fake.py"] and found["metrics_other.py"] == ["imports medattn.outputs.save_figure"]
    assert found["metrics_clean.py"] == []
