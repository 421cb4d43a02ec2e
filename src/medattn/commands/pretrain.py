"""Pretrain a model on unlabelled data: medattn pretrain CONFIG [key=value ...]. A ViT preset on images or volumes as a
masked autoencoder, the bag transformer (vitwsi*) on two views of each unlabelled bag.

CONFIG is the training config (data, model.name, model.attention): pretraining reads its training split without
the labels, and with pretrain.pool=TABLE.csv every file of that unlabelled table (the data's path column), with
the same readers and preprocessing. pretrain.* keys set the objective and its budget (docs/pretraining.md). The
run folder (--out, else runs/<name>-pretrain) receives metrics.csv, pretrain.json and the encoder in
checkpoints/best; start training from it with: medattn train CONFIG --init-from RUN_FOLDER.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from medattn.config import load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config file or packaged config name (the training config)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="config overrides, e.g. pretrain.epochs=50 pretrain.pool=unlabelled.csv")
    parser.add_argument("--out", help="run folder (default: runs/<name>-pretrain)")
    parser.add_argument("--resume", action="store_true", help="continue the pretraining run in the output folder")
    parser.add_argument("--overwrite", action="store_true", help="replace a run already in the output folder")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run_dir_of(config: dict, out: str | None) -> Path:
    return Path(out or Path("runs") / f"{config['name']}-pretrain")


def interrupted(args: argparse.Namespace) -> str:
    """What Ctrl-C left: the run resumes from its last finished epoch."""
    try:
        run_dir = run_dir_of(load_config(args.config, args.overrides), args.out)
    except Exception:  # interrupted while the config was read: nothing was written
        return "nothing was written"
    if not (run_dir / "checkpoints" / "last").is_dir():
        return f"no epoch had finished, nothing to resume in {run_dir}"
    again = " ".join(["medattn pretrain", args.config, *args.overrides, "--out", str(run_dir), "--resume"])
    return f"{run_dir} keeps its last finished epoch; continue it with: {again}"


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)
    run_dir = run_dir_of(config, args.out)
    print(f"medattn pretrain: {config['model']['name']} on {config['data'].get('kind')} -> {run_dir}", flush=True)
    from medattn.data import build_datasets
    from medattn.pretrain import pretrain
    from medattn.train.rundir import check_inputs, check_run_dir, config_inputs

    check_inputs(run_dir, config_inputs(config, args.config), args.resume)
    check_run_dir(run_dir, args.resume, args.overwrite)
    bundle = build_datasets(config["data"], seed=config["seed"])
    pretrain(config, bundle, run_dir, resume=args.resume, overwrite=args.overwrite, progress=not args.no_progress)
    return 0
