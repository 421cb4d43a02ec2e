"""The modules a command visits, in order (issue 50's measure of the house): run one ``medattn`` command in this
process with a profiler hook that records every call into a ``medattn`` function, and print the walk.

    python benchmarks/module_walk.py --out walk.json -- train bench/ihc_survival/config.yaml train.epochs=1
    python benchmarks/module_walk.py --depth 1 -- predict RUN_FOLDER --input cases.csv --out preds

A *visit* is a maximal run of consecutive calls in one module; the walk lists the modules in the order they were
first entered, and counts the *package changes*: how often consecutive calls cross from one unit of ``medattn``
(its top-level module or package: ``data``, ``train``, ``vocabulary``, ...; ``--depth 2`` counts sub-packages such
as ``data.readers``) to another. Calls inside torch, numpy and the other libraries are not counted, nor the
package's import-time module bodies. Writes ``--out`` (JSON: the first-entered order, each module's call count, the
unit sequence with repeats collapsed, the number of changes).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def unit_of(module: str, depth: int) -> str:
    """``medattn.data.readers.bags`` -> ``data`` (depth 1) or ``data.readers`` (depth 2)."""
    parts = module.split(".")[1:]
    return ".".join(parts[:depth]) or "medattn"


def record(argv: list[str]) -> list[str]:
    """The ``medattn`` module of every Python function call made while ``medattn`` runs ``argv``, in order."""
    from medattn import cli

    calls: list[str] = []

    def hook(frame, event, arg) -> None:
        if event == "call":
            name = frame.f_globals.get("__name__", "")
            if name.startswith("medattn.") and frame.f_code.co_name != "<module>":
                calls.append(name)

    sys.setprofile(hook)
    try:
        cli.main(argv)
    except SystemExit as stop:
        if stop.code not in (0, None):
            raise
    finally:
        sys.setprofile(None)
    return calls


def walk(calls: list[str], depth: int) -> dict:
    """The first-entered module order, call counts, the unit sequence (repeats collapsed) and its changes."""
    order, counts = [], {}
    for module in calls:
        if module not in counts:
            order.append(module)
        counts[module] = counts.get(module, 0) + 1
    units = [unit_of(m, depth) for m in calls]
    sequence = [u for i, u in enumerate(units) if i == 0 or u != units[i - 1]]
    return {"modules_in_order": order, "calls": counts, "units": sorted(set(units)),
            "unit_sequence": sequence, "package_changes": max(len(sequence) - 1, 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=1, help="unit depth below medattn (default 1)")
    parser.add_argument("--out", type=Path, help="JSON file to write")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the medattn command and its arguments")
    args = parser.parse_args()
    argv = args.command[1:] if args.command[:1] == ["--"] else args.command
    result = walk(record(argv), args.depth)
    result["command"] = ["medattn", *argv]
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    print(f"medattn {' '.join(argv)}: {len(result['modules_in_order'])} modules in {len(result['units'])} units, "
          f"{result['package_changes']} package changes")
    for index, module in enumerate(result["modules_in_order"], 1):
        print(f"{index:3d}. {module} ({result['calls'][module]} calls)")


if __name__ == "__main__":
    main()
