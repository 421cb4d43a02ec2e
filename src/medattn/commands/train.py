"""Train a model from a YAML config: medattn train CONFIG [key=value ...].

CONFIG is a YAML file or the name of a packaged config (see `medattn models --configs`); key=value
pairs override it (e.g. model.attention=seqnorm train.epochs=10 data.csv=/data/labels.csv). The run
folder (--out, else the config's `out`, else runs/<name>) receives the resolved config, per-epoch
metrics, checkpoints, test predictions, the ROC curve and results.json.

Multi-process data parallel: torchrun --nproc_per_node N -m medattn train CONFIG ...
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from medattn.config import load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config file or packaged config name")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. train.lr=3e-4")
    parser.add_argument("--out", help="run folder (default: the config's out, else runs/<name>)")
    parser.add_argument("--resume", action="store_true", help="continue the run in the output folder")
    parser.add_argument("--overwrite", action="store_true", help="replace a run already in the output folder")
    parser.add_argument("--init-from", metavar="CHECKPOINT",
                        help="start from another run's checkpoint (any mechanism), or from a timm, DINO, MAE or "
                             "MONAI ViT weights file (.safetensors, or .pth read with weights_only); loaded, "
                             "adapted, new and dropped tensors are reported")
    parser.add_argument("--skip-bad", action="store_true", help="skip unreadable or invalid samples and count them")
    parser.add_argument("--slides", default=None, metavar="DIR",
                        help="folder of the scanner files the bags were extracted from (wsi_bags): report.html draws "
                             "its case heatmaps on their slides' thumbnails (sets data.slides_dir)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def interrupted(args: argparse.Namespace) -> str:
    """What Ctrl-C left and how to go on: the run resumes from its last finished epoch, if one finished."""
    try:
        run_dir = run_dir_of(load_config(args.config, args.overrides), args.out)
    except Exception:  # interrupted while the config was read: nothing was written
        return "nothing was written"
    if args.overwrite:
        return f"the run that was in {run_dir} is back as it was (--overwrite replaces it only when the new run is " \
               f"complete)"
    if not (run_dir / "checkpoints" / "last").is_dir():
        return f"no epoch had finished, nothing to resume in {run_dir}; run the command again"
    slides = [] if args.slides is None else ["--slides", args.slides]
    again = " ".join(["medattn train", args.config, *args.overrides, *slides, "--out", str(run_dir), "--resume"])
    return f"{run_dir} keeps its last finished epoch; continue it with: {again}"


def run_dir_of(config: dict, out: str | None) -> Path:
    return Path(out or config["out"] or Path("runs") / config["name"])


def run(args: argparse.Namespace) -> int:
    """Check everything that is cheap to check (config, model section, device, output folder) before any
    data is read; :func:`medattn.train.fit` holds the output folder while it trains. Config errors
    answer before torch is imported."""
    started = time.time()
    config = load_config(args.config, args.overrides)
    if not os.environ.get("RANK", "0").strip("0"):  # the first line within a second, before torch loads
        print(f"medattn train: {config['model']['name']} on {config['data'].get('kind')} -> "
              f"{run_dir_of(config, args.out)} (loading torch, checking data and model)", flush=True)
    from medattn.train.rundir import check_inputs, config_inputs

    check_inputs(run_dir_of(config, args.out), config_inputs(config, args.config, args.init_from), args.resume)
    if config["task"] != "supervised":  # the 3D VQ diffusion stages: their volumes, then the same loop (fit)
        from medattn.diffusion.train import train_diffusion

        train_diffusion(config, run_dir_of(config, args.out), overwrite=args.overwrite, resume=args.resume,
                        init_from=args.init_from, progress=not args.no_progress)
        return 0
    from medattn.data import build_datasets
    from medattn.experiments.recipe import recipe_for
    from medattn.explain.cases import case_pictures_for
    from medattn.runtime import checkpoint, distributed
    from medattn.runtime.build import check_model_config
    from medattn.runtime.device import check_device
    from medattn.train import fit
    from medattn.train.rundir import check_run_dir

    if args.skip_bad:
        config["train"]["skip_bad"] = True
    if args.slides is not None:
        config["data"]["slides_dir"] = args.slides
    run_dir = run_dir_of(config, args.out)
    config["out"] = str(run_dir)
    check_model_config(config["model"])
    check_device(config["train"]["device"])
    check_run_dir(run_dir, args.resume, args.overwrite)
    if args.init_from and not checkpoint.is_plain_weights(args.init_from):
        checkpoint.load_meta(checkpoint.resolve(args.init_from))
    try:
        bundle = build_datasets(config["data"], seed=config["seed"], skip_bad=config["train"]["skip_bad"])
        if bundle.skipped and distributed.is_main():
            print(f"skipped {bundle.skipped} bad sample(s) (--skip-bad)")
        config = recipe_for(config, bundle, run_dir, resume=args.resume, init_from=args.init_from)
        fit(config, bundle, run_dir, resume=args.resume, overwrite=args.overwrite, init_from=args.init_from,
            progress=not args.no_progress, started=started, case_pictures=case_pictures_for(config))
    finally:
        distributed.cleanup()
    return 0
