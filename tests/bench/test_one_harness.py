"""One bench harness (issue 50): every bench of ``cli.BENCHES`` measures through :mod:`medattn.bench.common`.

Generated from the table: the module of each bench (``medattn.diffusion.benchmark`` included) and every module under
``src/medattn/bench/`` is read with :mod:`ast`, not imported, and fails on what the harness owns:

* starting a process: ``subprocess``, ``multiprocessing``, ``concurrent.futures``, ``pty``, ``os.system`` / ``popen``
  / ``fork`` / ``spawn*`` / ``exec*``, ``sys.executable`` (:func:`~medattn.bench.common.run_isolated`);
* reading memory: a path in ``/proc/`` (a string, or an f-string, starting with it), ``resource`` / ``psutil``
  (:func:`~medattn.bench.common.peak_rss_bytes`, :func:`~medattn.bench.common.current_rss_bytes`,
  :func:`~medattn.bench.common.reset_peak_rss`);
* taking medians: ``statistics``, a call of anything named ``median``
  (:func:`~medattn.bench.common.interleaved_rounds`);
* deciding what a sweep skips: a function of its own named ``*skip_reason`` (:func:`~medattn.bench.common.skip_reason`).

The harness itself (``bench/common.py``, and ``bench/machine.py``, which reads ``/proc/cpuinfo``) is exempt, but it
starts Python with a module and data (``-m``), never with source (``-c``). Every bench module imports the harness.
Planted snippets, the helpers the benches had before (issue 50), prove that each rule fires.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from medattn.cli import BENCHES, _find_spec

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "medattn"
HARNESS = {PACKAGE / "bench" / "common.py", PACKAGE / "bench" / "machine.py"}
BENCH_FILES = {name: Path(_find_spec(module).origin) for name, module in BENCHES.items()}
SCANNED = sorted({*BENCH_FILES.values(), *(PACKAGE / "bench").glob("*.py")} - HARNESS)

PROCESS_MODULES = {"subprocess", "multiprocessing", "concurrent", "pty", "torch.multiprocessing"}
MEMORY_MODULES = {"resource", "psutil"}
MEDIAN_MODULES = {"statistics"}
OS_PROCESS_CALLS = ("system", "popen", "fork", "forkpty", "spawn", "exec", "posix_spawn")


def _root(name: str) -> str:
    return name if name == "torch.multiprocessing" else name.split(".")[0]


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def own_harness(source: str) -> list[str]:
    """What ``source`` does that only :mod:`medattn.bench.common` may do, one line each (empty: nothing)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        modules = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        for module in modules:
            for kind, table in (("starts a process", PROCESS_MODULES), ("reads memory", MEMORY_MODULES),
                                ("takes medians", MEDIAN_MODULES)):
                if module in table or _root(module) in table:
                    found.append(f"line {line}: {kind}: imports {module}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("/proc/"):
            found.append(f"line {line}: reads memory: {node.value!r}")
        if isinstance(node, ast.Attribute) and _dotted(node) == "sys.executable":
            found.append(f"line {line}: starts a process: sys.executable")
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name.startswith("os.") and name[3:].startswith(OS_PROCESS_CALLS):
                found.append(f"line {line}: starts a process: {name}")
            if name.rpartition(".")[2] == "median":
                found.append(f"line {line}: takes medians: {name}()")
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.endswith("skip_reason"):
            found.append(f"line {line}: decides what a sweep skips: def {node.name}")
    return found


def _imports_harness(path: Path) -> bool:
    """Whether the module at ``path`` imports :mod:`medattn.bench.common` (``.common`` inside ``bench/``)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            absolute = node.module if node.level == 0 else (
                f"medattn.bench.{node.module}" if path.parent.name == "bench" and node.level == 1 else None)
            if absolute == "medattn.bench.common":
                return True
        if isinstance(node, ast.Import) and any(alias.name == "medattn.bench.common" for alias in node.names):
            return True
    return False


def test_the_scan_covers_every_bench_of_the_table():
    assert set(BENCH_FILES) == set(BENCHES) and "diffusion" in BENCHES
    assert {*BENCH_FILES.values()} <= set(SCANNED)
    assert PACKAGE / "diffusion" / "benchmark.py" in SCANNED


@pytest.mark.parametrize("path", SCANNED, ids=[p.relative_to(PACKAGE).as_posix() for p in SCANNED])
def test_no_bench_keeps_its_own_harness(path):
    assert own_harness(path.read_text(encoding="utf-8")) == [], f"{path.relative_to(PACKAGE)} measures by itself"


@pytest.mark.parametrize("name", sorted(BENCHES))
def test_every_bench_measures_through_the_harness(name):
    assert _imports_harness(BENCH_FILES[name]), f"medattn bench {name} does not import medattn.bench.common"


def test_the_harness_starts_python_with_a_module_and_data_not_source():
    source = (PACKAGE / "bench" / "common.py").read_text(encoding="utf-8")
    constants = {node.value for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Constant)}
    assert "-m" in constants and "-c" not in constants


#: What the benches kept before issue 50 (bench/pam.py, bench/binary.py, bench/attention.py), and other forms.
PLANTED = {
    "pam's worker": '''
import json, subprocess, sys
def _run_worker(config):
    code = "from medattn.bench.pam import measure; print(measure(json.loads(sys.argv[1])))"
    return subprocess.run([sys.executable, "-c", code, json.dumps(config)], capture_output=True, text=True)
''',
    "pam's VmRSS reader": '''
def _status_bytes(field):
    with open("/proc/self/status") as handle:
        return [line for line in handle if line.startswith(field)]
''',
    "pam's peak reset": '''
def _reset_peak():
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")
''',
    "binary's interleaved medians": '''
import statistics
def interleaved_medians(fns, repeats):
    return {name: statistics.median(times) for name, times in fns.items()}
''',
    "a median from numpy": "import numpy as np\nseconds = np.median(times)\n",
    "a median imported by name": "from statistics import median\n",
    "a process by alias": "import subprocess as sp\nsp.run(['ls'])\n",
    "a process from a name": "from subprocess import Popen\n",
    "a process pool": "from concurrent.futures import ProcessPoolExecutor\n",
    "a process of os": "import os\nos.system('true')\n",
    "a pid's memory": "text = open(f'/proc/{pid}/status').read()\n",
    "getrusage": "import resource\npeak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n",
    "attention's skip reason": "def _skip_reason(n, times, memories, over_time, budget_s, memory_budget):\n    pass\n",
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_the_scan_catches_a_planted_harness(name):
    assert own_harness(PLANTED[name]), f"{name} not caught"


def test_the_scan_leaves_the_harness_calls_alone():
    calls = '''
from medattn.bench.common import interleaved_rounds, run_isolated, peak_rss_bytes, skip_reason
rows = run_isolated(measure, {"config": config}, check=True)
seconds = interleaved_rounds({"call": call}, 3).medians()
status = skip_reason(n, times, budget_s)
'''
    assert own_harness(calls) == []
