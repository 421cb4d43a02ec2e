"""Evaluate a checkpoint on a data config: medattn eval CHECKPOINT DATA_CONFIG [key=value ...].

CHECKPOINT is a run folder (its best checkpoint), a checkpoint folder or its model.safetensors.
DATA_CONFIG is a run config (file or packaged name) whose `data` section is used; key=value pairs
override it (e.g. data.csv=/data/external.csv). Writes predictions_<split>.csv, roc_<split>.png and
eval.json to --out (default: eval_<config name>_<split> in the checkpoint's run folder).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from medattn.config import load_config
from medattn.errors import UserError, writing


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="run folder, checkpoint folder or model.safetensors")
    parser.add_argument("data_config", help="config file or packaged config name; its data section is used")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="overrides of the data config")
    parser.add_argument("--split", choices=("train", "val", "test"), default="test")
    parser.add_argument("--out", help="output folder (default: eval_<name>_<split> in the checkpoint's run folder)")
    parser.add_argument("--batch-size", type=positive_int, default=None, help="default: the run's eval batch size")
    parser.add_argument("--skip-bad", action="store_true", help="skip unreadable or invalid samples and count them")
    parser.add_argument("--no-progress", action="store_true")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def load_trained(path: str | Path):
    """(model, run config, task, checkpoint folder) of a checkpoint; the model is in eval mode
    (:func:`medattn.deploy.load_checkpoint`: nothing in the folder is trusted, shapes are checked first)."""
    from medattn.deploy.trained import load_checkpoint

    trained = load_checkpoint(path)
    return trained.model, trained.config, trained.task, trained.folder


def run(args: argparse.Namespace) -> int:
    config = load_config(args.data_config, args.overrides)  # config errors answer before torch is imported
    from medattn.data import build_datasets
    from medattn.data.preprocessing import describe, differences
    from medattn.deploy.trained import load_checkpoint
    from medattn.train import distributed, make_loader, predict, score_split
    from medattn.train.build import check_device
    from medattn.train.objectives import objective_for
    from medattn.train.sliding import inference_window

    trained = load_checkpoint(args.checkpoint)
    model, run_config, task, folder = trained.model, trained.config, trained.task, trained.folder
    bundle = build_datasets(config["data"], seed=config["seed"], skip_bad=args.skip_bad)
    data_task = bundle.task
    if (data_task.task_type, data_task.input_kind, data_task.num_outputs) != \
            (task.task_type, task.input_kind, task.num_outputs) or data_task.input_shape[0] != task.input_shape[0]:
        raise UserError(f"the data ({data_task.task_type}, {data_task.input_kind}, {data_task.num_outputs} output(s), "
                        f"input {data_task.input_shape}) does not fit the checkpoint's task ({task.task_type}, "
                        f"{task.input_kind}, {task.num_outputs} output(s), input {task.input_shape})")
    data_prep = describe(config["data"], data_task)
    changed = differences(trained.preprocessing, data_prep)
    if changed:  # the model would see inputs prepared unlike its training data
        key = changed[0]
        raise UserError(f"the data config prepares inputs unlike the checkpoint's training: {key} is "
                        f"{getattr(data_prep, key)!r}, the checkpoint's {getattr(trained.preprocessing, key)!r} "
                        f"(differing: {', '.join(changed)})")
    default_root = folder.parent.parent if folder.parent.name == "checkpoints" else folder
    out = Path(args.out or default_root / f"eval_{config['name']}_{args.split}")
    with writing(out):
        out.mkdir(parents=True, exist_ok=True)
    check_device(run_config["train"]["device"])
    device = distributed.setup(run_config["train"]["device"])
    batch_size = args.batch_size or run_config["train"]["eval_batch_size"] or run_config["train"]["batch_size"]
    loader = make_loader(getattr(bundle, args.split), batch_size, False, config["seed"])
    pred = predict(model.to(device), loader, data_task, device, run_config["train"]["precision"], args.split,
                   not args.no_progress, objective=objective_for(data_task, run_config["train"]["loss"]),
                   window=inference_window(run_config, task))  # sliding windows for models trained on patches
    if distributed.is_main():
        with writing(out):
            result = score_split(pred, data_task, args.split, out, config["eval"], config["seed"])
            result.update(checkpoint=str(folder), data=config["data"], skipped_samples=bundle.skipped,
                          synthetic=data_task.synthetic)
            (out / "eval.json").write_text(json.dumps(result, indent=1))
        if bundle.skipped:
            print(f"skipped {bundle.skipped} bad sample(s) (--skip-bad)")
        tag = " [SYNTHETIC data]" if data_task.synthetic else ""
        line = objective_for(data_task).test_line(result).replace("test ", f"{args.split} ", 1)
        print(f"{line}{tag}  -> {out}")
    distributed.cleanup()
    return 0
