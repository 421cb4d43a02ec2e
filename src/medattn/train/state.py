"""A run's training state for the loop: fresh or resumed from ``checkpoints/last``, the best epoch, and the two
checkpoints written after every epoch (:mod:`medattn.runtime.checkpoint`, atomically)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from medattn.config import config_yaml
from medattn.errors import UserError
from medattn.outputs import OutputFolder
from medattn.runtime import checkpoint, distributed

from . import report
from .rundir import config_diff
from .training_tasks import Built, TrainingTask

#: The prefix of a training task's own tensors in a training checkpoint (:meth:`TrainingTask.state_tensors`).
TASK_TENSORS = "stage."


def check_resume(config: dict, run_dir: Path, resumed: dict | None, restart_of: dict | None,
                 log: Callable[[str], None]) -> None:
    """A resumed or restarted run must have the saved config (``resumed``'s: the metadata of ``checkpoints/last``,
    :func:`resumed_meta`; or ``restart_of``)."""
    if resumed is not None or restart_of is not None:
        saved = restart_of or resumed["config"]
        changed = config_diff(saved, config)
        if changed:
            raise UserError(f"--resume: the config differs from the run's saved config in {', '.join(changed)}")
    if restart_of is not None:
        log(f"{run_dir} stopped before its first resumable checkpoint: training it again from epoch 1")


def resumed_meta(training: TrainingTask, run_dir: Path) -> dict:
    """The metadata of ``checkpoints/last``, the checkpoint a ``--resume`` continues from."""
    return training.saved_meta(checkpoint.resolve(run_dir / "checkpoints" / "last"))


def start_state(training: TrainingTask, config: dict, run_dir: Path, resume: bool, built: Built,
                optimizer: torch.optim.Optimizer, log: Callable[[str], None]) -> dict:
    """The training state: a resumed run's from ``checkpoints/last`` (model, optimizer, EMA and the training
    task's own tensors loaded, metrics.csv cut back to it), else a fresh one (and config.yaml written with the defaults
    used)."""
    state = {"epoch": 0, "step": 0, "best_score": None, "best_loss": None, "best_epoch": None, "ema_updates": 0}
    if resume:
        last = checkpoint.resolve(run_dir / "checkpoints" / "last")
        checkpoint.load_model(last, built.model)
        state.update({k: v for k, v in checkpoint.load_training_state(last, optimizer).items() if k in state})
        if built.ema is not None:
            built.ema.load_state_dict(checkpoint.load_extra_tensors(last, "ema."), state["ema_updates"])
        training.load_state_tensors(checkpoint.load_extra_tensors(last, TASK_TENSORS))
        log(f"resuming {run_dir} after epoch {state['epoch']} (step {state['step']})")
        report.truncate_metrics(OutputFolder.within(run_dir), state["epoch"], training.fields)
    elif distributed.is_main():
        OutputFolder.within(run_dir).save_text("config.yaml", config_yaml(config, built.defaults))
    return state


def improves(state: dict, score: float, loss: float, higher_is_better: bool = True) -> bool:
    """Whether an epoch with validation ``score`` and ``loss`` replaces the best so far: a better score (higher, or
    lower where ``higher_is_better`` is False), or the same score with a lower loss. Small validation sets saturate
    (AUROC 1.0 from epoch 1 or 2); without the tie-break the barely trained first epoch at the ceiling stayed "best"."""
    best = state["best_score"]
    if best is None or (score > best if higher_is_better else score < best):
        return True
    return score == best and (state.get("best_loss") is None or loss < state["best_loss"])


def save_checkpoints(run_dir: Path, training: TrainingTask, built: Built, optimizer: torch.optim.Optimizer,
                     state: dict, evaluated: nn.Module, meta: dict, is_best: bool) -> None:
    """``checkpoints/best`` (the scored weights, ``evaluated``) when the epoch is the best so far, then
    ``checkpoints/last`` (the model with the optimizer, the training state, the EMA's and the training task's
    tensors)."""
    if is_best:
        checkpoint.save(run_dir / "checkpoints" / "best", evaluated, meta)
    state["ema_updates"] = 0 if built.ema is None else built.ema.updates
    tensors = {**({} if built.ema is None else built.ema.state_dict()), **training.state_tensors()}
    checkpoint.save(run_dir / "checkpoints" / "last", built.model, meta, optimizer, state,
                    extra_tensors=tensors or None)
