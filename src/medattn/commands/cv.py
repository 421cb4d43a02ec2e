"""k-fold cross-validation by patient: medattn cv CONFIG --folds K [key=value ...].

Each fold is a normal training run of CONFIG (with data.folds=K data.fold=k) in OUT/fold_k; every
patient is tested in exactly one fold, and the validation set that picks the best epoch is
data.val_fraction (default 0.15) of the training folds' patients. Finished folds are skipped and an
interrupted one resumes, so the same command continues a cut-off run. The summary (test AUROC, or Dice
per structure and overall, per fold and mean (std) over folds) is printed and written to OUT/cv.csv and
OUT/cv.json.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from medattn.config import load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config file or packaged config name")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. train.epochs=10")
    parser.add_argument("--folds", type=int, default=5, help="number of folds (default 5)")
    parser.add_argument("--out", help="experiment folder (default: the config's out, else runs/<name>-cv)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)
    from medattn.experiments.cv import cross_validate
    from medattn.runtime import distributed

    try:
        cross_validate(config, args.folds, Path(args.out or config["out"] or Path("runs") / f"{config['name']}-cv"),
                       progress=not args.no_progress)
    finally:
        distributed.cleanup()
    return 0
