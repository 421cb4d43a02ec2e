"""Train a baseline and softmax, SimA and seqnorm ViTs on the three SYNTHETIC tasks; print a Table-2-style table.

The built-in benchmark (generated from a seed, no download; not real patients): chest-radiograph
phantoms (cardiomegaly), breast-MRI-like volumes (enhancing lesion) and whole-slide feature bags
(tumour instances). The baseline column is what a user would pick instead of a transformer: a small
2D / tiny 3D ResNet for images and volumes, gated attention-MIL for bags. Each task is rendered once per
worker process (the synthetic kinds' ``cache``) and shared by the runs there, with the kinds' default training
augmentation drawn afresh on every access; each run is a full `medattn train` run (best validation epoch
tested, bootstrap CI) at CPU-sized settings with the same budget (the baselines with their own optimiser
settings, :mod:`medattn.train.defaults`). Runs train ``--jobs`` at a time, each in a process of its own with
``--threads`` threads (default: as many as the free cores allow), to the same numbers as one after the other.
A run that did not learn (:mod:`medattn.train.verdict`) shows as such, not as a number.
The report folder (--out) gets table.csv, table.json, roc_<task>_<mechanism>.png and the runs, and, to show
why one would pick linear attention, scaling.csv/json/png: the time and peak memory of one SeqNorm and one
softmax attention layer as the token count grows, measured in the same run. What a demo writes there is recorded
in ``.medattn-demo.json``; a later demo replaces only that (:meth:`OutputFolder.claim`): a user's file or run in the
folder stays, and one in the way of a demo output is refused, named.
--quick is a seconds-long smoke version (tiny models and data; its numbers mean nothing).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from medattn.cli_args import positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from medattn.experiments.demo import TASKS

    parser.add_argument("--out", default="reports/demo",
                        help="report folder (default: reports/demo; an earlier demo's outputs there are replaced, "
                             "nothing else)")
    parser.add_argument("--quick", action="store_true", help="seconds-long smoke version (numbers mean nothing)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every run and of the generated data")
    parser.add_argument("--threads", type=positive_int, default=1,
                        help="torch threads per run (default 1: these small models gain little from more, and a "
                             "busy machine makes more threads much slower)")
    parser.add_argument("--jobs", type=positive_int, default=None,
                        help="runs trained at once, each in a process of its own with --threads threads (default: "
                             "the cores this process may use, OMP_NUM_THREADS if set, divided by --threads)")
    parser.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=list(TASKS), metavar="TASK",
                        help=f"the tasks to train on, of {', '.join(TASKS)}")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    """The library's demo (:func:`medattn.experiments.demo.run_demo`), its scaling section measured by
    :func:`medattn.bench.demo_scaling.scaling_section`; each line it reports is printed as it comes."""
    from medattn.bench.common import environment
    from medattn.bench.demo_scaling import scaling_section
    from medattn.experiments.demo import run_demo

    run_demo(Path(args.out), args.tasks, quick=args.quick, seed=args.seed, threads=args.threads, jobs=args.jobs,
             progress=not args.no_progress, scaling=scaling_section, environment=environment,
             log=lambda line: print(line, flush=True))
    return 0
