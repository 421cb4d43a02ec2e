"""The training loop: one for every task, input kind, task type and mechanism, readable top to bottom.

:func:`fit` (the objective of the config's ``task``, :data:`medattn.train.tasks.TASKS`; its checks; the held run
folder) -> :func:`_fit`: :func:`_setup` (the objective's plan and model, the optimizer, a resumed run's state) ->
:func:`_run_epochs` (per epoch :func:`train_one_epoch` over the objective's batches, its validation, metrics.csv and
the checkpoints) -> the objective's results and test. What differs per task is the objective's
(:class:`medattn.train.tasks.TaskObjective`): :class:`Supervised` here, whose test is
:func:`medattn.train.results.test_best` (the best epoch's checkpoint on the test split, the verdict and the report
files), and the two stages of the 3D VQ diffusion model (:mod:`medattn.diffusion.vqae_stage`,
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
it, and the RNG states (and an objective's own, :meth:`~medattn.train.tasks.TaskObjective.state_tensors`) are part
of every checkpoint, so ``resume`` continues exactly where the killed run stopped. ``num_workers`` is 0 by default:
on CPU the workers compete with the model for the same cores.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from medattn.allocator import keep_freed_memory
from medattn.config import validate
from medattn.data import input_kinds
from medattn.data.base import DataBundle
from medattn.data.patches import RandomPatches
from medattn.data.validate import decode_all
from medattn.errors import UserError
from medattn.plan import apply as apply_plan
from medattn.plan import as_records, fingerprint, plan
from medattn.runtime import checkpoint, distributed, sliding
from medattn.runtime.build import build_model, check_model_config
from medattn.runtime.device import autocast, open_device
from medattn.runtime.predictor import Predictor, forward
from medattn.runtime.threshold import threshold_meta
from medattn.text import bars_off
from medattn.threads import set_threads

from . import report
from .acceleration import training_module
from .defaults import resolve_training
from .initialise import initialise
from .loaders import make_loader, seed_everything
from .model_notes import model_defaults, preset_design, size_warnings
from .objectives import metric_fields, objective_for
from .optim import EMA, make_optimizer, optimizer_step, step_schedule
from .results import CasePictures, LateDataError, test_best
from .rundir import RUN_FILES, killed_run_config, run_folder
from .sampling import drop_instances, positive_weight, recipe_labels
from .scoring import predict
from .standardize import fit_feature_norm
from .state import check_resume, improves, save_checkpoints, start_state
from .survival_bags import forward_each, survival_training
from .tasks import Batches, Built, TaskObjective, Validation, task_objective
from .trainable import check_trainable


def fit(config: dict, bundle: DataBundle, run_dir: Path, *, resume: bool = False, overwrite: bool = False,
        init_from: str | Path | None = None, progress: bool = True, device: torch.device | None = None,
        on_epoch_end: Callable[[int, dict], None] | None = None, log: Callable[[str], None] = print,
        started: float | None = None, case_pictures: CasePictures | None = None, test: bool = True) -> dict:
    """Train the objective of ``config["task"]``, select the best epoch by its validation score (AUROC, Dice, ...;
    a diffusion stage's lowest validation loss), test it; returns the results (also results.json).

    The config is checked first (:func:`medattn.config.validate`, then the objective: the model section, the
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

    objective = task_objective(config["task"])(bundle, main_log)
    config, chosen = resolve_training(config)
    objective.check(config, init_from, progress)
    if device is None:
        device = open_device(config["train"]["device"])  # joins the process group: ranks known from here
    run_dir = Path(run_dir)
    restart_of = None  # the saved config of a run --resume trains again from epoch 1
    if resume:
        restart_of = killed_run_config(run_dir, objective.saved_config)
        if restart_of is not None:
            resume, overwrite = False, True
        distributed.barrier()  # every rank has looked before the main rank sets a killed run aside
    replacing = overwrite and any((run_dir / name).exists() for name in RUN_FILES)
    with run_folder(run_dir, resume, overwrite):
        try:
            return _fit(objective, config, run_dir, resume=resume, init_from=init_from, progress=progress,
                        device=device, on_epoch_end=on_epoch_end, log=main_log, chosen=chosen, started=started,
                        restart_of=restart_of, case_pictures=case_pictures, test=test)
        except LateDataError as error:  # the test split failed after training; the weights are kept
            if replacing:  # ... unless the previous run comes back (the transaction of run_folder)
                raise UserError(f"{error}; the previous run in {run_dir} is back as it was") from None
            raise UserError(f"{error}; training finished and its best weights are kept in {run_dir}: score them "
                            f"with: medattn eval {run_dir} {run_dir / 'config.yaml'} --skip-bad") from None


def _fit(objective: TaskObjective, config: dict, run_dir: Path, *, resume: bool, init_from: str | Path | None,
         progress: bool, device: torch.device, on_epoch_end: Callable[[int, dict], None] | None,
         log: Callable[[str], None], chosen: dict, started: float, restart_of: dict | None = None,
         case_pictures: CasePictures | None = None, test: bool = True) -> dict:
    """:func:`fit` inside its held run folder (see ``run_folder``: an overwritten run stays until this returns):
    :func:`_setup`, :func:`_run_epochs`, then the objective's results and test.
    ``chosen``: the training values defaults chose (recorded with the data's, the model's and the plan's).
    ``restart_of``: the saved config of the killed run this one trains again (it must be the same)."""
    run = _setup(objective, config, run_dir, resume=resume, init_from=init_from, device=device, log=log,
                 chosen=chosen, restart_of=restart_of)
    train_seconds = _run_epochs(run, run_dir, device, progress, on_epoch_end, log)
    results = objective.results(run_dir, run.state, train_seconds)
    return objective.test(run_dir, results, progress, started, case_pictures) if test else results


@dataclass
class _Run:
    """What :func:`_setup` builds for the epochs."""

    config: dict  # planned and resolved: what config.yaml and the checkpoints hold
    objective: TaskObjective
    built: Built  # the model, what the optimizer trains, what the training pass calls, the EMA
    optimizer: torch.optim.Optimizer
    schedule: dict  # total_steps, warmup_steps
    state: dict  # epoch, step, best_score, best_loss, best_epoch, ema_updates: a checkpoint's training state


def _setup(objective: TaskObjective, config: dict, run_dir: Path, *, resume: bool, init_from: str | Path | None,
           device: torch.device, log: Callable[[str], None], chosen: dict, restart_of: dict | None) -> _Run:
    """The objective's plan (the config the run saves), a resume checked against it, threads and seed, the
    objective's model and batches, the optimizer and schedule, then a resumed run's state or config.yaml."""
    config = objective.plan(config, chosen)  # may read training samples: inside the run folder, whose rules apply
    check_resume(objective, config, run_dir, resume, restart_of, log)
    train_cfg = config["train"]
    set_threads(train_cfg["threads"], log)
    keep_freed_memory()  # large tensors reuse freed pages (medattn.allocator)
    seed_everything(config["seed"])
    built = objective.build(config, device, resume, init_from)
    optimizer = make_optimizer(built.trained, train_cfg)
    schedule = step_schedule(train_cfg, math.ceil(built.batches_per_epoch / train_cfg["grad_accum"]))
    state = start_state(objective, config, run_dir, resume, built, optimizer, log)
    return _Run(config, objective, built, optimizer, schedule, state)


def _run_epochs(run: _Run, run_dir: Path, device: torch.device, progress: bool,
                on_epoch_end: Callable[[int, dict], None] | None, log: Callable[[str], None]) -> float:
    """Train from the epoch after ``run.state["epoch"]`` to ``train.epochs``: per epoch one pass over the objective's
    training batches, its validation, metrics.csv (and TensorBoard), ``checkpoints/best`` when it improves
    (:func:`medattn.train.state.improves`) and ``checkpoints/last``; then ``on_epoch_end(epoch, row)``. Returns the
    seconds the epochs took."""
    objective, built, state, train_cfg = run.objective, run.built, run.state, run.config["train"]
    scalars = report.TensorBoardScalars(run_dir, state["epoch"] + 1) \
        if train_cfg["tensorboard"] and distributed.is_main() else None
    training_started = time.time()
    for epoch in range(state["epoch"] + 1, train_cfg["epochs"] + 1):
        epoch_start = time.time()
        train = train_one_epoch(built.ddp_model, built.trained, run.optimizer, objective.batches(epoch), objective,
                                train_cfg, state, run.schedule, device, epoch, progress, ema=built.ema)
        evaluated = built.model if built.ema is None else built.ema.module  # with EMA, the average is scored, kept
        val = objective.validate(evaluated, epoch, progress)
        row = {"epoch": epoch, "lr": max(g["lr"] for g in run.optimizer.param_groups), **train, **val.row,
               "seconds": time.time() - epoch_start}
        state["epoch"] = epoch
        is_best = improves(state, val.score, val.loss, objective.higher_is_better)
        if is_best:
            state["best_score"], state["best_loss"], state["best_epoch"] = val.score, val.loss, epoch
        if distributed.is_main():  # metrics first: a resumed run drops rows later than its checkpoint
            report.append_metrics(run_dir / "metrics.csv", row, objective.fields)
            if scalars is not None:
                scalars.add(row)
            save_checkpoints(run_dir, objective, built, run.optimizer, state, evaluated, val.meta, is_best)
        distributed.barrier()
        log(f"epoch {epoch}/{train_cfg['epochs']}: train loss {train['train_loss']:.4f}  {val.line}"
            + ("  (best)" if is_best else ""))
        if on_epoch_end is not None:
            on_epoch_end(epoch, row)
    if scalars is not None:
        scalars.close()
    return time.time() - training_started


def train_one_epoch(ddp_model: nn.Module, model: nn.Module, optimizer: torch.optim.Optimizer, batches: Batches,
                    objective: TaskObjective, train_cfg: dict, state: dict, schedule: dict, device: torch.device,
                    epoch: int, progress: bool, ema: EMA | None = None) -> dict:
    """One pass over this rank's training batches; returns ``train_loss`` (and the objective's further
    ``train_<part>``), each the mean over all ranks weighted as :meth:`~medattn.train.tasks.TaskObjective.batch_loss`
    says (a supervised batch by its samples, a diffusion step by one).

    Gradients accumulate over ``train.grad_accum`` batches (the last group of an epoch may be shorter and
    is weighted by its own size); DDP synchronises only on a group's last batch. ``state["step"]`` counts
    optimizer steps and sets the learning rate (:func:`medattn.train.optim.scheduled_lr`, times each parameter
    group's ``lr_scale``: layer-wise decay); ``ema`` is updated after every step. ``model`` is what the optimizer
    trains (its gradients are clipped), ``ddp_model`` what the objective's loss calls."""
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
            loss, weight, parts = objective.batch_loss(ddp_model, batch)
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


class Supervised:
    """The objective of ``task: supervised`` (:class:`medattn.train.tasks.TaskObjective`): a registered model
    (:func:`medattn.runtime.build.build_model`) on labelled data, its loss and scores from the task type
    (:func:`medattn.train.objectives.objective_for`), validation by :func:`predict`, the test by
    :func:`medattn.train.results.test_best`."""

    higher_is_better = True

    def __init__(self, bundle: DataBundle, log: Callable[[str], None]) -> None:
        self.bundle, self.log = bundle, log

    def check(self, config: dict, init_from: str | Path | None, progress: bool) -> None:
        """Training and validation cases, the model section; every file decoded once (unless ``train.skip_bad``)."""
        for split in ("train", "val"):
            if len(getattr(self.bundle, split)) == 0:
                raise UserError(f"the {split} split is empty: training needs training and validation cases (check the "
                                f"split column or data.val_fraction / data.test_fraction); to score a trained model "
                                f"on an all-test cohort use medattn eval")
        check_trainable(self.bundle)  # survival/regression labels it cannot learn from: before any epoch
        check_model_config(config["model"])
        if not config["train"]["skip_bad"]:  # with skip_bad the builders decoded every file already
            decode_all(self.bundle, progress and distributed.is_main())

    def plan(self, config: dict, chosen: dict) -> dict:
        """The plan (:mod:`medattn.plan`) fills the keys the config leaves null from the data's fingerprint; it is
        deterministic, so a resumed run plans the same."""
        found = fingerprint(self.bundle)  # reads training samples
        decisions = plan(config, found)
        self.chosen = {**chosen, **{d.key: d.value for d in decisions if d.applied}}
        self.planned = {"fingerprint": found, "decisions": as_records(decisions)}
        return apply_plan(config, decisions)

    def saved_config(self, folder: Path) -> dict:
        return checkpoint.load_meta(folder)["config"]

    def build(self, config: dict, device: torch.device, resume: bool, init_from: str | Path | None) -> Built:
        """The model (initialised, feature statistics), the EMA, DDP and compile, the loaders."""
        train_cfg, task, bundle, log = config["train"], self.bundle.task, self.bundle, self.log
        self.config, self.task, self.device = config, task, device
        self.objective = objective_for(task, train_cfg["loss"])  # scores validation and test with the plain loss
        if train_cfg["batch_size"] < getattr(self.objective, "min_batch_size", 1):
            raise UserError(f"a {task.task_type} task compares the samples of a batch (Cox partial likelihood): "
                            f"train.batch_size must be at least {self.objective.min_batch_size}, got "
                            f"{train_cfg['batch_size']} (or train.loss=discrete_time, which trains at batch 1)")
        self.fields = metric_fields(self.objective)
        labels = recipe_labels(train_cfg, task, bundle.train)
        self.train_objective = objective_for(task, train_cfg["loss"], train_cfg["label_smoothing"],  # the training
                                             positive_weight(labels, task.task_type, train_cfg["pos_weight"]))  # loss
        self.per_bag, events = survival_training(self.train_objective, task, bundle.train, train_cfg)
        patch = sliding.patch_shape(config, task)
        # a model trained on patches is built for the patch (a ViT's position embeddings match it)
        model_task = replace(task, input_shape=(task.input_shape[0], *patch)) if patch else task
        self.model = build_model(config["model"], model_task).to(device)
        self.warnings = [*bundle.warnings, *size_warnings(config["model"], model_task)]  # the data does not fit
        for warning in self.warnings:
            log(f"WARNING: {warning}")
        self.init_report = None if resume or init_from is None else initialise(self.model, init_from, log)
        self.standardized = fit_feature_norm(self.model, bundle.train)  # after --init-from: this data's statistics
        self.defaults = {**self.chosen, **bundle.defaults, **model_defaults(config["model"])}
        _log_choices(self.defaults, self.planned["decisions"], log)
        ema = EMA(self.model, train_cfg["ema"]) if train_cfg["ema"] else None  # after init: from those weights
        ddp_model = DistributedDataParallel(self.model) if distributed.world_size() > 1 else self.model
        ddp_model = training_module(self.model, ddp_model, train_cfg)  # checkpointing, torch.compile
        train_set = RandomPatches(bundle.train, patch, train_cfg["patch_foreground"]) if patch else bundle.train
        seed, workers = config["seed"], train_cfg["num_workers"]
        self.train_loader = make_loader(train_set, train_cfg["batch_size"], True, seed, workers,
                                        balance=labels if train_cfg["class_balance"] else None, events=events)
        self.val_loader = make_loader(bundle.val, train_cfg["eval_batch_size"] or train_cfg["batch_size"], False,
                                      seed, workers)
        self.meta = checkpoint_meta(config, bundle)
        return Built(self.model, self.model, ddp_model, len(self.train_loader), self.defaults, ema)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {}  # the loop keeps the EMA's; the order is the seed's and the epoch's

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        pass

    def batches(self, epoch: int) -> Batches:
        """The loader in the order of the seed and the epoch; bags lose ``train.instance_dropout`` of their instances
        (:func:`medattn.train.sampling.drop_instances`)."""
        loader, rate = self.train_loader, self.config["train"]["instance_dropout"]
        loader.sampler.set_epoch(epoch)
        loader.generator.manual_seed(self.config["seed"] * 100_003 + epoch)  # worker seeds depend on the epoch only
        if input_kinds.of(self.task.input_kind).instances:
            return Batches(len(loader), (drop_instances(batch, rate) for batch in loader))
        return Batches(len(loader), loader)

    def batch_loss(self, model: nn.Module, batch: dict) -> tuple[torch.Tensor, float, dict[str, float]]:
        with autocast(self.device, self.config["train"]["precision"]):
            logits = (forward_each if self.per_bag else forward)(model, batch, self.task.input_kind)
        return self.train_objective.loss(logits, batch["label"]), len(batch["id"]), {}

    def validate(self, model: nn.Module, epoch: int, progress: bool) -> Validation:
        """The validation score with the plain loss; the checkpoint records it and the validation thresholds."""
        val = predict(Predictor.for_run(model, self.config, self.task, self.device), self.val_loader, self.objective,
                      f"epoch {epoch} val", progress)
        score, key = self.objective.val_score(val), f"val_{self.objective.metric}"
        meta = {**self.meta, "epoch": epoch, key: score,  # + the validation thresholds (Youden's J)
                **threshold_meta(val.outputs, val.labels, self.task.task_type, epoch)}
        return Validation(score, val.loss, {"val_loss": val.loss, key: score}, meta,
                          f"val loss {val.loss:.4f}  val {self.objective.metric_label} {score:.4f}")

    def results(self, run_dir: Path, state: dict, train_seconds: float) -> dict:
        """results.json before the test: the run, its best epoch and validation score, the data and the setup."""
        config, metric, bundle = self.config, self.objective.metric, self.bundle
        return {
            "run_dir": str(run_dir), "synthetic": self.task.synthetic, "data": config["data"].get("kind"),
            "model": config["model"]["name"], "attention": config["model"]["attention"],
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "epochs": config["train"]["epochs"], "best_epoch": state["best_epoch"], "metric": metric,
            f"val_{metric}": state["best_score"],
            "skipped_samples": bundle.skipped, "train_seconds": train_seconds,
            "n_train": len(bundle.train), "n_val": len(bundle.val), "init_from": self.init_report,
            "warnings": self.warnings, "defaults": self.defaults,
            "feature_standardization": self.standardized, "plan": self.planned,
            "recipe": config["recipe"]["record"],
        }

    def test(self, run_dir: Path, results: dict, progress: bool, started: float,
             case_pictures: CasePictures | None) -> dict:
        return test_best(self.model, self.config, self.bundle, run_dir, results, self.device, progress, self.log,
                         started, case_pictures)


def _log_choices(defaults: dict, decisions: list[dict], log: Callable[[str], None]) -> None:
    """The values defaults chose and the plan's decisions, one line each."""
    log("defaults: " + ", ".join(f"{k}={v}" for k, v in defaults.items()) if defaults else "defaults: none used")
    for decision in decisions:
        log(f"plan: {decision['key']}={decision['value']}{'' if decision['applied'] else ' (as configured)'}: "
            f"{decision['reason']}")


def checkpoint_meta(config: dict, bundle: DataBundle) -> dict:
    """What every checkpoint of a supervised run records: the config, the task, the preset's design values, the
    preprocessing the builder applied (predict, explain and export reuse it) and what made a bag run's features
    (eval, predict and explain refuse others)."""
    meta = {"config": config, "task": checkpoint.task_to_dict(bundle.task),
            "model_defaults": preset_design(config["model"])}
    if bundle.preprocessing is not None:
        meta["preprocessing"] = bundle.preprocessing.to_dict()
    if bundle.features is not None:
        meta["features"] = bundle.features
    return meta
