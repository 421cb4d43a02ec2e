"""Tiny in-memory data sets that follow medattn.data.base's contract, for the training-loop (medattn.train), CLI
and DDP tests."""

from __future__ import annotations

import csv
from pathlib import Path

import torch
from torch.utils.data import Dataset

from medattn.config import load_config
from medattn.data.base import DataBundle, TaskInfo
from medattn.data.preprocessing import Preprocessing
from medattn.runtime import checkpoint
from medattn.runtime.build import build_model


class SignalImages(Dataset):
    """(1, 32, 32) noise images; positives (odd index) carry a bright square. Random flips as augmentation."""

    def __init__(self, n: int, seed: int, augment: bool = False, task_type: str = "binary") -> None:
        gen = torch.Generator().manual_seed(seed)
        self.images = torch.randn(n, 1, 32, 32, generator=gen)
        self.classes = torch.arange(n) % 3 if task_type == "multiclass" else torch.arange(n) % 2
        for i, c in enumerate(self.classes.tolist()):
            self.images[i, 0, 4 + 8 * c : 10 + 8 * c, 4:10] += 3.0 if c else 0.0
        self.augment, self.task_type = augment, task_type

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> dict:
        image = self.images[index]
        if self.augment and torch.rand(()) < 0.5:
            image = image.flip(-1)
        c = int(self.classes[index])
        label = torch.tensor(c) if self.task_type == "multiclass" else torch.tensor([float(c)])
        return {"input": image, "label": label, "id": f"img{index}", "patient": f"p{index}"}


class SignalBags(Dataset):
    """Bags of 5-12 instances with 16 features; positive bags hold a few shifted instances."""

    def __init__(self, n: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.bags = []
        for i in range(n):
            bag = torch.randn(int(torch.randint(5, 13, (1,), generator=gen)), 16, generator=gen)
            if i % 2:
                bag[:2] += 1.5
            self.bags.append(bag)

    def __len__(self) -> int:
        return len(self.bags)

    def __getitem__(self, index: int) -> dict:
        bag = self.bags[index]
        return {"input": bag, "coords": torch.zeros(len(bag), 2), "label": torch.tensor([float(index % 2)]),
                "id": f"bag{index}", "patient": f"p{index}"}


def image_bundle(n: int = 24, task_type: str = "binary") -> DataBundle:
    k = 3 if task_type == "multiclass" else 1
    task = TaskInfo(task_type, "image2d", k, (1, 32, 32), synthetic=True)
    return DataBundle(SignalImages(n, 0, True, task_type), SignalImages(n // 2, 1, task_type=task_type),
                      SignalImages(n // 2, 2, task_type=task_type), task)


def bag_bundle(n: int = 16) -> DataBundle:
    task = TaskInfo("binary", "bag", 1, (16,), synthetic=True)
    return DataBundle(SignalBags(n, 0), SignalBags(n // 2, 1), SignalBags(n // 2, 2), task)


def tiny_config(*overrides: str) -> dict:
    base = ["data.kind=test_images", "model.name=vit2d_tiny", "train.epochs=2", "train.batch_size=4",
            "train.lr=1e-3", "train.warmup_epochs=0.5", "eval.bootstrap=50", "train.threads=1"]
    return load_config(None, [*base, *overrides])


#: Overrides of a tiny CLI run (synthetic_cxr at 32 px, one epoch) drawing report.html's case heatmaps: a few seconds.
TINY_DRAWN = ["data.image_size=32", "data.num_samples=[16, 8, 8]", "model.name=vit2d_tiny", "train.epochs=1",
              "train.batch_size=8", "eval.bootstrap=20", "train.threads=1"]
#: The same without the case heatmaps (three cost about 2 s of drawing a run): every test but those of the pictures.
TINY = [*TINY_DRAWN, "eval.heatmaps=0"]


def save_checkpoint(folder, config_name, overrides, task, **steps):
    """A checkpoint of a fresh model whose data were prepared with ``steps`` (:meth:`Preprocessing.of`)."""
    config = load_config(config_name, overrides)
    torch.manual_seed(0)
    model = build_model(config["model"], task)
    prep = Preprocessing.of(config["data"]["kind"], task, **steps)
    checkpoint.save(folder, model, {"config": config, "task": checkpoint.task_to_dict(task),
                                    "preprocessing": prep.to_dict()})
    return folder


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def square_image_table(folder: Path, model: str) -> Path:
    """24 PNG files of 20 x 20 noise (positives, odd numbers, carry a bright square), their ``labels.csv`` and a
    config ``c.yaml`` that trains ``model`` (a YAML mapping) on them at 16 px; -> the config."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    rows = ["path,label"]
    for i in range(24):
        image = rng.integers(0, 120, (20, 20), dtype=np.uint8)
        image[4:10, 4:10] += 130 * (i % 2)
        Image.fromarray(image).save(folder / f"{i}.png")
        rows.append(f"{i}.png,{i % 2}")
    (folder / "labels.csv").write_text("\n".join(rows) + "\n")
    config = folder / "c.yaml"
    config.write_text(f"data: {{kind: image_table, csv: {folder / 'labels.csv'}, label_columns: [label], "
                      f"image_size: 16, in_chans: 1, val_fraction: 0.34, test_fraction: 0.25}}\nmodel: {model}\n")
    return config
