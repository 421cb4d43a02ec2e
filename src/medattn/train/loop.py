"""The training loop: one for every input kind, task type and mechanism, readable top to bottom.

:func:`fit` (checks, the held run folder) -> :func:`_fit`: :func:`_setup` (plan, model, optimizer, loaders, a
resumed run's state) -> :func:`_run_epochs` (per epoch :func:`train_one_epoch`, then :func:`predict` on the
validation split and the checkpoints) -> :func:`_results`, then :func:`medattn.train.results.test_best`: the best
epoch's checkpoint on the test split, the verdict and the report files. Case heatmaps for the report are drawn by
what the caller hands in (``case_pictures``); training imports no explanation code.

Training: AdamW (:mod:`medattn.train.optim`), a linear warm-up then cosine decay of the learning rate (per
optimizer step), gradient clipping, gradient accumulation and optional bf16 autocast. After every epoch the
validation split is scored, a checkpoint is written atomically (``checkpoints/last``) and the one with the
best validation score is kept (``checkpoints/best``; ties go to the lower validation loss, see
:func:`improves`); that one is tested at the end. What is optimised and scored comes from the task type
(:func:`medattn.train.objectives.objective_for`); the run folder is described in :mod:`medattn.train.rundir`.

Reproducibility: the seed sets torch/numpy/random; the training order comes from a sampler seeded with
``seed`` and the epoch (``DistributedSampler``, also with one process), DataLoader workers are seeded from
it, and the RNG states are part of every checkpoint, so ``resume`` continues exactly where the killed run
stopped. ``num_workers`` is 0 by default: on CPU the workers compete with the model for the same cores.
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
from torch.utils.data import DataLoader
from tqdm import tqdm

from medattn.allocator import keep_freed_memory
from medattn.config import save_config, validate
from medattn.data import input_kinds
from medattn.data.base import DataBundle, TaskInfo
from medattn.data.patches import RandomPatches
from medattn.data.validate import decode_all
from medattn.errors import UserError, writing
from medattn.models.pretrained import describe, load_pretrained
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
from .loaders import make_loader, seed_everything
from .model_notes import model_defaults, preset_design, size_warnings
from .objectives import Classification, Segmentation, metric_fields, objective_for
from .optim import EMA, make_optimizer, optimizer_step, step_schedule
from .results import CasePictures, LateDataError, test_best
from .rundir import RUN_FILES, config_diff, run_folder, stopped_before_last
from .sampling import drop_instances, positive_weight, recipe_labels
from .scoring import predict
from .standardize import fit_feature_norm


def fit(config: dict, bundle: DataBundle, run_dir: Path, *, resume: bool = False, overwrite: bool = False,
        init_from: str | Path | None = None, progress: bool = True, device: torch.device | None = None,
        on_epoch_end: Callable[[int, dict], None] | None = None, log: Callable[[str], None] = print,
        started: float | None = None, case_pictures: CasePictures | None = None) -> dict:
    """Train, select the best epoch by the validation score (AUROC, or Dice for segmentation), test it;
    returns the results (also results.json).

    The config is checked first (:func:`medattn.config.validate`, the model section, the device); the
    run folder is held for the whole run (:func:`medattn.train.rundir.run_folder`: locked; an overwritten
    run is deleted only once this run has written its first checkpoint). ``on_epoch_end(epoch, row)`` is
    called after each epoch's checkpoint is written (tests use it to interrupt a run). With ``init_from``
    the model starts from another checkpoint's shared tensors, or from a plain weights file of a timm,
    DINO, MAE or MONAI ViT (:func:`medattn.models.pretrained.load_pretrained`).

    ``resume`` of a run killed before its first resumable checkpoint (``checkpoints/best`` written, ``last`` not:
    :func:`medattn.train.rundir.stopped_before_last`) trains it again from epoch 1 as an overwrite (the killed run's
    files come back on failure), if the config is the one its best checkpoint saved.

    ``train.*`` keys left null take the model's own values (:func:`medattn.train.defaults.resolve_training`);
    the run saves and reports the resolved config. ``started`` (``time.time()`` when the command began; default:
    now) makes the summary's elapsed time the whole command's, not only training's. ``case_pictures``
    (:data:`CasePictures`) draws the highest-scored test cases for report.html; None: no heatmaps.
    """
    started = time.time() if started is None else started
    validate(config)
    for split in ("train", "val"):
        if len(getattr(bundle, split)) == 0:
            raise UserError(f"the {split} split is empty: training needs training and validation cases (check the "
                            f"split column or data.val_fraction / data.test_fraction); to score a trained model on "
                            f"an all-test cohort use medattn eval")
    config, chosen = resolve_training(config)
    check_model_config(config["model"])
    if not config["train"]["skip_bad"]:  # with skip_bad the builders decoded every file already
        decode_all(bundle, progress and distributed.is_main())
    if device is None:
        device = open_device(config["train"]["device"])  # joins the process group: ranks known from here
    run_dir = Path(run_dir)
    restart_of = None  # the saved config of a run --resume trains again from epoch 1
    if resume:
        if stopped_before_last(run_dir):
            restart_of = checkpoint.load_meta(checkpoint.resolve(run_dir / "checkpoints" / "best"))["config"]
            resume, overwrite = False, True
        distributed.barrier()  # every rank has looked before the main rank sets a killed run aside
    replacing = overwrite and any((run_dir / name).exists() for name in RUN_FILES)
    with run_folder(run_dir, resume, overwrite):
        try:
            return _fit(config, bundle, run_dir, resume=resume, init_from=init_from, progress=progress,
                        device=device, on_epoch_end=on_epoch_end, log=log, chosen=chosen, started=started,
                        restart_of=restart_of, case_pictures=case_pictures)
        except LateDataError as error:  # the test split failed after training; the weights are kept
            if replacing:  # ... unless the previous run comes back (the transaction of run_folder)
                raise UserError(f"{error}; the previous run in {run_dir} is back as it was") from None
            raise UserError(f"{error}; training finished and its best weights are kept in {run_dir}: score them "
                            f"with: medattn eval {run_dir} {run_dir / 'config.yaml'} --skip-bad") from None


def _fit(config: dict, bundle: DataBundle, run_dir: Path, *, resume: bool,
         init_from: str | Path | None, progress: bool, device: torch.device,
         on_epoch_end: Callable[[int, dict], None] | None, log: Callable[[str], None], chosen: dict,
         started: float, restart_of: dict | None = None, case_pictures: CasePictures | None = None) -> dict:
    """:func:`fit` inside its held run folder (see ``run_folder``: an overwritten run stays until this returns):
    :func:`_setup`, :func:`_run_epochs`, then :func:`test_best` of :func:`_results`.
    ``chosen``: the training values defaults chose (recorded with the data's, the model's and the plan's).
    ``restart_of``: the saved config of the killed run this one trains again (it must be the same)."""
    log = log if distributed.is_main() else (lambda message: None)
    run = _setup(config, bundle, run_dir, resume=resume, init_from=init_from, device=device, log=log, chosen=chosen,
                 restart_of=restart_of)
    train_seconds = _run_epochs(run, run_dir, device, progress, on_epoch_end, log)
    results = _results(run, bundle, run_dir, train_seconds)
    return test_best(run.model, run.config, bundle, run_dir, results, device, progress, log, started, case_pictures)


@dataclass
class _Run:
    """What :func:`_setup` builds for the epochs and the results."""

    config: dict  # planned and resolved: what config.yaml and the checkpoints hold
    task: TaskInfo
    model: nn.Module  # the model itself; ``ddp_model`` is what the training pass calls (DDP, compile)
    ddp_model: nn.Module
    optimizer: torch.optim.Optimizer
    ema: EMA | None
    objective: Classification | Segmentation  # scores validation and test with the plain loss
    train_objective: Classification | Segmentation  # the training loss (label smoothing, pos_weight)
    train_loader: DataLoader
    val_loader: DataLoader
    schedule: dict  # total_steps, warmup_steps
    state: dict  # epoch, step, best_score, best_loss, best_epoch, ema_updates: a checkpoint's training state
    meta: dict  # what every checkpoint records
    setup: dict  # results.json's record of the setup: init_from, warnings, defaults, feature_standardization, plan


def _setup(config: dict, bundle: DataBundle, run_dir: Path, *, resume: bool, init_from: str | Path | None,
           device: torch.device, log: Callable[[str], None], chosen: dict, restart_of: dict | None) -> _Run:
    """Plan, check a resume, build the model (initialised, feature statistics), optimizer, EMA, loaders and
    schedule, then restore a resumed run's state or write config.yaml. The plan (:mod:`medattn.plan`) fills the
    keys the config leaves null from the data's fingerprint; it is deterministic, so a resumed run plans the same."""
    found = fingerprint(bundle)  # reads training samples: inside the run folder, whose failure rules apply
    decisions = plan(config, found)
    config = apply_plan(config, decisions)
    chosen = {**chosen, **{d.key: d.value for d in decisions if d.applied}}
    planned = {"fingerprint": found, "decisions": as_records(decisions)}
    train_cfg, task, seed = config["train"], bundle.task, config["seed"]
    _check_resume(config, run_dir, resume, restart_of, log)
    set_threads(train_cfg["threads"], log)
    keep_freed_memory()  # large tensors reuse freed pages (medattn.allocator)
    seed_everything(seed)
    objective = objective_for(task, train_cfg["loss"])  # scores validation and test with the plain loss
    if train_cfg["batch_size"] < getattr(objective, "min_batch_size", 1):
        raise UserError(f"a {task.task_type} task compares the samples of a batch (Cox partial likelihood): "
                         f"train.batch_size must be at least {objective.min_batch_size}, got {train_cfg['batch_size']}")
    train_labels = recipe_labels(train_cfg, task, bundle.train)
    train_objective = objective_for(task, train_cfg["loss"], train_cfg["label_smoothing"],
                                    positive_weight(train_labels, task.task_type, train_cfg["pos_weight"]))
    patch = sliding.patch_shape(config, task)
    # a model trained on patches is built for the patch (a ViT's position embeddings match it)
    model_task = replace(task, input_shape=(task.input_shape[0], *patch)) if patch else task
    model = build_model(config["model"], model_task).to(device)
    setup_warnings = [*bundle.warnings, *size_warnings(config["model"], model_task)]  # the data does not fit
    for warning in setup_warnings:
        log(f"WARNING: {warning}")
    init_report = None if resume or init_from is None else initialise(model, init_from, log)
    standardized = fit_feature_norm(model, bundle.train)  # after --init-from: this data's statistics win
    defaults = {**chosen, **bundle.defaults, **model_defaults(config["model"])}
    _log_choices(defaults, planned["decisions"], log)
    optimizer = make_optimizer(model, train_cfg)
    ema = EMA(model, train_cfg["ema"]) if train_cfg["ema"] else None  # after init: it starts from those weights
    ddp_model = DistributedDataParallel(model) if distributed.world_size() > 1 else model
    ddp_model = training_module(model, ddp_model, train_cfg)  # checkpointing, torch.compile (train/acceleration.py)
    eval_bs = train_cfg["eval_batch_size"] or train_cfg["batch_size"]
    train_set = RandomPatches(bundle.train, patch, train_cfg["patch_foreground"]) if patch else bundle.train
    train_loader = make_loader(train_set, train_cfg["batch_size"], True, seed, train_cfg["num_workers"],
                               balance=train_labels if train_cfg["class_balance"] else None)
    val_loader = make_loader(bundle.val, eval_bs, False, seed, train_cfg["num_workers"])
    schedule = step_schedule(train_cfg, math.ceil(len(train_loader) / train_cfg["grad_accum"]))
    state = _start_state(config, run_dir, resume, model, optimizer, ema, defaults, metric_fields(objective), log)
    meta = {"config": config, "task": checkpoint.task_to_dict(task),
            "model_defaults": preset_design(config["model"])}
    if bundle.preprocessing is not None:  # what the builder applied: predict, explain and export reuse it
        meta["preprocessing"] = bundle.preprocessing.to_dict()
    if bundle.features is not None:  # what made the training bags' features: eval, predict, explain refuse others
        meta["features"] = bundle.features
    setup = {"init_from": init_report, "warnings": setup_warnings, "defaults": defaults,
             "feature_standardization": standardized, "plan": planned}
    return _Run(config, task, model, ddp_model, optimizer, ema, objective, train_objective, train_loader, val_loader,
                schedule, state, meta, setup)


def _check_resume(config: dict, run_dir: Path, resume: bool, restart_of: dict | None,
                  log: Callable[[str], None]) -> None:
    """A resumed or restarted run must have the saved config (``checkpoints/last``'s, or ``restart_of``)."""
    if resume or restart_of is not None:
        saved = restart_of or checkpoint.load_meta(checkpoint.resolve(run_dir / "checkpoints" / "last"))["config"]
        changed = config_diff(saved, config)
        if changed:
            raise UserError(f"--resume: the config differs from the run's saved config in {', '.join(changed)}")
    if restart_of is not None:
        log(f"{run_dir} stopped before its first resumable checkpoint: training it again from epoch 1")


def _log_choices(defaults: dict, decisions: list[dict], log: Callable[[str], None]) -> None:
    """The values defaults chose and the plan's decisions, one line each."""
    log("defaults: " + ", ".join(f"{k}={v}" for k, v in defaults.items()) if defaults else "defaults: none used")
    for decision in decisions:
        log(f"plan: {decision['key']}={decision['value']}{'' if decision['applied'] else ' (as configured)'}: "
            f"{decision['reason']}")


def _start_state(config: dict, run_dir: Path, resume: bool, model: nn.Module, optimizer: torch.optim.Optimizer,
                 ema: EMA | None, defaults: dict, fields: list, log: Callable[[str], None]) -> dict:
    """The training state: a resumed run's from ``checkpoints/last`` (model, optimizer and EMA loaded, metrics.csv
    cut back to it), else a fresh one (and config.yaml written with the defaults used)."""
    state = {"epoch": 0, "step": 0, "best_score": None, "best_loss": None, "best_epoch": None, "ema_updates": 0}
    if resume:
        last = checkpoint.resolve(run_dir / "checkpoints" / "last")
        checkpoint.load_model(last, model)
        state.update({k: v for k, v in checkpoint.load_training_state(last, optimizer).items() if k in state})
        if ema is not None:
            ema.load_state_dict(checkpoint.load_extra_tensors(last, "ema."), state["ema_updates"])
        log(f"resuming {run_dir} after epoch {state['epoch']} (step {state['step']})")
        report.truncate_metrics(run_dir / "metrics.csv", state["epoch"], fields)
    elif distributed.is_main():
        with writing(run_dir / "config.yaml"):
            save_config(config, run_dir / "config.yaml", defaults)
    return state


def _run_epochs(run: _Run, run_dir: Path, device: torch.device, progress: bool,
                on_epoch_end: Callable[[int, dict], None] | None, log: Callable[[str], None]) -> float:
    """Train from the epoch after ``run.state["epoch"]`` to ``train.epochs``: per epoch one pass over the training
    split, the validation score, metrics.csv (and TensorBoard), ``checkpoints/best`` when it improves (:func:`improves`)
    and ``checkpoints/last``; then ``on_epoch_end(epoch, row)``. Returns the seconds the epochs took."""
    config, task, state, ema = run.config, run.task, run.state, run.ema
    train_cfg = config["train"]
    fields, score_key = metric_fields(run.objective), f"val_{run.objective.metric}"
    scalars = report.TensorBoardScalars(run_dir, state["epoch"] + 1) \
        if train_cfg["tensorboard"] and distributed.is_main() else None
    training_started = time.time()
    for epoch in range(state["epoch"] + 1, train_cfg["epochs"] + 1):
        epoch_start = time.time()
        train_loss = train_one_epoch(run.ddp_model, run.model, run.optimizer, run.train_loader, run.train_objective,
                                     task, train_cfg, state, run.schedule, epoch, config["seed"], device, progress,
                                     ema=ema)
        evaluated = run.model if ema is None else ema.module  # with EMA, the averaged weights are scored and kept
        val = predict(Predictor.for_run(evaluated, config, task, device), run.val_loader, run.objective,
                      f"epoch {epoch} val", progress)
        val_score = run.objective.val_score(val)
        row = {"epoch": epoch, "lr": max(g["lr"] for g in run.optimizer.param_groups), "train_loss": train_loss,
               "val_loss": val.loss, score_key: val_score, "seconds": time.time() - epoch_start}
        state["epoch"] = epoch
        is_best = improves(state, val_score, val.loss)
        if is_best:
            state["best_score"], state["best_loss"], state["best_epoch"] = val_score, val.loss, epoch
        if distributed.is_main():  # metrics first: a resumed run drops rows later than its checkpoint
            report.append_metrics(run_dir / "metrics.csv", row, fields)
            if scalars is not None:
                scalars.add(row)
            epoch_meta = {**run.meta, "epoch": epoch, score_key: val_score,  # + the validation thresholds (Youden's J)
                          **threshold_meta(val.outputs, val.labels, task.task_type, epoch)}
            if is_best:
                checkpoint.save(run_dir / "checkpoints" / "best", evaluated, epoch_meta)
            state["ema_updates"] = 0 if ema is None else ema.updates
            checkpoint.save(run_dir / "checkpoints" / "last", run.model, epoch_meta, run.optimizer, state,
                            extra_tensors=None if ema is None else ema.state_dict())
        distributed.barrier()
        log(f"epoch {epoch}/{train_cfg['epochs']}: train loss {train_loss:.4f}  val loss {val.loss:.4f}  "
            f"val {run.objective.metric_label} {val_score:.4f}" + ("  (best)" if is_best else ""))
        if on_epoch_end is not None:
            on_epoch_end(epoch, row)
    if scalars is not None:
        scalars.close()
    return time.time() - training_started


def _results(run: _Run, bundle: DataBundle, run_dir: Path, train_seconds: float) -> dict:
    """results.json before the test: the run, its best epoch and validation score, the data and the setup."""
    config, state, metric = run.config, run.state, run.objective.metric
    return {
        "run_dir": str(run_dir), "synthetic": run.task.synthetic, "data": config["data"].get("kind"),
        "model": config["model"]["name"], "attention": config["model"]["attention"],
        "parameters": sum(p.numel() for p in run.model.parameters()),
        "epochs": config["train"]["epochs"], "best_epoch": state["best_epoch"], "metric": metric,
        f"val_{metric}": state["best_score"],
        "skipped_samples": bundle.skipped, "train_seconds": train_seconds,
        "n_train": len(bundle.train), "n_val": len(bundle.val), "init_from": run.setup["init_from"],
        "warnings": run.setup["warnings"], "defaults": run.setup["defaults"],
        "feature_standardization": run.setup["feature_standardization"], "plan": run.setup["plan"],
    }


def initialise(model: nn.Module, init_from: str | Path, log: Callable[[str], None]) -> dict:
    """Load ``init_from`` into a new model: a plain weights file (timm, DINO, MAE or MONAI ViT) or another run's
    checkpoint (its shared tensors); logs and returns what was loaded, adapted, new and unused."""
    if checkpoint.is_plain_weights(init_from):
        loaded = load_pretrained(model, init_from)
        log(f"initialised from {init_from}: {describe(loaded)}")
        return {"from": str(init_from), **loaded}
    folder = checkpoint.resolve(init_from)
    new, unused = checkpoint.init_from(model, folder)
    pretrained = checkpoint.load_meta(folder).get("pretrained")  # written by medattn pretrain
    log(f"initialised from {init_from}" + (f" (pretrained by {pretrained['objective']})" if pretrained else "")
        + f": {len(new)} new tensor(s)" + (f": {_some(new)}" if new else "")
        + (f"; {len(unused)} checkpoint tensor(s) unused: {_some(unused)}" if unused else "")
        + ("; every name is in results.json (init_from)" if len(new) + len(unused) > 2 * SHOWN_NAMES else ""))
    return {"from": str(init_from), "new_tensors": new, "unused_tensors": unused, "pretrained": pretrained}


#: Tensor names a log line shows before it counts the rest.
SHOWN_NAMES = 6


def _some(names: list[str]) -> str:
    """The first :data:`SHOWN_NAMES` names, and how many more."""
    more = len(names) - SHOWN_NAMES
    return ", ".join(names[:SHOWN_NAMES]) + (f" and {more} more" if more > 0 else "")


def train_one_epoch(ddp_model: nn.Module, model: nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader,
                    objective, task: TaskInfo, train_cfg: dict, state: dict, schedule: dict, epoch: int, seed: int,
                    device: torch.device, progress: bool, ema: EMA | None = None) -> float:
    """One pass over this rank's training share; returns the mean train loss over all ranks.

    Gradients accumulate over ``train.grad_accum`` batches (the last group of an epoch may be shorter and
    is weighted by its own size); DDP synchronises only on a group's last batch. ``state["step"]`` counts
    optimizer steps and sets the learning rate (:func:`medattn.train.optim.scheduled_lr`, times each parameter
    group's ``lr_scale``: layer-wise decay); ``ema`` is updated after every step. Bags lose
    ``train.instance_dropout`` of their instances (:func:`medattn.train.sampling.drop_instances`)."""
    loader.sampler.set_epoch(epoch)
    loader.generator.manual_seed(seed * 100_003 + epoch)  # worker seeds depend on the epoch only
    ddp_model.train()
    accum, n_batches = train_cfg["grad_accum"], len(loader)
    loss_sum, seen = 0.0, 0
    batches = tqdm(loader, desc=f"epoch {epoch}/{train_cfg['epochs']} train", leave=False,
                   disable=bars_off(progress and distributed.is_main()))
    for i, batch in enumerate(batches):
        group_start = (i // accum) * accum
        group_size = min(accum, n_batches - group_start)
        last_in_group = i == group_start + group_size - 1
        if input_kinds.of(task.input_kind).instances:
            batch = drop_instances(batch, train_cfg["instance_dropout"])
        batch = {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
        sync = contextlib.nullcontext() if last_in_group or distributed.world_size() == 1 else ddp_model.no_sync()
        with sync:
            with autocast(device, train_cfg["precision"]):
                logits = forward(ddp_model, batch, task.input_kind)
            loss = objective.loss(logits, batch["label"])
            (loss / group_size).backward()
        loss_sum += loss.item() * len(batch["id"])
        seen += len(batch["id"])
        if last_in_group:
            lr = optimizer_step(model, optimizer, state, schedule, train_cfg, ema)
            batches.set_postfix(loss=f"{loss.item():.4f}", lr=f"{lr:.2e}")
    if not math.isfinite(loss_sum):
        raise UserError(f"training diverged in epoch {epoch} (loss is {loss_sum}); lower train.lr or use fp32")
    totals = distributed.all_gather_rows(torch.tensor([[loss_sum, seen]], dtype=torch.float64)).sum(0)
    return float(totals[0] / max(1.0, float(totals[1])))


def improves(state: dict, score: float, loss: float) -> bool:
    """Whether an epoch with validation ``score`` and ``loss`` replaces the best so far: a higher score, or
    the same score with a lower loss. Small validation sets saturate (AUROC 1.0 from epoch 1 or 2); without
    the tie-break the barely trained first epoch at the ceiling stayed "best"."""
    if state["best_score"] is None or score > state["best_score"]:
        return True
    return score == state["best_score"] and (state.get("best_loss") is None or loss < state["best_loss"])
