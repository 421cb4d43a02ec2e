"""The training task ``supervised`` (:class:`medattn.train.training_tasks.TrainingTask`): a registered model on
labelled data.

What :class:`Supervised` owns, hook by hook: ``check`` refuses data it cannot train on (empty splits, labels a
survival or regression model cannot learn from: :func:`medattn.train.trainable.check_trainable`) and decodes every
file once; ``plan`` fills the keys the config leaves null from the data's fingerprint (:mod:`medattn.plan`);
``build`` makes the run's :class:`_Parts` once (the task type's :class:`~medattn.train.objectives.Objective`, the
model from :func:`medattn.runtime.build.build_model` prepared by :mod:`medattn.train.model_setup`, the loaders of
:mod:`medattn.train.sampling`); ``batches``, ``batch_loss`` and ``validate`` train and score with them; ``test`` is
:func:`medattn.train.results.test_best` (the best epoch's checkpoint on the test split, the verdict and the report
files).

State: the plan reaches ``build`` as its argument (:class:`~medattn.train.training_tasks.Planned`), and ``build``
assigns one attribute, ``parts``, which every later hook reads; nothing else is kept between hooks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from medattn.data import input_kinds
from medattn.data.base import DataBundle, TaskInfo
from medattn.data.kinds.patches import RandomPatches
from medattn.data.validate import decode_all
from medattn.errors import UserError
from medattn.plan import apply as apply_plan
from medattn.plan import as_records, fingerprint, plan
from medattn.runtime import checkpoint, distributed, sliding
from medattn.runtime.build import build_model, check_model_config
from medattn.runtime.device import autocast
from medattn.runtime.predictor import Predictor, forward
from medattn.runtime.threshold import threshold_meta

from .model_setup import fit_feature_norm, initialise, model_defaults, preset_design, size_warnings, training_module
from .objectives import Objective, metric_fields, objective_for
from .optim import EMA
from .pooled_path import fit_pooled_path
from .predictions import predict
from .report import read_metrics
from .results import CasePictures, learning_verdict, test_best
from .sampling import drop_instances, make_loader, positive_weight, recipe_labels
from .survival_bags import forward_each, survival_training
from .trainable import check_trainable
from .training_tasks import Batches, Built, Planned, Validation

#: What a run does to its model before the first epoch (initialised from ``--init-from``; a bag model's feature
#: statistics and pooled-feature path fitted on the training split): keys of results.json and of checkpoint.json's
#: ``before_training``, which a resumed run reads back instead of doing it again.
BEFORE_TRAINING = ("init_from", "feature_standardization", "pooled_path")


@dataclass
class _Parts:
    """What :meth:`Supervised.build` makes for the later hooks."""

    config: dict  # the planned config
    task: TaskInfo
    device: torch.device
    objective: Objective  # scores validation and test with the plain loss
    train_objective: Objective  # the training loss (label smoothing, positive weights)
    per_bag: bool  # run each bag of a batch alone (:func:`medattn.train.survival_bags.forward_each`)
    model: nn.Module
    train_loader: torch.utils.data.DataLoader
    val_loader: torch.utils.data.DataLoader
    meta: dict  # every checkpoint's metadata (:func:`checkpoint_meta`)
    record: dict  # results.json's part from the setup: warnings, init_from, defaults, standardisation, plan


class Supervised:
    """The training task ``supervised`` (see the module docstring)."""

    higher_is_better = True

    def __init__(self, bundle: DataBundle, log: Callable[[str], None]) -> None:
        self.bundle, self.log = bundle, log
        self.parts: _Parts | None = None  # made by build

    @property
    def fields(self) -> tuple[str, ...]:
        return metric_fields(self.parts.objective)

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

    def plan(self, config: dict, chosen: dict) -> Planned:
        """The plan (:mod:`medattn.plan`) fills the keys the config leaves null from the data's fingerprint; it is
        deterministic, so a resumed run plans the same."""
        found = fingerprint(self.bundle)  # reads training samples
        decisions = plan(config, found)
        return Planned(apply_plan(config, decisions), {**chosen, **{d.key: d.value for d in decisions if d.applied}},
                       {"fingerprint": found, "decisions": as_records(decisions)})

    def saved_meta(self, folder: Path) -> dict:
        return checkpoint.load_meta(folder)

    def build(self, planned: Planned, device: torch.device, resumed: dict | None,
              init_from: str | Path | None) -> Built:
        """The objectives, the model (initialised, feature statistics, the pooled-feature path), the EMA, DDP and
        compile, the loaders. A resumed run does nothing of :data:`BEFORE_TRAINING` again: its checkpoint's weights
        hold it, and its metadata's ``before_training`` what results.json says about it."""
        config, bundle, log = planned.config, self.bundle, self.log
        train_cfg, task = config["train"], bundle.task
        objective = objective_for(task, train_cfg["loss"])  # scores validation and test with the plain loss
        if train_cfg["batch_size"] < getattr(objective, "min_batch_size", 1):
            raise UserError(f"a {task.task_type} task compares the samples of a batch (Cox partial likelihood): "
                            f"train.batch_size must be at least {objective.min_batch_size}, got "
                            f"{train_cfg['batch_size']} (or train.loss=discrete_time, which trains at batch 1)")
        labels = recipe_labels(train_cfg, task, bundle.train)
        train_objective = objective_for(task, train_cfg["loss"], train_cfg["label_smoothing"],  # the training loss
                                        positive_weight(labels, task.task_type, train_cfg["pos_weight"]))
        per_bag, events = survival_training((objective, train_objective), task, bundle.train, train_cfg)
        patch = sliding.patch_shape(config, task)
        # a model trained on patches is built for the patch (a ViT's position embeddings match it)
        model_task = replace(task, input_shape=(task.input_shape[0], *patch)) if patch else task
        model = build_model(config["model"], model_task).to(device)
        warnings = [*bundle.warnings, *size_warnings(config["model"], model_task)]  # the data does not fit
        for warning in warnings:
            log(f"WARNING: {warning}")
        if resumed is None:
            before = {"init_from": None if init_from is None else initialise(model, init_from, log),
                      "feature_standardization": fit_feature_norm(model, bundle.train),  # this data's statistics
                      "pooled_path": fit_pooled_path(model, bundle.train, train_objective, task.task_type)}
            _log_pooled_path(before["pooled_path"], log)
        else:  # the weights hold it; a checkpoint of an older medattn has no record of it
            before = resumed.get("before_training") or {}
        defaults = {**planned.defaults, **bundle.defaults, **model_defaults(config["model"])}
        _log_choices(defaults, planned.record["decisions"], log)
        ema = EMA(model, train_cfg["ema"]) if train_cfg["ema"] else None  # after init: from those weights
        ddp_model = DistributedDataParallel(model) if distributed.world_size() > 1 else model
        ddp_model = training_module(model, ddp_model, train_cfg)  # checkpointing, torch.compile
        train_set = RandomPatches(bundle.train, patch, train_cfg["patch_foreground"]) if patch else bundle.train
        seed, workers = config["seed"], train_cfg["num_workers"]
        train_loader = make_loader(train_set, train_cfg["batch_size"], True, seed, workers,
                                   balance=labels if train_cfg["class_balance"] else None, events=events)
        val_loader = make_loader(bundle.val, train_cfg["eval_batch_size"] or train_cfg["batch_size"], False, seed,
                                 workers)
        record = {"warnings": warnings, "defaults": defaults, "plan": planned.record,
                  **{key: before.get(key) for key in BEFORE_TRAINING}}
        meta = {**checkpoint_meta(config, bundle), "before_training": {key: record[key] for key in BEFORE_TRAINING}}
        self.parts = _Parts(config, task, device, objective, train_objective, per_bag, model, train_loader,
                            val_loader, meta, record)
        return Built(model, model, ddp_model, len(train_loader), defaults, ema)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {}  # the loop keeps the EMA's; the order is the seed's and the epoch's

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        pass

    def batches(self, epoch: int) -> Batches:
        """The loader in the order of the seed and the epoch; bags lose ``train.instance_dropout`` of their instances
        (:func:`medattn.train.sampling.drop_instances`)."""
        parts = self.parts
        loader, rate = parts.train_loader, parts.config["train"]["instance_dropout"]
        loader.sampler.set_epoch(epoch)
        loader.generator.manual_seed(parts.config["seed"] * 100_003 + epoch)  # worker seeds depend on the epoch only
        if input_kinds.of(parts.task.input_kind).instances:
            return Batches(len(loader), (drop_instances(batch, rate) for batch in loader))
        return Batches(len(loader), loader)

    def batch_loss(self, model: nn.Module, batch: dict) -> tuple[torch.Tensor, float, dict[str, float]]:
        parts = self.parts
        with autocast(parts.device, parts.config["train"]["precision"]):
            logits = (forward_each if parts.per_bag else forward)(model, batch, parts.task.input_kind)
        return parts.train_objective.loss(logits, batch["label"]), len(batch["id"]), {}

    def validate(self, model: nn.Module, epoch: int, progress: bool) -> Validation:
        """The validation score with the plain loss; the checkpoint records it and the validation thresholds."""
        parts = self.parts
        objective = parts.objective
        val = predict(Predictor.for_run(model, parts.config, parts.task, parts.device), parts.val_loader, objective,
                      f"epoch {epoch} val", progress)
        score, key = objective.val_score(val), f"val_{objective.metric}"
        meta = {**parts.meta, "epoch": epoch, key: score,  # + the validation thresholds (Youden's J)
                **threshold_meta(val.outputs, val.labels, parts.task.task_type, epoch)}
        return Validation(score, val.loss, {"val_loss": val.loss, key: score}, meta,
                          f"val loss {val.loss:.4f}  val {objective.metric_label} {score:.4f}")

    def results(self, run_dir: Path, state: dict, train_seconds: float) -> dict:
        """results.json before the test: the run, its best epoch and validation score, whether it learned (the
        verdict, :mod:`medattn.train.verdict`: a recipe trial, which has no test, is judged too), the data and the
        setup."""
        parts, bundle = self.parts, self.bundle
        config, metric = parts.config, parts.objective.metric
        learning = (learning_verdict(config, bundle, read_metrics(run_dir / "metrics.csv"), f"val_{metric}",
                                     state["best_epoch"]) if distributed.is_main() else None)
        return {
            "run_dir": str(run_dir), "synthetic": parts.task.synthetic, "data": config["data"].get("kind"),
            "model": config["model"]["name"], "attention": config["model"]["attention"],
            "parameters": sum(p.numel() for p in parts.model.parameters()),
            "epochs": config["train"]["epochs"], "best_epoch": state["best_epoch"], "metric": metric,
            f"val_{metric}": state["best_score"],
            "skipped_samples": bundle.skipped, "train_seconds": train_seconds,
            "n_train": len(bundle.train), "n_val": len(bundle.val), "init_from": parts.record["init_from"],
            "warnings": parts.record["warnings"], "defaults": parts.record["defaults"],
            "feature_standardization": parts.record["feature_standardization"],
            "pooled_path": parts.record["pooled_path"], "plan": parts.record["plan"],
            "recipe": config["recipe"]["record"], "learning": learning,
        }

    def test(self, run_dir: Path, results: dict, progress: bool, started: float,
             case_pictures: CasePictures | None) -> dict:
        parts = self.parts
        return test_best(parts.model, parts.config, self.bundle, run_dir, results, parts.device, progress, self.log,
                         started, case_pictures)


def _log_choices(defaults: dict, decisions: list[dict], log: Callable[[str], None]) -> None:
    """The values defaults chose and the plan's decisions, one line each."""
    log("defaults: " + ", ".join(f"{k}={v}" for k, v in defaults.items()) if defaults else "defaults: none used")
    for decision in decisions:
        log(f"plan: {decision['key']}={decision['value']}{'' if decision['applied'] else ' (as configured)'}: "
            f"{decision['reason']}")


def _log_pooled_path(fitted: dict | None, log: Callable[[str], None]) -> None:
    """The line saying how the pooled-feature path (:mod:`medattn.train.pooled_path`) was fitted, if it was."""
    if fitted and fitted["fitted"]:
        log(f"pooled features: the linear path fitted on {fitted['bags']} training bags (C {fitted['C']:g} by 5-fold "
            f"cross-validation; training loss {fitted['constant_loss']:.3f} as a constant, "
            f"{fitted['fitted_loss']:.3f} fitted)")
    elif fitted:
        log(f"WARNING: pooled features: {fitted['reason']}; the path starts at zero")


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
