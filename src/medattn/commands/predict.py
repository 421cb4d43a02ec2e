"""Predict class probabilities for files: medattn predict CHECKPOINT FILES... --out CSV.

Each file is read and preprocessed as the checkpoint's run read its data (its data config: image size,
channels, normalisation; voxel spacing, size, subtraction excluded; feature bags from HDF5). Images:
PNG, JPEG, TIFF, DICOM. Volumes: NIfTI or a DICOM series folder. Bags: one HDF5 file per slide.
The CSV has one row per file: the file and one probability column per output.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import torch

from medattn.data.base import collate
from medattn.data.files import check_regular
from medattn.errors import UserError, writing
from medattn.train.engine import forward, probabilities

from .evaluate import load_trained, positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="run folder, checkpoint folder or model.safetensors")
    parser.add_argument("files", nargs="+", help="image, volume (file or DICOM folder) or HDF5 feature files")
    parser.add_argument("--out", required=True, help="CSV to write")
    parser.add_argument("--batch-size", type=positive_int, default=8)


def file_loader(data_cfg: dict, task):
    """path -> sample dict, preprocessing as the run's data config did (no augmentation)."""
    from medattn.data.tables import Record

    if task.input_kind == "image2d":
        from medattn.data.images import ImageLoader

        c = task.input_shape[0]
        mean, std = data_cfg.get("mean", 0.5), data_cfg.get("std", 0.5)
        mean = [mean] * c if isinstance(mean, (int, float)) else mean
        std = [std] * c if isinstance(std, (int, float)) else std
        load = ImageLoader(tuple(task.input_shape[1:]), c, mean, std)
    elif task.input_kind == "volume3d":
        from medattn.data.volumes import VolumeLoader

        spacing = data_cfg.get("target_spacing")
        load = VolumeLoader(tuple(spacing) if spacing else None, tuple(task.input_shape[1:]),
                            data_cfg.get("normalize", "zscore"))
    else:
        from medattn.data.bags import BagLoader

        load = BagLoader(task.input_shape[0])

    def read(path: Path) -> dict:
        record = Record(id=str(path), patient=str(path), where=str(path), paths=(path,))
        try:
            sample = load(record)
        except UserError:
            raise
        except Exception as error:  # readers raise many types for corrupt files
            raise UserError(f"{path}: cannot read ({error})") from None
        return {**sample, "id": str(path), "label": torch.zeros(task.num_outputs)}

    return read


def run(args: argparse.Namespace) -> int:
    model, config, task, _ = load_trained(args.checkpoint)
    if task.task_type == "segmentation":
        raise UserError("predict writes class probabilities; for a segmentation checkpoint use medattn eval")
    if task.input_kind == "volume3d" and config["data"].get("split_sides"):
        raise UserError("this checkpoint was trained on left/right halves; give one half-volume per file")
    paths = [Path(f) for f in args.files]
    for path in paths:  # before anything opens them: a named pipe would block the reader
        try:
            check_regular(path, folders=task.input_kind == "volume3d")
        except (FileNotFoundError, ValueError) as error:
            raise UserError(f"{path}: {'no such file' if isinstance(error, FileNotFoundError) else error}") from None
    read = file_loader(config["data"], task)
    names = task.class_names if len(task.class_names) == task.num_outputs else [str(i) for i in
                                                                                 range(task.num_outputs)]
    rows = []
    with torch.no_grad():
        for start in range(0, len(paths), args.batch_size):
            batch = collate([read(p) for p in paths[start : start + args.batch_size]])
            probs = probabilities(forward(model, batch, task.input_kind), task.task_type)
            rows += [[i, *[f"{p:.6f}" for p in row]] for i, row in zip(batch["id"], probs.tolist())]
    out = Path(args.out)
    with writing(out):
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["file", *[f"prob_{n}" for n in names]])
            writer.writerows(rows)
    print(f"wrote {len(rows)} prediction(s) to {out}")
    return 0
