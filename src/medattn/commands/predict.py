"""Predict class probabilities for files: medattn predict CHECKPOINT FILES... --out CSV.

Each file is read and preprocessed as the checkpoint's run read its data (its data config: image size,
channels, normalisation; voxel spacing, size, subtraction excluded; feature bags from HDF5). Images:
PNG, JPEG, TIFF, DICOM. Volumes: NIfTI or a DICOM series folder. Bags: one HDF5 file per slide.
The CSV has one row per file: the file and one probability column per output. The files go through
the engine's prediction path with the run's device and precision, so a file gives the probability
`medattn eval` gives it.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from medattn.errors import UserError, writing

from .evaluate import load_trained, positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="run folder, checkpoint folder or model.safetensors")
    parser.add_argument("files", nargs="+", help="image, volume (file or DICOM folder) or HDF5 feature files")
    parser.add_argument("--out", required=True, help="CSV to write")
    parser.add_argument("--batch-size", type=positive_int, default=8)


def file_loader(data_cfg: dict, task):
    """path -> sample dict, preprocessing as the run's data config did (no augmentation)."""
    import torch

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
        label = torch.tensor(0) if task.task_type == "multiclass" else torch.zeros(task.num_outputs)
        return {**sample, "id": str(path), "label": label}  # a placeholder label: only the outputs are kept

    return read


class Files:
    """The given files as samples, read on use by ``read`` (see :func:`file_loader`): a map-style dataset."""

    def __init__(self, paths: list[Path], read) -> None:
        self.paths, self.read = paths, read

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> dict:
        return self.read(self.paths[index])


def run(args: argparse.Namespace) -> int:
    from medattn.data.files import check_regular
    from medattn.train import distributed, make_loader, predict
    from medattn.train.build import check_device

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
    names = task.class_names if len(task.class_names) == task.num_outputs else [str(i) for i in
                                                                                 range(task.num_outputs)]
    # the engine's own prediction path, as eval runs it: the run's device and precision, same batching code
    check_device(config["train"]["device"])
    device = distributed.setup(config["train"]["device"])
    loader = make_loader(Files(paths, file_loader(config["data"], task)), args.batch_size, False, config["seed"])
    pred = predict(model.to(device), loader, task, device, config["train"]["precision"], "predict", progress=False)
    rows = [[i, *[f"{p:.6f}" for p in row]] for i, row in zip(pred.ids, pred.outputs.tolist())]
    out = Path(args.out)
    with writing(out):
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["file", *[f"prob_{n}" for n in names]])
            writer.writerows(rows)
    print(f"wrote {len(rows)} prediction(s) to {out}")
    return 0
