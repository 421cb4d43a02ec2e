"""A trained checkpoint with everything prediction needs: model, preprocessing, thresholds, provenance."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from medattn.data.base import TaskInfo
from medattn.data.preprocessing import Preprocessing, check_task, from_checkpoint_meta
from medattn.errors import UserError

from . import checkpoint
from .build import build_model
from .device import inference_precision
from .predictor import Predictor
from .threshold import stored_thresholds


@dataclass
class Trained:
    """A loaded checkpoint. ``preprocessing``: how its training data were prepared (None for a checkpoint that
    stores none); ``thresholds``: the validation thresholds stored at training (None if none); ``model_id``:
    ``<run name>/<model>[/<attention>]/epoch<E>``; ``checkpoint_sha256``: of the weights file."""

    model: nn.Module
    config: dict
    task: TaskInfo
    folder: Path
    meta: dict
    preprocessing: Preprocessing | None
    thresholds: list[float | None] | None
    model_id: str
    checkpoint_sha256: str

    def file_preprocessing(self, use: str) -> Preprocessing:
        """The preprocessing ``use`` (predict, explain, export) prepares files with; a one-line UserError when the
        checkpoint stores none or no single file can be prepared as its training inputs were."""
        if self.preprocessing is None:
            raise UserError(f"{self.folder}: this checkpoint stores no preprocessing description (written by an "
                            f"older medattn or from data outside the registered kinds), so {use} cannot know how "
                            f"its files were prepared; score it with medattn eval and a data config")
        if self.preprocessing.unpredictable:
            raise UserError(f"{use}: {self.preprocessing.unpredictable}")
        return self.preprocessing

    def predictor(self, device: torch.device) -> Predictor:
        """The model as eval, predict and explain run it on ``device`` (moved there): with its sliding window, at its
        ``train.precision`` where ``device`` computes it in hardware, else fp32 (:func:`inference_precision`). The
        ``train.device`` it was trained on is recorded in :attr:`config`, not obeyed."""
        predictor = Predictor.for_run(self.model.to(device), self.config, self.task, device)
        predictor.precision = inference_precision(predictor.precision, device)
        return predictor


def weights_sha256(folder: Path) -> str:
    """SHA-256 (hex) of a checkpoint's ``model.safetensors``: names the exact weights a prediction came from."""
    digest = hashlib.sha256()
    with open(Path(folder) / checkpoint.MODEL_FILE, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_id(meta: dict) -> str:
    """``<run name>/<model>[/<attention>]/epoch<E>`` from checkpoint.json."""
    config = meta["config"]
    parts = [str(config.get("name", "run")), str(config["model"]["name"])]
    if config["model"].get("attention"):
        parts.append(str(config["model"]["attention"]))
    return "/".join(parts) + (f"/epoch{meta['epoch']}" if isinstance(meta.get("epoch"), int) else "")


def not_a_classifier(folder: Path, pretrained: dict) -> str:
    """Why a pretraining run's checkpoint (``medattn pretrain``) is refused by eval, predict, explain and export: its
    encoder learned without labels and its head never saw one; what to do instead."""
    run = folder.parent.parent if folder.parent.name == "checkpoints" else folder
    return (f"{folder} is a pretraining run ({pretrained['objective']}): its head never saw a label, so there is no "
            f"classifier to evaluate, predict with, explain or export; train one from it with: medattn train CONFIG "
            f"--init-from {run}")


def load_checkpoint(path: str | Path) -> Trained:
    """The checkpoint at ``path`` (run folder, checkpoint folder or its model.safetensors), model in eval mode.

    Nothing in the folder is trusted: checkpoint.json is checked against its schema (the stored
    preprocessing and thresholds too), and the model is first built on the meta device (shapes only)
    and compared with the weights file's header, so a mismatch is a one-line error naming the tensor
    before any weight is allocated. A pretraining run's checkpoint is refused (:func:`not_a_classifier`).
    """
    folder = checkpoint.resolve(path)
    meta = checkpoint.load_meta(folder)
    source = str(folder / checkpoint.META_FILE)
    if meta.get("pretrained"):
        raise UserError(not_a_classifier(folder, meta["pretrained"]))
    task = checkpoint.task_from_dict(meta["task"])
    prep = from_checkpoint_meta(meta, source)
    if prep is not None:
        check_task(prep, task, source)
    thresholds = stored_thresholds(meta, task.num_outputs, source)
    model_cfg = checkpoint.model_config(meta)
    with torch.device("meta"):
        checkpoint.check_shapes(folder, build_model(model_cfg, task))
    model = build_model(model_cfg, task)
    checkpoint.load_model(folder, model)
    return Trained(model.eval(), meta["config"], task, folder, meta, prep, thresholds, model_id(meta),
                   weights_sha256(folder))
