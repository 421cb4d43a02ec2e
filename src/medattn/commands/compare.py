"""Compare mechanisms or models over seeds, with paired tests: medattn compare CONFIG --attention A B ... --seeds 0 1 2.

Each (arm, seed) is a normal training run of CONFIG in OUT/<arm>/seed_<s>: an arm sets model.attention
(--attention) or model.name (--models; baselines without attention too). Finished runs are skipped and
an interrupted one resumes. Printed and written to OUT (compare.json, compare.csv, compare_tests.csv):
the test metric per seed and mean (std) over seeds per arm, and for each arm against the reference (the
first arm, or --reference) a paired t-test over seeds and a paired bootstrap over patients of the same
test cases.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from medattn.config import load_config
from medattn.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config file or packaged config name")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. train.epochs=10")
    parser.add_argument("--attention", nargs="+", default=[], metavar="MECHANISM",
                        help="one arm per attention mechanism (model.attention)")
    parser.add_argument("--models", nargs="+", default=[], metavar="PRESET",
                        help="one arm per model preset (model.name)")
    parser.add_argument("--seeds", nargs="+", default=["0", "1", "2"], help="run seeds (default 0 1 2)")
    parser.add_argument("--reference", help="the arm the others are tested against (default: the first)")
    parser.add_argument("--out", help="experiment folder (default: the config's out, else runs/<name>-compare)")
    parser.add_argument("--init-from", metavar="CHECKPOINT",
                        help="start every arm's runs from this checkpoint (e.g. a medattn pretrain run), or from "
                             "CHECKPOINT/<arm> where that folder exists (one pretraining run per arm)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    # key=value after --attention/--models/--seeds lands in their lists (nargs="+"): it is an override
    lists = (args.attention, args.models, args.seeds)
    overrides = [*args.overrides, *[t for values in lists for t in values if "=" in t]]
    attention, models, seeds = ([t for t in values if "=" not in t] for values in lists)
    bad = [t for t in seeds if not t.isdigit()]
    if bad:
        raise UserError(f"--seeds takes non-negative ints, got {bad[0]!r}")
    config = load_config(args.config, overrides)
    from medattn.experiments.compare import compare
    from medattn.runtime import distributed

    root = Path(args.out or config["out"] or Path("runs") / f"{config['name']}-compare")
    try:
        compare(config, attention, models, [int(t) for t in seeds], root, reference=args.reference,
                progress=not args.no_progress, init_from=args.init_from)
    finally:
        distributed.cleanup()
    return 0
