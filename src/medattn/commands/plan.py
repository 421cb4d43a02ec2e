"""Print the training plan a config gets from its data: medattn plan CONFIG [key=value ...].

Reads the data as training would, prints its fingerprint (cases, class balance, input size, intensities, bag
sizes) and the values planned for the keys the config leaves null (e.g. train.epochs), with the reason for each,
and notes on planned keys the config sets (e.g. data.max_instances below the largest bag). Nothing is trained or
written; medattn train applies the same plan and records it in the run. --search also shows the recipe search a run
gets (recipe.search: the candidates, the successive-halving rounds and the cost in single runs), without training.
"""

from __future__ import annotations

import argparse

from medattn.config import load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config file or packaged config name")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. train.batch_size=8")
    parser.add_argument("--search", action="store_true",
                        help="also show the recipe search's candidates and budget (recipe.search), without training")


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)
    from medattn.data import build_datasets
    from medattn.plan import describe, fingerprint, plan

    bundle = build_datasets(config["data"], seed=config["seed"])
    found = fingerprint(bundle)
    print(describe(found, plan(config, found)))
    if args.search:
        from medattn.experiments.recipe import planned_search
        from medattn.plan.search import describe_search

        print(describe_search(planned_search(config, bundle)))
    return 0
