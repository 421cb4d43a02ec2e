"""The training loop: one for every training task, input kind, task type and mechanism, readable top to bottom.

:func:`fit` (the training task of the config's ``task``, :func:`medattn.train.training_tasks.training_task`; its
checks; the held run folder) -> :func:`_fit`: :func:`_setup` (the training task's plan and model, the optimizer, a
resumed run's state) -> :func:`_run_epochs` (per epoch :func:`train_one_epoch` over the training task's batches, its
validation, metrics.csv and the checkpoints) -> the training task's results and test. What differs per training task
is asked of it (:class:`medattn.train.training_tasks.TrainingTask`): :class:`medattn.train.supervised.Supervised`,
whose test is :func:`medattn.train.results.test_best` (the best epoch's checkpoint on the test split, the verdict and
the report files), and the two stages of the 3D VQ diffusion model (:mod:`medattn.diffusion.vqae_stage`,
:mod:`medattn.diffusion.transformer_stage`). Case heatmaps for the report are drawn by what the caller hands in
(``case_pictures``); training imports no explanation code.

Training: AdamW (:mod:`medattn.train.optim`), a linear warm-up then cosine decay of the learning rate (per
optimizer step), gradient clipping, gradient accumulation and optional bf16 autocast. After every epoch the
validation split is scored, a checkpoint is written atomically (``checkpoints/last``) and the one with the
best validation score is kept (``checkpoints/best``; ties go to the lower validation loss, see
:func:`medattn.train.state.improves`); that one is tested at the end. What a supervised run optimises and scores
comes from the task type (:func:`medattn.train.objectives.objective_for`); the run folder is described in
:mod:`medattn.train.rundir`, the training state and checkpoints in :mod:`medattn.train.state`.

Reproducibility: the seed sets torch/numpy/random; the training order comes from a sampler seeded with
``seed`` and the epoch (``DistributedSampler``, also with one process), DataLoader workers are seeded from
it, and the RNG states (and a training task's own,
:meth:`~medattn.train.training_tasks.TrainingTask.state_tensors`) are part of every checkpoint, so ``resume``
continues exactly where the killed run stopped. ``num_workers`` is 0 by default: on CPU the workers compete with the
model for the same cores.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from medattn.allocator import keep_freed_memory
from medattn.config import validate
from medattn.data.base import DataBundle
from medattn.errors import UserError
from medattn.outputs import OutputFolder
from medattn.runtime import distributed
from medattn.runtime.device import open_device
from medattn.text import bars_off
from medattn.threads import set_threads

from . import report
from .defaults import resolve_training
from .optim import EMA, make_optimizer, optimizer_step, step_schedule
from .results import CasePictures, LateDataError
from .rundir import RUN_FILES, killed_run_config, run_folder
from .sampling import seed_everything
from .state import check_resume, improves, resumed_meta, save_checkpoints, start_state
from .training_tasks import Batches, Built, TrainingTask, training_task


def fit(config: dict, bundle: DataBundle, run_dir: Path, *, resume: bool = False, overwrite: bool = False,
        init_from: str | Path | None = None, progress: bool = True, device: torch.device | None = None,
        on_epoch_end: Callable[[int, dict], None] | None = None, log: Callable[[str], None] = print,
        started: float | None = None, case_pictures: CasePictures | None = None, test: bool = True) -> dict:
    """Train the training task ``config["task"]``, select the best epoch by its validation score (AUROC, Dice, ...;
    a diffusion stage's lowest validation loss), test it; returns the results (also results.json).

    The config is checked first (:func:`medattn.config.validate`, then the training task: the model section, the
    device); the run folder is held for the whole run (:func:`medattn.train.rundir.run_folder`: locked; an
    overwritten run is deleted only once this run has written its first checkpoint). ``on_epoch_end(epoch, row)`` is
    called after each epoch's checkpoint is written (tests use it to interrupt a run). With ``init_from``
    the model starts from another checkpoint's shared tensors, or from a plain weights file of a timm,
    DINO, MAE or MONAI ViT (:func:`medattn.models.pretrained.load_pretrained`; supervised runs).

    ``resume`` of a run killed before its first resumable checkpoint (``checkpoints/best`` written and ``last`` not,
    or no checkpoint at all: :func:`medattn.train.rundir.killed_run_config`) trains it again from epoch 1 as an
    overwrite (the killed run's files come back on failure), if the config is the one it saved.

    ``train.*`` keys left null take the model's own values (:func:`medattn.train.defaults.resolve_training`);
    the run saves and reports the resolved config. ``started`` (``time.time()`` when the command began; default:
    now) makes the summary's elapsed time the whole command's, not only training's. ``case_pictures``
    (:data:`CasePictures`) draws the highest-scored test cases for report.html; None: no heatmaps. ``test=False``
    (the recipe search's trials) stops after the epochs: the results hold the best validation score, the test split
    is not touched.
    """
    started = time.time() if started is None else started
    validate(config)

    def main_log(message: str) -> None:  # the main rank speaks (ranks are known once the device is open)
        if distributed.is_main():
            log(message)

    training = training_task(config["task"])(bundle, main_log)
    config, chosen = resolve_training(config)
    training.check(config, init_from, progress)
    if device is None:
        device = open_device(config["train"]["device"])  # joins the process group: ranks known from here
    run_dir = Path(run_dir)
    restart_of = None  # the saved config of a run --resume trains again from epoch 1
    if resume:
        restart_of = killed_run_config(run_dir, lambda folder: training.saved_meta(folder)["config"])
        if restart_of is not None:
            resume, overwrite = False, True
        distributed.barrier()  # every rank has looked before the main rank sets a killed run aside
    replacing = overwrite and any((run_dir / name).exists() for name in RUN_FILES)
    with run_folder(run_dir, resume, overwrite):
        try:
            return _fit(training, config, run_dir, resume=resume, init_from=init_from, progress=progress,
                        device=device, on_epoch_end=on_epoch_end, log=main_log, chosen=chosen, started=started,
                        restart_of=restart_of, case_pictures=case_pictures, test=test)
        except LateDataError as error:  # the test split failed after training; the weights are kept
            if replacing:  # ... unless the previous run comes back (the transaction of run_folder)
                raise UserError(f"{error}; the previous run in {run_dir} is back as it was") from None
            raise UserError(f"{error}; training finished and its best weights are kept in {run_dir}: score them "
                            f"with: medattn eval {run_dir} {run_dir / 'config.yaml'} --skip-bad") from None


def _fit(training: TrainingTask, config: dict, run_dir: Path, *, resume: bool, init_from: str | Path | None,
         progress: bool, device: torch.device, on_epoch_end: Callable[[int, dict], None] | None,
         log: Callable[[str], None], chosen: dict, started: float, restart_of: dict | None = None,
         case_pictures: CasePictures | None = None, test: bool = True) -> dict:
    """:func:`fit` inside its held run folder (see ``run_folder``: an overwritten run stays until this returns):
    :func:`_setup`, :func:`_run_epochs`, then the training task's results and test.
    ``chosen``: the training values defaults chose (recorded with the data's, the model's and the plan's).
    ``restart_of``: the saved config of the killed run this one trains again (it must be the same)."""
    run = _setup(training, config, run_dir, resume=resume, init_from=init_from, device=device, log=log,
                 chosen=chosen, restart_of=restart_of)
    train_seconds = _run_epochs(run, run_dir, device, progress, on_epoch_end, log)
    results = training.results(run_dir, run.state, train_seconds)
    return training.test(run_dir, results, progress, started, case_pictures) if test else results


@dataclass
class _Run:
    """What :func:`_setup` builds for the epochs."""

    config: dict  # planned and resolved: what config.yaml and the checkpoints hold
    training: TrainingTask
    built: Built  # the model, what the optimizer trains, what the training pass calls, the EMA
    optimizer: torch.optim.Optimizer
    schedule: dict  # total_steps, warmup_steps
    state: dict  # epoch, step, best_score, best_loss, best_epoch, ema_updates: a checkpoint's training state


def _setup(training: TrainingTask, config: dict, run_dir: Path, *, resume: bool, init_from: str | Path | None,
           device: torch.device, log: Callable[[str], None], chosen: dict, restart_of: dict | None) -> _Run:
    """The training task's plan (the config the run saves), a resume checked against it, threads and seed, the
    training task's model and batches, the optimizer and schedule, then a resumed run's state or config.yaml."""
    planned = training.plan(config, chosen)  # may read training samples: inside the run folder, whose rules apply
    config = planned.config
    resumed = resumed_meta(training, run_dir) if resume else None  # checkpoints/last's metadata
    check_resume(config, run_dir, resumed, restart_of, log)
    train_cfg = config["train"]
    set_threads(train_cfg["threads"], log)
    keep_freed_memory()  # large tensors reuse freed pages (medattn.allocator)
    seed_everything(config["seed"])
    built = training.build(planned, device, resumed, init_from)
    optimizer = make_optimizer(built.trained, train_cfg)
    schedule = step_schedule(train_cfg, math.ceil(built.batches_per_epoch / train_cfg["grad_accum"]))
    state = start_state(training, config, run_dir, resume, built, optimizer, log)
    return _Run(config, training, built, optimizer, schedule, state)


def _run_epochs(run: _Run, run_dir: Path, device: torch.device, progress: bool,
                on_epoch_end: Callable[[int, dict], None] | None, log: Callable[[str], None]) -> float:
    """Train from the epoch after ``run.state["epoch"]`` to ``train.epochs``: per epoch one pass over the training
    task's batches, its validation, metrics.csv (and TensorBoard), ``checkpoints/best`` when it improves
    (:func:`medattn.train.state.improves`) and ``checkpoints/last``; then ``on_epoch_end(epoch, row)``. Returns the
    seconds the epochs took."""
    training, built, state, train_cfg = run.training, run.built, run.state, run.config["train"]
    scalars = report.TensorBoardScalars(run_dir, state["epoch"] + 1) \
        if train_cfg["tensorboard"] and distributed.is_main() else None
    training_started = time.time()
    for epoch in range(state["epoch"] + 1, train_cfg["epochs"] + 1):
        epoch_start = time.time()
        train = train_one_epoch(built.ddp_model, built.trained, run.optimizer, training.batches(epoch), training,
                                train_cfg, state, run.schedule, device, epoch, progress, ema=built.ema)
        evaluated = built.model if built.ema is None else built.ema.module  # with EMA, the average is scored, kept
        val = training.validate(evaluated, epoch, progress)
        row = {"epoch": epoch, "lr": max(g["lr"] for g in run.optimizer.param_groups), **train, **val.row,
               "seconds": time.time() - epoch_start}
        state["epoch"] = epoch
        is_best = improves(state, val.score, val.loss, training.higher_is_better)
        if is_best:
            state["best_score"], state["best_loss"], state["best_epoch"] = val.score, val.loss, epoch
        if distributed.is_main():  # metrics first: a resumed run drops rows later than its checkpoint
            report.append_metrics(OutputFolder.within(run_dir), row, training.fields)
            if scalars is not None:
                scalars.add(row)
            save_checkpoints(run_dir, training, built, run.optimizer, state, evaluated, val.meta, is_best)
        distributed.barrier()
        log(f"epoch {epoch}/{train_cfg['epochs']}: train loss {train['train_loss']:.4f}  {val.line}"
            + ("  (best)" if is_best else ""))
        if on_epoch_end is not None:
            on_epoch_end(epoch, row)
    if scalars is not None:
        scalars.close()
    return time.time() - training_started


def train_one_epoch(ddp_model: nn.Module, model: nn.Module, optimizer: torch.optim.Optimizer, batches: Batches,
                    training: TrainingTask, train_cfg: dict, state: dict, schedule: dict, device: torch.device,
                    epoch: int, progress: bool, ema: EMA | None = None) -> dict:
    """One pass over this rank's training batches; returns ``train_loss`` (and the training task's further
    ``train_<part>``), each the mean over all ranks weighted as
    :meth:`~medattn.train.training_tasks.TrainingTask.batch_loss` says (a supervised batch by its samples, a
    diffusion step by one).

    Gradients accumulate over ``train.grad_accum`` batches (the last group of an epoch may be shorter and
    is weighted by its own size); DDP synchronises only on a group's last batch. ``state["step"]`` counts
    optimizer steps and sets the learning rate (:func:`medattn.train.optim.scheduled_lr`, times each parameter
    group's ``lr_scale``: layer-wise decay); ``ema`` is updated after every step. ``model`` is what the optimizer
    trains (its gradients are clipped), ``ddp_model`` what the training task's loss calls."""
    ddp_model.train()
    accum, n_batches = train_cfg["grad_accum"], len(batches)
    sums, seen = {"loss": 0.0}, 0.0
    bar = tqdm(batches, desc=f"epoch {epoch}/{train_cfg['epochs']} train", leave=False,
               disable=bars_off(progress and distributed.is_main()))
    for i, batch in enumerate(bar):
        group_start = (i // accum) * accum
        group_size = min(accum, n_batches - group_start)
        last_in_group = i == group_start + group_size - 1
        batch = {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
        sync = contextlib.nullcontext() if last_in_group or distributed.world_size() == 1 else ddp_model.no_sync()
        with sync:
            loss, weight, parts = training.batch_loss(ddp_model, batch)
            (loss / group_size).backward()
        for key, value in {"loss": loss.item(), **parts}.items():
            sums[key] = sums.get(key, 0.0) + value * weight
        seen += weight
        if last_in_group:
            lr = optimizer_step(model, optimizer, state, schedule, train_cfg, ema)
            bar.set_postfix(loss=f"{loss.item():.4f}", lr=f"{lr:.2e}")
    if not math.isfinite(sums["loss"]):
        raise UserError(f"training diverged in epoch {epoch} (loss is {sums['loss']}); lower train.lr or use fp32")
    totals = distributed.all_gather_rows(torch.tensor([[*sums.values(), seen]], dtype=torch.float64)).sum(0)
    return {f"train_{key}": float(totals[i] / max(1.0, float(totals[-1]))) for i, key in enumerate(sums)}

