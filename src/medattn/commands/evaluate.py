"""Evaluate a checkpoint on a data config (an external cohort too): medattn eval CHECKPOINT DATA_CONFIG [key=value ...].

CHECKPOINT is a run folder (its best checkpoint), a checkpoint folder or its model.safetensors.
DATA_CONFIG is a run config (file or packaged name) whose `data` section is used; key=value pairs
override it (e.g. data.csv=/data/external.csv). A table whose rows are all `test` (or
data.test_fraction=1 data.val_fraction=0) is an external cohort. Prints the AUROC with its patient-level CI,
sensitivity and specificity at the checkpoint's stored threshold and the expected calibration error;
--per-patient mean|max scores patients with several images or slides too. Writes predictions_<split>.csv,
roc_<split>.png, reliability_<split>.png and eval.json to --out (default: eval_<config name>_<split> in the
checkpoint's run folder); see medattn.train.evaluate. --device picks where the model runs (default: the best this
machine has), whatever device it was trained on.
"""

from __future__ import annotations

import argparse

from medattn.cli_args import add_device_option, positive_int
from medattn.config import load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="run folder, checkpoint folder or model.safetensors")
    parser.add_argument("data_config", help="config file or packaged config name; its data section is used")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="overrides of the data config")
    parser.add_argument("--split", choices=("train", "val", "test"), default="test",
                        help="the split of the data config that is evaluated")
    parser.add_argument("--per-patient", choices=("mean", "max"), default=None,
                        help="also score per patient: the mean or max of each patient's probabilities")
    parser.add_argument("--out", help="output folder (default: eval_<name>_<split> in the checkpoint's run folder)")
    parser.add_argument("--overwrite", action="store_true", help="replace the files of an earlier evaluation in --out")
    parser.add_argument("--batch-size", type=positive_int, default=None, help="default: the run's eval batch size")
    parser.add_argument("--skip-bad", action="store_true", help="skip unreadable or invalid samples and count them")
    parser.add_argument("--accept-features", action="store_true",
                        help="bag models: evaluate bags whose features were made otherwise than the training features "
                             "(another extractor, tile size, mpp or layout; refused by default); eval.json's "
                             "features_accepted says how each differs")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_device_option(parser)


def run(args: argparse.Namespace) -> int:
    config = load_config(args.data_config, args.overrides)  # config errors answer before torch is imported
    from medattn.train.evaluate import evaluate, format_result

    result = evaluate(args.checkpoint, config, split=args.split, out=args.out, per_patient=args.per_patient,
                      batch_size=args.batch_size, skip_bad=args.skip_bad, progress=not args.no_progress,
                      overwrite=args.overwrite, accept_features=args.accept_features, device=args.device)
    if result:
        if result["skipped_samples"]:
            print(f"skipped {result['skipped_samples']} bad sample(s) (--skip-bad)")
        tag = " [SYNTHETIC data]" if result["synthetic"] else ""
        print(f"{format_result(result)}{tag}\n-> {result['out']} (ran on {result['device']})")
    return 0
