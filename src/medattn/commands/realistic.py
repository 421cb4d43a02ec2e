"""Write the realistic development benchmark (real anatomy, SYNTHETIC findings): medattn realistic --out DIR.

Tasks (docs/realistic.md): brain_mri_2d (MNI152 T1 slices, PNG + CSV), brain_mri_3d (MNI152 slabs, NIfTI +
CSV), ihc_bags (tile-feature bags of scikit-image's IHC image, CLAM HDF5), ihc_survival and ihc_regression (the
same bags, a hot-spot burden per patient driving overall survival with censoring, or a biomarker level), and the
rest of the bag family: ihc_rare and the fundus members retina_diffuse, retina_count, retina_survival,
retina_large. Each goes to DIR/<task> with a patient-level split column, a config.yaml that trains on it and
probe.json (a one-number probe's AUROC, refused at >= 0.7; C-index >= 0.7 for survival, |Pearson r| >= 0.35 for
regression). Cohort b is another scanner/stain for external evaluation (medattn eval). Needs nilearn and
scikit-image (pip install 'medattn[realistic]'); nothing is downloaded.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from medattn.generators.realistic.tasks import SPLITS, TASKS  # no torch: numpy, scipy and yaml only

    parser.add_argument("--out", required=True, help="folder that receives one sub-folder per task")
    parser.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=list(TASKS), metavar="TASK",
                        help=f"the tasks to write, of {', '.join(TASKS)}")
    parser.add_argument("--cohort", choices=("a", "b"), default="a",
                        help="a: development cohort; b: an external one (other scanner / stain)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the findings, cases and splits")
    parser.add_argument("--cases", type=int, nargs=3, metavar=("TRAIN", "VAL", "TEST"),
                        default=[SPLITS["train"], SPLITS["val"], SPLITS["test"]],
                        help="cases per split (default 180 60 60; an external cohort: 0 0 N)")
    parser.add_argument("--pool", type=int, default=0, metavar="N",
                        help="also write N unlabelled cases (new patients, same generator) for medattn pretrain, as "
                             "pool.csv, named in the config as pretrain.pool (image and volume tasks)")


def run(args: argparse.Namespace) -> int:
    from medattn.generators.realistic import make_task
    from medattn.generators.realistic.tasks import TASKS

    sizes = dict(zip(("train", "val", "test"), args.cases))
    for task in args.tasks:
        pool = args.pool if TASKS[task].data["kind"] != "wsi_bags" else 0
        make_task(task, args.out, seed=args.seed, cohort=args.cohort, sizes=sizes, pool=pool)
    return 0
