"""What the training loop runs for each config ``task``: the training tasks and the hooks they answer.

A *training task* is what a config's ``task`` names (``supervised``, ``diffusion_vqae``, ``diffusion_transformer``;
the one list is :data:`medattn.catalogue.TRAINING_TASKS`); it is not a *task type* (binary, survival, ...:
:mod:`medattn.vocabulary.task_types`), which a supervised run's data has and whose
:class:`~medattn.train.objectives.Objective` says what is optimised and scored.

:func:`medattn.train.loop.fit` runs every training task the same way: the held run folder, config.yaml, the epochs
(:func:`medattn.train.loop.train_one_epoch`: the optimizer step, gradient accumulation), metrics.csv, the checkpoints
(``last`` after every epoch with the optimizer and RNG states, ``best`` when the validation score improves),
``--resume`` and the hand-over to the test are the loop's. What differs per training task is asked of it:

* ``supervised``: :class:`medattn.train.supervised.Supervised`;
* ``diffusion_vqae`` and ``diffusion_transformer``, the two stages of the 3D VQ diffusion model:
  :class:`medattn.diffusion.vqae_stage.VQAEStage` and :class:`medattn.diffusion.transformer_stage.TransformerStage`.

The registry holds names, not imports: the diffusion stages sit above ``train`` (docs/architecture.md), and
:func:`training_task` imports only the one a run needs. A training task is made with ``(bundle, log)`` and answers
the hooks of :class:`TrainingTask`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from medattn.catalogue import TRAINING_TASKS
from medattn.errors import UserError


def training_task(name: str) -> type[TrainingTask]:
    """The class of config ``task`` ``name`` (:data:`medattn.catalogue.TRAINING_TASKS`)."""
    if name not in TRAINING_TASKS:
        raise UserError(f"task must be one of {', '.join(TRAINING_TASKS)}, got {name!r}")
    module, cls = TRAINING_TASKS[name][0].split(":")
    return getattr(importlib.import_module(module), cls)


@dataclass
class Planned:
    """What a training task's :meth:`TrainingTask.plan` hands to its :meth:`TrainingTask.build` (through the loop,
    not through attributes): the config the run saves, and what chose its values."""

    config: dict  # the planned config: what config.yaml and the checkpoints hold
    defaults: dict = field(default_factory=dict)  # values defaults and the plan chose: config.yaml's comment lines
    record: dict | None = None  # the plan's fingerprint and decisions (results.json), None without a plan


@dataclass
class Built:
    """What a training task's :meth:`TrainingTask.build` gives the loop."""

    model: nn.Module  # what the checkpoints hold and a resumed run loads
    trained: nn.Module  # what the optimizer trains and the gradient clipping sees (the model, or a part of it)
    ddp_model: nn.Module  # what the training pass calls (DDP, compile; or ``trained``)
    batches_per_epoch: int  # training batches of one epoch: the learning-rate schedule's unit
    defaults: dict = field(default_factory=dict)  # values defaults chose: config.yaml's comment lines
    ema: object | None = None  # medattn.train.optim.EMA: scored and kept as best in place of the model


@dataclass
class Batches:
    """One epoch's training batches (dicts; their tensors go to the device in the loop), counted before the first."""

    count: int
    items: Iterable[dict]

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[dict]:
        return iter(self.items)


@dataclass
class Validation:
    """One epoch's validation by a training task."""

    score: float  # selects the best epoch (the direction: ``TrainingTask.higher_is_better``)
    loss: float  # breaks ties of the score: the lower wins
    row: dict  # the metrics.csv columns it fills (``val_loss``, ``val_auroc``; ``val_l1``, ...)
    meta: dict  # the epoch's checkpoint metadata (checkpoint.json of ``last`` and, when best, ``best``)
    line: str  # the epoch's log line after the training loss


class TrainingTask(Protocol):
    """The hooks the loop calls, in this order (``state_tensors`` after every epoch, ``load_state_tensors`` once, on
    resume). ``fields``: the metrics.csv columns (known after :meth:`build`); ``higher_is_better``: the direction of
    :attr:`Validation.score`. The loop branches on nothing else of a training task. What :meth:`build` makes, the
    later hooks use: a training task is one run's, made for it and dropped after it."""

    fields: tuple[str, ...]
    higher_is_better: bool

    def __init__(self, bundle, log: Callable[[str], None]) -> None: ...

    def check(self, config: dict, init_from: str | Path | None, progress: bool) -> None:
        """Everything cheap, before the run folder is held (a UserError names the problem)."""

    def plan(self, config: dict, chosen: dict) -> Planned:
        """-> the config the run saves and what chose it (``chosen``: the training values defaults chose, for the
        record); called inside the held run folder."""

    def saved_meta(self, folder: Path) -> dict:
        """The metadata a checkpoint of this task saved, its ``config`` among them (a resumed run must have it)."""

    def build(self, planned: Planned, device: torch.device, resumed: dict | None,
              init_from: str | Path | None) -> Built:
        """The model and the training batches of the :meth:`plan`'s ``planned`` config (after the seed is set).
        ``resumed``: the metadata of the checkpoint a ``--resume`` continues from (``checkpoints/last``'s, whose
        weights the loop loads after this), None for a fresh run."""

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Tensors of the training task's own state (names ``stage.*``, e.g. a batch order's generator) that
        ``checkpoints/last`` keeps for ``--resume``."""

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """A resumed run's :meth:`state_tensors` back."""

    def batches(self, epoch: int) -> Batches:
        """The training batches of ``epoch``."""

    def batch_loss(self, model: nn.Module, batch: dict) -> tuple[torch.Tensor, float, dict[str, float]]:
        """-> (the loss of one batch (on the device) by ``model`` (:attr:`Built.ddp_model`), its weight in the
        epoch's mean, further parts as floats: metrics.csv's ``train_<part>``)."""

    def validate(self, model: nn.Module, epoch: int, progress: bool) -> Validation:
        """Score the validation split with ``model`` (the EMA's average where there is one)."""

    def results(self, run_dir: Path, state: dict, train_seconds: float) -> dict:
        """results.json before the test."""

    def test(self, run_dir: Path, results: dict, progress: bool, started: float, case_pictures) -> dict:
        """Score ``checkpoints/best`` on the test split, write results.json (and the report), print the summary;
        ``case_pictures`` (:data:`medattn.train.results.CasePictures`, or None) draws report cases where there are
        any. -> the results."""
