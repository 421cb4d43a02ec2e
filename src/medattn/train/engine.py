"""The training and evaluation engine: one loop for every input kind, task type and mechanism.

:func:`fit` trains with AdamW, a linear warm-up then cosine decay of the learning rate (per optimizer
step), gradient clipping, gradient accumulation and optional bf16 autocast. After every epoch it
scores the validation split, writes a checkpoint atomically (``checkpoints/last``) and keeps the one
with the best validation score (``checkpoints/best``, first epoch wins ties); that one is tested at
the end. What is optimised and scored comes from the task type, in one place (:func:`objective_for`):

* classification (binary, multi-class, multi-label; :class:`Classification`): cross-entropy; AUROC,
  with a bootstrap CI, a ROC PNG and per-sample probabilities on the test split;
* segmentation (:class:`Segmentation`): soft Dice over the foreground classes + voxel cross-entropy;
  mean foreground Dice, with a bootstrap CI over test cases, per-class Dice and per-case Dice.

Run folder::

    config.yaml             resolved config
    metrics.csv             one row per epoch (lr, train/val loss, val AUROC or val Dice, seconds)
    checkpoints/last|best   see medattn.train.checkpoint
    predictions_test.csv    id, patient, label(s), probability per output (segmentation: Dice per class)
    roc_test.png            ROC curve(s) on the test split (classification only)
    results.json            the summary (also printed)

Reproducibility: the seed sets torch/numpy/random; the training order comes from a sampler seeded
with ``seed`` and the epoch (``DistributedSampler``, also with one process), DataLoader workers are
seeded from it, and the RNG states are part of every checkpoint, so ``resume`` continues exactly where
the killed run stopped. ``num_workers`` is 0 by default: on CPU the workers compete with the model for
the same cores.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import inspect
import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler
from tqdm import tqdm

from medattn import metrics
from medattn.attention import available_attentions
from medattn.config import flatten, save_config, validate
from medattn.data.base import DataBundle, TaskInfo, collate
from medattn.errors import UserError, writing
from medattn.models import create_model, input_contract, takes_attention
from medattn.models.presets import PRESETS
from medattn.models.pretrained import describe, load_pretrained
from medattn.models.segmentation import dice_per_class, soft_dice_loss
from medattn.threads import set_threads

from . import checkpoint, distributed

RUN_FILES = ("config.yaml", "metrics.csv", "checkpoints", "predictions_test.csv", "roc_test.png", "results.json")
LOCK_FILE = ".lock"  # flock-ed by the run using the folder (never deleted: deleting it would race)
PREVIOUS = ".previous"  # an overwritten run's files wait here until the new run's first checkpoint


@dataclass
class Predictions:
    """One split's per-sample results in dataset order (see the objective's :meth:`outputs`).

    Classification: ``outputs`` = probabilities (N, K), ``labels`` (N, K) or (N,) class indices.
    Segmentation: ``outputs`` = per-class Dice (N, K), ``labels`` = label voxels per class (N, K).
    """

    ids: list[str]
    patients: list[str]
    outputs: np.ndarray
    labels: np.ndarray
    loss: float


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _seed_worker(worker_id: int) -> None:
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def check_model_config(model_cfg: dict) -> None:
    """The model section names a preset, a registered mechanism (or none, for models without one) and
    only keyword arguments the preset's class takes; a UserError names the key. Cheap: builds nothing."""
    name, attention, kwargs = model_cfg["name"], model_cfg.get("attention"), model_cfg.get("kwargs") or {}
    if name not in PRESETS:
        raise UserError(f"model.name: unknown model {name!r}; available: {', '.join(sorted(PRESETS))}")
    if attention is not None:
        if not takes_attention(name):
            raise UserError(f"model.attention: model {name!r} has no attention mechanism; got {attention!r} "
                            f"(set model.attention=null)")
        if attention not in available_attentions():
            raise UserError(f"model.attention: unknown attention {attention!r}; available: "
                            f"{', '.join(available_attentions())}")
    parameters = inspect.signature(PRESETS[name][0]).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        accepted = sorted(k for k in parameters if k not in ("self", "attention"))
        unknown = [k for k in kwargs if k not in accepted]
        if unknown:
            raise UserError(f"model.kwargs.{unknown[0]}: model {name!r} takes no argument {unknown[0]!r}; "
                            f"it takes {', '.join(accepted)}")


def build_model(model_cfg: dict, task: TaskInfo) -> nn.Module:
    """The configured preset with its input and output sizes taken from the task (explicit kwargs win).

    Built on the current default device (``with torch.device("meta")`` builds shapes only). Values the
    model refuses (``ValueError``/``TypeError`` from its constructor) become a UserError naming
    ``model.kwargs`` and the sizes taken from the data.
    """
    check_model_config(model_cfg)
    name = model_cfg["name"]
    given = dict(model_cfg.get("kwargs") or {})
    kwargs = {**given}
    kwargs.setdefault("num_classes", task.num_outputs)
    is_bag_model = input_contract(name) == "bag"
    if is_bag_model != (task.input_kind == "bag"):
        wants = "feature bags" if is_bag_model else "images or volumes"
        raise UserError(f"model {name!r} takes {wants} but the data gives {task.input_kind} inputs")
    if is_bag_model:
        kwargs.setdefault("feature_dim", task.input_shape[0])
    else:
        kwargs.setdefault("in_chans", task.input_shape[0])
        if "img_size" in inspect.signature(PRESETS[name][0]).parameters:  # the pixel model takes any size
            kwargs.setdefault("img_size", tuple(task.input_shape[1:]))
    try:
        return create_model(name, attention=model_cfg.get("attention"), **kwargs)
    except (ValueError, TypeError) as error:
        from_data = {k: v for k, v in kwargs.items() if k not in given}
        raise UserError(f"model.kwargs {given or '{}'} (with {from_data} from the data) do not build model "
                        f"{name!r}: {error}") from error


def forward(model: nn.Module, batch: dict, input_kind: str) -> torch.Tensor:
    """Logits (B, K) (segmentation: (B, K, H, W, D)): ``model(x)`` for images/volumes,
    ``model(features, mask, coords)`` for bags."""
    if input_kind == "bag":
        return model(batch["input"], mask=batch.get("mask"), coords=batch.get("coords"))
    return model(batch["input"])


def loss_fn(logits: torch.Tensor, labels: torch.Tensor, task_type: str, per_sample: bool = False) -> torch.Tensor:
    """Cross-entropy (multi-class) or binary cross-entropy; the batch mean, or (B,) with ``per_sample``."""
    if task_type == "multiclass":
        loss = F.cross_entropy(logits.float(), labels.long(), reduction="none")
    else:
        loss = F.binary_cross_entropy_with_logits(logits.float(), labels.float(), reduction="none").mean(-1)
    return loss if per_sample else loss.mean()


def probabilities(logits: torch.Tensor, task_type: str) -> torch.Tensor:
    return logits.float().softmax(-1) if task_type == "multiclass" else logits.float().sigmoid()


def _output_names(task: TaskInfo, k: int) -> list[str]:
    return task.class_names if len(task.class_names) == k else [str(i) for i in range(k)]


class Classification:
    """Binary, multi-class and multi-label tasks: logits (B, K); cross-entropy; AUROC."""

    metric, metric_label = "auroc", "AUROC"
    files = "predictions_test.csv roc_test.png"
    outputs_are_probabilities = True  # Predictions.outputs: (N, K) probabilities

    def __init__(self, task: TaskInfo) -> None:
        self.task = task

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, per_sample: bool = False) -> torch.Tensor:
        return loss_fn(logits, labels, self.task.task_type, per_sample)

    def outputs(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (probabilities (B, K), labels): the per-sample rows gathered for scoring."""
        return probabilities(logits, self.task.task_type), labels

    def val_score(self, pred: Predictions) -> float:
        return metrics.auroc(pred.outputs, pred.labels, self.task.task_type, "validation", self.task.class_names)

    def score(self, pred: Predictions, split: str, out_dir: Path, eval_cfg: dict, seed: int, label: str = "") -> dict:
        """AUROC, bootstrap CI, ROC PNG and predictions CSV of one split; an undefined AUROC becomes a note."""
        task = self.task
        write_predictions(pred, task, out_dir / f"predictions_{split}.csv")
        result: dict = {"n": len(pred.ids), "loss": pred.loss, "auroc": None, "ci_low": None, "ci_high": None}
        try:
            result["auroc"] = metrics.auroc(pred.outputs, pred.labels, task.task_type, split, task.class_names)
            if eval_cfg["bootstrap"]:
                result["ci_low"], result["ci_high"] = metrics.bootstrap_ci(
                    pred.outputs, pred.labels, task.task_type, eval_cfg["bootstrap"], eval_cfg["ci"], seed,
                    groups=pred.patients)
            title = f"{label + ', ' if label else ''}{split}: AUROC {result['auroc']:.3f}"
            title += " (SYNTHETIC data)" if task.synthetic else ""
            metrics.plot_roc(pred.outputs, pred.labels, task.task_type, out_dir / f"roc_{split}.png", title,
                             task.class_names)
        except metrics.UndefinedMetricError as error:
            result["note"] = str(error)
        return result

    def test_line(self, test: dict) -> str:
        if test["auroc"] is None:
            return f"test AUROC     undefined: {test['note']}"
        ci = "" if test["ci_low"] is None else f"  (95% CI {test['ci_low']:.3f}-{test['ci_high']:.3f})"
        return f"test AUROC     {test['auroc']:.4f}{ci}  n={test['n']}"


class Segmentation:
    """Voxel labelling: logits (B, K, H, W, D), labels (B, H, W, D) in [0, K) with 0 = background.

    Loss: soft Dice over the foreground classes (batch Dice, :func:`soft_dice_loss` without background)
    plus the voxel-wise cross-entropy, which gives useful gradients while the Dice of small structures
    is still near 0. Score: mean foreground Dice of the hard (argmax) prediction (:func:`metrics.mean_dice`).
    """

    metric, metric_label = "dice", "Dice"
    files = "predictions_test.csv"
    outputs_are_probabilities = False  # Predictions.outputs: (N, K) Dice per class

    def __init__(self, task: TaskInfo) -> None:
        self.task = task

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, per_sample: bool = False) -> torch.Tensor:
        if per_sample:
            return torch.stack([self.loss(x[None], y[None]) for x, y in zip(logits, labels)])
        return soft_dice_loss(logits, labels, include_background=False) + F.cross_entropy(logits.float(), labels)

    def outputs(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (Dice per class (B, K), NaN where a class is in neither; label voxels per class (B, K))."""
        k = logits.shape[1]
        hard = logits.argmax(1)
        dice = torch.stack([dice_per_class(p, t, k) for p, t in zip(hard, labels)])
        voxels = torch.stack([torch.bincount(t.flatten(), minlength=k) for t in labels])
        return dice, voxels

    def val_score(self, pred: Predictions) -> float:
        return metrics.mean_dice(pred.outputs, "validation")

    def score(self, pred: Predictions, split: str, out_dir: Path, eval_cfg: dict, seed: int, label: str = "") -> dict:
        """Mean foreground Dice with a bootstrap CI over cases, per-class Dice, per-case Dice CSV."""
        names = _output_names(self.task, pred.outputs.shape[1])
        self.write_cases(pred, names, out_dir / f"predictions_{split}.csv")
        per_class = metrics.class_dice(pred.outputs)
        result: dict = {"n": len(pred.ids), "loss": pred.loss, "dice": None, "ci_low": None, "ci_high": None,
                        "dice_per_class": {n: None if np.isnan(v) else float(v) for n, v in zip(names, per_class)}}
        try:
            result["dice"] = metrics.mean_dice(pred.outputs, split)
            if eval_cfg["bootstrap"]:
                result["ci_low"], result["ci_high"] = metrics.dice_bootstrap_ci(
                    pred.outputs, eval_cfg["bootstrap"], eval_cfg["ci"], seed, groups=pred.patients)
        except metrics.UndefinedMetricError as error:
            result["note"] = str(error)
        return result

    @staticmethod
    def write_cases(pred: Predictions, names: list[str], path: Path) -> None:
        """CSV: id, patient, mean foreground Dice, Dice per class (empty where undefined), label voxels per class."""
        def cell(value: float) -> str:
            return "" if np.isnan(value) else f"{value:.6f}"

        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["id", "patient", "mean_dice", *[f"dice_{n}" for n in names],
                             *[f"voxels_{n}" for n in names]])
            for i, sample_id in enumerate(pred.ids):
                foreground = pred.outputs[i, 1:]
                mean = float(np.nanmean(foreground)) if not np.isnan(foreground).all() else float("nan")
                writer.writerow([sample_id, pred.patients[i], cell(mean), *[cell(v) for v in pred.outputs[i]],
                                 *[int(v) for v in pred.labels[i]]])

    def test_line(self, test: dict) -> str:
        if test["dice"] is None:
            return f"test Dice      undefined: {test['note']}"
        ci = "" if test["ci_low"] is None else f"  (95% CI {test['ci_low']:.3f}-{test['ci_high']:.3f})"
        classes = ", ".join(f"{n} {'-' if v is None else f'{v:.3f}'}"
                            for n, v in list(test["dice_per_class"].items())[1:])
        return f"test Dice      {test['dice']:.4f}{ci}  n={test['n']}\nper class      {classes}"


def objective_for(task: TaskInfo) -> Classification | Segmentation:
    """The loss, the validation score and the test report of a task type: the one place they are chosen."""
    return Segmentation(task) if task.task_type == "segmentation" else Classification(task)


def metric_fields(objective: Classification | Segmentation) -> tuple[str, ...]:
    """The columns of metrics.csv."""
    return ("epoch", "lr", "train_loss", "val_loss", f"val_{objective.metric}", "seconds")


def lr_at(step: int, total_steps: int, warmup_steps: int, lr: float, min_lr: float) -> float:
    """Linear warm-up over ``warmup_steps`` then cosine decay from ``lr`` to ``min_lr`` at ``total_steps``."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


class _Indexed(Dataset):
    """Adds each sample's position, so predictions gathered from several ranks can be put in order."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict:
        return {**self.dataset[index], "index": index}


def _collate_indexed(samples: list[dict]) -> dict:
    return {**collate(samples), "index": torch.tensor([s["index"] for s in samples])}


def make_loader(dataset: Dataset, batch_size: int, shuffle: bool, seed: int, num_workers: int = 0) -> DataLoader:
    """A loader over this rank's share, in an order fixed by ``seed`` (and the epoch, via ``set_epoch``)."""
    if len(dataset) == 0:
        raise UserError("a data split is empty")
    indexed = _Indexed(dataset)
    sampler = DistributedSampler(indexed, num_replicas=distributed.world_size(), rank=distributed.rank(),
                                 shuffle=shuffle, seed=seed)
    return DataLoader(indexed, batch_size=batch_size, sampler=sampler, collate_fn=_collate_indexed,
                      num_workers=num_workers, worker_init_fn=_seed_worker,
                      generator=torch.Generator().manual_seed(seed))


def _to(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


def _autocast(device: torch.device, precision: str):
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def predict(model: nn.Module, loader: DataLoader, task: TaskInfo, device: torch.device, precision: str = "fp32",
            desc: str = "eval", progress: bool = True) -> Predictions:
    """Run the model over a loader (every rank its share) and gather all predictions in dataset order."""
    model.eval()
    objective = objective_for(task)
    indices, outputs, labels, losses, ids, patients = [], [], [], [], [], []
    for batch in tqdm(loader, desc=desc, leave=False, disable=not (progress and distributed.is_main())):
        batch = _to(batch, device)
        with _autocast(device, precision):
            logits = forward(model, batch, task.input_kind)
        losses.append(objective.loss(logits, batch["label"], per_sample=True).float().cpu())
        indices.append(batch["index"].cpu())
        output, label = objective.outputs(logits, batch["label"])
        outputs.append(output.cpu())
        labels.append(label.cpu())
        ids += batch["id"]
        patients += batch["patient"]
    index = distributed.all_gather_rows(torch.cat(indices))
    output = distributed.all_gather_rows(torch.cat(outputs))
    label = distributed.all_gather_rows(torch.cat(labels))
    ids = distributed.all_gather_strings(ids)
    patients = distributed.all_gather_strings(patients)
    loss = distributed.all_gather_rows(torch.cat(losses))
    # DistributedSampler pads the last ranks with repeats: keep each sample once, in dataset order.
    order = np.argsort(index.numpy(), kind="stable").tolist()
    first = [i for n, i in enumerate(order) if n == 0 or index[i] != index[order[n - 1]]]
    return Predictions(ids=[ids[i] for i in first], patients=[patients[i] for i in first],
                       outputs=output[first].numpy(), labels=label[first].numpy(), loss=float(loss[first].mean()))


def write_predictions(pred: Predictions, task: TaskInfo, path: Path) -> None:
    """Classification CSV: id, patient, the label(s) and one probability column per output."""
    names = _output_names(task, pred.outputs.shape[1])
    label_cols = ["label"] if task.task_type == "multiclass" else [f"label_{n}" for n in names]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "patient", *label_cols, *[f"prob_{n}" for n in names]])
        for i, sample_id in enumerate(pred.ids):
            label = [int(pred.labels[i])] if task.task_type == "multiclass" else [int(v) for v in pred.labels[i]]
            writer.writerow([sample_id, pred.patients[i], *label, *[f"{p:.6f}" for p in pred.outputs[i]]])


def score_split(pred: Predictions, task: TaskInfo, split: str, out_dir: Path, eval_cfg: dict, seed: int,
                label: str = "") -> dict:
    """Score one split and write its files, as the task's objective does (see :func:`objective_for`)."""
    return objective_for(task).score(pred, split, Path(out_dir), eval_cfg, seed, label)


def check_run_dir(run_dir: Path, resume: bool, overwrite: bool) -> None:
    """Refuse a folder that holds a run unless resuming (then it must hold a checkpoint) or overwriting."""
    run_dir = Path(run_dir)
    if resume and overwrite:
        raise UserError("--resume and --overwrite exclude each other")
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"output folder {run_dir} is a file, not a folder")
    if resume:
        if not (run_dir / "checkpoints" / "last").exists() and not (run_dir / "checkpoints" / "last.old").exists():
            raise UserError(f"--resume: no checkpoint to resume from in {run_dir / 'checkpoints' / 'last'}")
    elif not overwrite and any((run_dir / name).exists() for name in RUN_FILES):
        raise UserError(f"output folder {run_dir} already holds a run; use --resume to continue it or "
                        f"--overwrite to replace it")


@contextlib.contextmanager
def run_folder(run_dir: Path, resume: bool, overwrite: bool):
    """Hold ``run_dir`` for one run: lock it, tidy up after a killed run, check it, set an overwritten run aside.

    Yields ``keep``, to call once the new run has written a checkpoint: from then on the new run stands
    and the previous one (moved to ``.previous``) is deleted. If the block fails before that, the new
    run's files are removed and the previous run is put back, so ``--overwrite`` with bad input loses
    nothing. A second run on a locked folder gets a UserError at once. Only the main rank touches files.
    """
    run_dir = Path(run_dir)
    if not distributed.is_main():
        check_run_dir(run_dir, resume, overwrite)  # every rank stops on a folder it may not use
        distributed.barrier()
        yield lambda: None
        return
    with _locked(run_dir):
        _recover(run_dir)
        check_run_dir(run_dir, resume, overwrite)
        if not resume:
            _move_run(run_dir, run_dir / PREVIOUS)
        distributed.barrier()
        kept = resume

        def keep() -> None:
            nonlocal kept
            if not kept:
                shutil.rmtree(run_dir / PREVIOUS, ignore_errors=True)
                kept = True

        try:
            yield keep
        except BaseException:
            if not kept:
                _put_back(run_dir)
            raise


@contextlib.contextmanager
def _locked(run_dir: Path):
    """Create ``run_dir`` and hold an exclusive ``flock`` on its lock file (released when the block ends,
    or by the kernel when the process dies)."""
    with writing(run_dir):
        run_dir.mkdir(parents=True, exist_ok=True)
        handle = open(run_dir / LOCK_FILE, "a")  # noqa: SIM115 (held for the whole block)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise UserError(f"output folder {run_dir} is in use by another medattn run (it holds "
                        f"{run_dir / LOCK_FILE}); wait for it to end or choose another --out") from None
    try:
        yield
    finally:
        handle.close()


def _move_run(source: Path, target: Path) -> None:
    """Move the run files (:data:`RUN_FILES`, nothing else) from ``source`` into ``target`` by rename."""
    present = [name for name in RUN_FILES if (source / name).exists()]
    if present:
        with writing(target):
            target.mkdir(exist_ok=True)
            for name in present:
                os.replace(source / name, target / name)


def _put_back(run_dir: Path) -> None:
    """Remove an unfinished run's files and restore the run set aside in ``.previous`` (if any)."""
    for name in RUN_FILES:
        target = run_dir / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    if (run_dir / PREVIOUS).is_dir():
        _move_run(run_dir / PREVIOUS, run_dir)
        shutil.rmtree(run_dir / PREVIOUS)


def _recover(run_dir: Path) -> None:
    """After a run killed outright (the lock is ours, so its owner is gone): a previous run it had set
    aside comes back unless the killed run got as far as a checkpoint; unfinished checkpoint writes go."""
    checkpoint.clean_stale(run_dir / "checkpoints")
    if (run_dir / PREVIOUS).is_dir():
        if (run_dir / "checkpoints" / "last").is_dir():
            shutil.rmtree(run_dir / PREVIOUS)
        else:
            _put_back(run_dir)


def check_device(name: str) -> None:
    """``train.device`` names a device this machine has (CUDA/MPS present, the CUDA index in range)."""
    if name.startswith("cuda"):
        index = int(name.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise UserError(f"train.device={name}: this machine has {torch.cuda.device_count()} CUDA device(s); "
                            f"use train.device=auto or cpu")
    elif name == "mps" and not torch.backends.mps.is_available():
        raise UserError("train.device=mps: MPS is not available on this machine; use train.device=auto or cpu")


def _config_diff(a: dict, b: dict, ignore: tuple[str, ...] = ("out",)) -> list[str]:
    fa, fb = flatten(a), flatten(b)
    return sorted(k for k in set(fa) | set(fb) if k not in ignore and fa.get(k) != fb.get(k))


def fit(config: dict, bundle: DataBundle, run_dir: Path, *, resume: bool = False, overwrite: bool = False,
        init_from: str | Path | None = None, progress: bool = True, device: torch.device | None = None,
        on_epoch_end: Callable[[int, dict], None] | None = None, log: Callable[[str], None] = print) -> dict:
    """Train, select the best epoch by the validation score (AUROC, or Dice for segmentation), test it;
    returns the results (also results.json).

    The config is checked first (:func:`medattn.config.validate`, the model section, the device); the
    run folder is held for the whole run (:func:`run_folder`: locked; an overwritten run is deleted only
    once this run has written its first checkpoint). ``on_epoch_end(epoch, row)`` is called after each
    epoch's checkpoint is written (tests use it to interrupt a run). With ``init_from`` the model starts
    from another checkpoint's shared tensors, or from a plain weights file of a timm, DINO, MAE or MONAI
    ViT (:func:`medattn.models.pretrained.load_pretrained`).
    """
    validate(config)
    check_model_config(config["model"])
    if device is None:
        check_device(config["train"]["device"])
        device = distributed.setup(config["train"]["device"])  # joins the process group: ranks known from here
    run_dir = Path(run_dir)
    with run_folder(run_dir, resume, overwrite) as keep:
        return _fit(config, bundle, run_dir, keep, resume=resume, init_from=init_from, progress=progress,
                    device=device, on_epoch_end=on_epoch_end, log=log)


def improves(state: dict, score: float, loss: float) -> bool:
    """Whether an epoch with validation ``score`` and ``loss`` replaces the best so far: a higher score, or
    the same score with a lower loss. Small validation sets saturate (AUROC 1.0 from epoch 1 or 2); without
    the tie-break the barely trained first epoch at the ceiling stayed "best"."""
    if state["best_score"] is None or score > state["best_score"]:
        return True
    return score == state["best_score"] and (state.get("best_loss") is None or loss < state["best_loss"])


def _fit(config: dict, bundle: DataBundle, run_dir: Path, keep: Callable[[], None], *, resume: bool,
         init_from: str | Path | None, progress: bool, device: torch.device,
         on_epoch_end: Callable[[int, dict], None] | None, log: Callable[[str], None]) -> dict:
    """:func:`fit` inside its held run folder; ``keep()`` after the first checkpoint (see :func:`run_folder`)."""
    train_cfg, task, seed = config["train"], bundle.task, config["seed"]
    log = log if distributed.is_main() else (lambda message: None)
    if resume:
        saved = checkpoint.load_meta(checkpoint.resolve(run_dir / "checkpoints" / "last"))["config"]
        changed = _config_diff(saved, config)
        if changed:
            raise UserError(f"--resume: the config differs from the run's saved config in {', '.join(changed)}")
    set_threads(train_cfg["threads"], log)
    seed_everything(seed)
    objective = objective_for(task)
    fields, score_key = metric_fields(objective), f"val_{objective.metric}"
    model = build_model(config["model"], task).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    init_report = None
    if init_from is not None and not resume and checkpoint.is_plain_weights(init_from):
        report = load_pretrained(model, init_from)  # timm, DINO, MAE or MONAI ViT weights
        init_report = {"from": str(init_from), **report}
        log(f"initialised from {init_from}: {describe(report)}")
    elif init_from is not None and not resume:
        new, unused = checkpoint.init_from(model, checkpoint.resolve(init_from))
        init_report = {"from": str(init_from), "new_tensors": new, "unused_tensors": unused}
        log(f"initialised from {init_from}: {len(new)} new tensor(s)" + (f": {', '.join(new)}" if new else "")
            + (f"; {len(unused)} checkpoint tensor(s) unused: {', '.join(unused)}" if unused else ""))
    decay = [p for n, p in model.named_parameters() if p.ndim > 1 and "pos_embed" not in n and "cls_token" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim > 1 and "pos_embed" not in n
                                                                and "cls_token" not in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": train_cfg["weight_decay"]},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=train_cfg["lr"], betas=tuple(train_cfg["betas"]))
    ddp_model = DistributedDataParallel(model) if distributed.world_size() > 1 else model
    eval_bs = train_cfg["eval_batch_size"] or train_cfg["batch_size"]
    train_loader = make_loader(bundle.train, train_cfg["batch_size"], True, seed, train_cfg["num_workers"])
    val_loader = make_loader(bundle.val, eval_bs, False, seed, train_cfg["num_workers"])
    accum = train_cfg["grad_accum"]
    steps_per_epoch = math.ceil(len(train_loader) / accum)
    total_steps = train_cfg["epochs"] * steps_per_epoch
    warmup_steps = round(train_cfg["warmup_epochs"] * steps_per_epoch)
    state = {"epoch": 0, "step": 0, "best_score": None, "best_loss": None, "best_epoch": None}
    if resume:
        last = checkpoint.resolve(run_dir / "checkpoints" / "last")
        checkpoint.load_model(last, model)
        state.update({k: v for k, v in checkpoint.load_training_state(last, optimizer).items() if k in state})
        log(f"resuming {run_dir} after epoch {state['epoch']} (step {state['step']})")
        _truncate_metrics(run_dir / "metrics.csv", state["epoch"], fields)
    elif distributed.is_main():
        with writing(run_dir / "config.yaml"):
            save_config(config, run_dir / "config.yaml")
    meta = {"config": config, "task": checkpoint.task_to_dict(task)}
    started = time.time()
    for epoch in range(state["epoch"] + 1, train_cfg["epochs"] + 1):
        epoch_start = time.time()
        train_loader.sampler.set_epoch(epoch)
        train_loader.generator.manual_seed(seed * 100_003 + epoch)  # worker seeds depend on the epoch only
        ddp_model.train()
        loss_sum, seen = 0.0, 0
        batches = tqdm(train_loader, desc=f"epoch {epoch}/{train_cfg['epochs']} train", leave=False,
                       disable=not (progress and distributed.is_main()))
        n_batches = len(train_loader)
        for i, batch in enumerate(batches):
            group_start = (i // accum) * accum
            group_size = min(accum, n_batches - group_start)
            last_in_group = i == group_start + group_size - 1
            batch = _to(batch, device)
            sync = contextlib.nullcontext() if last_in_group or ddp_model is model else ddp_model.no_sync()
            with sync:
                with _autocast(device, train_cfg["precision"]):
                    logits = forward(ddp_model, batch, task.input_kind)
                loss = objective.loss(logits, batch["label"])
                (loss / group_size).backward()
            loss_sum += loss.item() * len(batch["id"])
            seen += len(batch["id"])
            if last_in_group:
                lr = lr_at(state["step"], total_steps, warmup_steps, train_cfg["lr"], train_cfg["min_lr"])
                for group in optimizer.param_groups:
                    group["lr"] = lr
                if train_cfg["grad_clip"]:
                    nn.utils.clip_grad_norm_(model.parameters(), train_cfg["grad_clip"])
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                state["step"] += 1
                batches.set_postfix(loss=f"{loss.item():.4f}", lr=f"{lr:.2e}")
        if not math.isfinite(loss_sum):
            raise UserError(f"training diverged in epoch {epoch} (loss is {loss_sum}); lower train.lr or use fp32")
        val = predict(model, val_loader, task, device, train_cfg["precision"], f"epoch {epoch} val", progress)
        val_score = objective.val_score(val)
        totals = distributed.all_gather_rows(torch.tensor([[loss_sum, seen]], dtype=torch.float64)).sum(0)
        train_loss = float(totals[0] / max(1.0, float(totals[1])))
        row = {"epoch": epoch, "lr": optimizer.param_groups[0]["lr"], "train_loss": train_loss,
               "val_loss": val.loss, score_key: val_score, "seconds": time.time() - epoch_start}
        state["epoch"] = epoch
        is_best = improves(state, val_score, val.loss)
        if is_best:
            state["best_score"], state["best_loss"], state["best_epoch"] = val_score, val.loss, epoch
        if distributed.is_main():  # metrics first: a resumed run drops rows later than its checkpoint
            _append_metrics(run_dir / "metrics.csv", row, fields)
            if is_best:
                checkpoint.save(run_dir / "checkpoints" / "best", model,
                                {**meta, "epoch": epoch, score_key: val_score})
            checkpoint.save(run_dir / "checkpoints" / "last", model, {**meta, "epoch": epoch, score_key: val_score},
                            optimizer, state)
            keep()
        distributed.barrier()
        log(f"epoch {epoch}/{train_cfg['epochs']}: train loss {train_loss:.4f}  val loss {val.loss:.4f}  "
            f"val {objective.metric_label} {val_score:.4f}" + ("  (best)" if is_best else ""))
        if on_epoch_end is not None:
            on_epoch_end(epoch, row)
    best = checkpoint.resolve(run_dir / "checkpoints" / "best")
    checkpoint.load_model(best, model)
    test_loader = make_loader(bundle.test, eval_bs, False, seed, train_cfg["num_workers"])
    test = predict(model, test_loader, task, device, train_cfg["precision"], "test", progress)
    results = {
        "run_dir": str(run_dir), "synthetic": task.synthetic, "data": config["data"].get("kind"),
        "model": config["model"]["name"], "attention": config["model"]["attention"], "parameters": n_params,
        "epochs": train_cfg["epochs"], "best_epoch": state["best_epoch"], "metric": objective.metric,
        score_key: state["best_score"],
        "skipped_samples": bundle.skipped, "train_seconds": time.time() - started,
        "n_train": len(bundle.train), "n_val": len(bundle.val), "init_from": init_report,
    }
    if distributed.is_main():
        label = " ".join(str(v) for v in (config["model"]["name"], config["model"].get("attention")) if v)
        with open(run_dir / "metrics.csv", newline="") as f:
            train_losses = [float(row["train_loss"]) for row in csv.DictReader(f)]
        results["warnings"] = learning_warnings(train_losses,
                                                test.outputs if objective.outputs_are_probabilities else None)
        with writing(run_dir):
            results["test"] = objective.score(test, "test", run_dir, config["eval"], seed, label)
            (run_dir / "results.json").write_text(json.dumps(results, indent=1))
        log(summary(results, objective))
    distributed.barrier()
    return results


#: A train loss at the end above this fraction of its first epoch's "never left its start".
FLAT_LOSS_FRACTION = 0.95
#: Test probabilities whose 5th-95th percentile spread is below this, for every output, "collapsed".
NARROW_BAND = 0.05


def learning_warnings(train_losses: list[float], probabilities: np.ndarray | None) -> list[str]:
    """Signs that a run learned nothing, as sentences for the summary (empty when none).

    ``train_losses``: mean train loss per epoch, in order; ``probabilities``: test outputs (N, K) of a
    classification task, or None. Two signs: the last epoch's train loss is above ``FLAT_LOSS_FRACTION``
    of the first's (over at least two epochs), and the test probabilities of every output lie within a
    5th-95th percentile band narrower than ``NARROW_BAND`` (the model tells the cases apart barely or not
    at all, whatever the AUROC says).
    """
    found = []
    if len(train_losses) >= 2 and train_losses[-1] > FLAT_LOSS_FRACTION * train_losses[0]:
        found.append(f"the train loss never left its start ({train_losses[0]:.4f} in epoch 1, "
                     f"{train_losses[-1]:.4f} in epoch {len(train_losses)}): the model may have learned nothing")
    if probabilities is not None and len(probabilities) >= 2:
        low, high = np.percentile(probabilities, [5, 95], axis=0)
        if float((high - low).max()) < NARROW_BAND:
            found.append(f"the test probabilities collapse to a band {float((high - low).max()):.3f} wide "
                         f"(5th-95th percentile): the model barely tells the cases apart")
    return found


def summary(results: dict, objective: Classification | Segmentation) -> str:
    """The one-screen summary printed at the end of a run."""
    test = results["test"]
    tag = "  [SYNTHETIC data]" if results["synthetic"] else ""
    mechanism = f" with {results['attention']} attention" if results["attention"] else ""
    lines = [
        "=" * 72,
        f"run            {results['run_dir']}{tag}",
        f"data           {results['data']}  (train {results['n_train']}, val {results['n_val']}, "
        f"test {test['n']}; skipped {results['skipped_samples']})",
        f"model          {results['model']}{mechanism} ({results['parameters'] / 1e6:.2f} M parameters)",
        f"best epoch     {results['best_epoch']} of {results['epochs']}  "
        f"(val {objective.metric_label} {results[f'val_{objective.metric}']:.4f})",
        objective.test_line(test),
        f"time           {results['train_seconds']:.1f} s",
        f"files          config.yaml metrics.csv checkpoints/best {objective.files} results.json",
        *(f"WARNING        {warning}" for warning in results.get("warnings", [])),
        "=" * 72,
    ]
    return "\n".join(lines)


def _append_metrics(path: Path, row: dict, fields: tuple[str, ...]) -> None:
    new = not path.exists()
    with writing(path), open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        if new:
            writer.writeheader()
        writer.writerow(row)


def _truncate_metrics(path: Path, last_epoch: int, fields: tuple[str, ...]) -> None:
    """Drop rows written after the checkpoint a run resumes from."""
    if not path.exists() or not distributed.is_main():
        return
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if int(r["epoch"]) <= last_epoch]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
