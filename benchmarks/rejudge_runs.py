"""Judge finished runs again with today's :mod:`medattn.train.verdict` and rewrite their ``results.json["learning"]``.

    python benchmarks/rejudge_runs.py RUN_DIR [RUN_DIR ...]

For run folders trained before a change of the verdict's rule (issue 23's realistic-benchmark runs were judged
by the final epoch's train loss first, then by the kept epoch's). Each run's data are built again from its
config.yaml (tables: cheap). Prints one line per run: old and new verdict.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from medattn.config import read_config_file, with_defaults
from medattn.data import build_datasets
from medattn.train.report import read_metrics
from medattn.train.results import learning_verdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (results.json, config.yaml, metrics.csv)")
    for folder in parser.parse_args().runs:
        results = json.loads((folder / "results.json").read_text())
        config = with_defaults(read_config_file(folder / "config.yaml"), str(folder))
        bundle = build_datasets(config["data"], seed=config["seed"])
        before = results.get("learning", {}).get("learned")
        results["learning"] = learning_verdict(config, bundle, read_metrics(folder / "metrics.csv"),
                                               f"val_{results['metric']}", results["best_epoch"])
        (folder / "results.json").write_text(json.dumps(results, indent=1))
        print(f"{folder}: learned {before} -> {results['learning']['learned']} {results['learning']['reasons']}")


if __name__ == "__main__":
    main()
