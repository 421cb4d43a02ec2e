"""Paired tests between two arms of different experiments, e.g. a mechanism from scratch and the same mechanism
started from ``medattn pretrain``: the tests ``medattn compare`` runs between arms of one experiment.

    python benchmarks/paired_arms.py runs/scratch/seqnorm runs/pretrained/seqnorm [--seeds 0 1 2] [--resamples 1000]

Each ARM folder holds ``seed_<s>`` run folders with the same test cases (the same task and seeds). Prints the
mean (std) test metric of each arm, the paired t-test over seeds and the paired bootstrap over patients
(difference = second - first), as ``medattn.experiments.compare`` computes them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from medattn.experiments.compare import bootstrap_test, t_test
from medattn.experiments.runs import mean_std, mean_std_text, metric_of


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path, help="the reference arm's folder (seed_<s> inside)")
    parser.add_argument("second", type=Path, help="the other arm's folder")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--resamples", type=int, default=1000)
    args = parser.parse_args()
    folders = {arm: [arm / f"seed_{s}" for s in args.seeds] for arm in (args.first, args.second)}
    values = {arm: [metric_of(json.loads((d / "results.json").read_text())) for d in dirs]
              for arm, dirs in folders.items()}
    for arm, per_seed in values.items():
        print(f"{arm}: {' / '.join(f'{v:.3f}' for v in per_seed)}  mean (std) {mean_std_text(mean_std(per_seed))}")
    paired_t = t_test(values[args.first], values[args.second])
    print(f"paired t-test over seeds: difference {paired_t['difference']:+.4f}, p {paired_t['p_value']}")
    boot = bootstrap_test(folders[args.first], folders[args.second], args.resamples, 0.95, 0)
    print(f"paired bootstrap over patients: difference {boot.get('difference', float('nan')):+.4f} "
          f"({boot.get('ci_low', float('nan')):+.4f} to {boot.get('ci_high', float('nan')):+.4f}), "
          f"p {boot.get('p_value')}" + (f"; {boot['note']}" if "note" in boot else ""))


if __name__ == "__main__":
    main()
