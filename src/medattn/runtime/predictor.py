"""The one inference path: eval, predict, explain and export run a trained model through :class:`Predictor`.

A predictor holds the model, its task's input kind and type, the precision it was trained at (bf16
autocast or fp32) and, for a model trained on patches, the sliding window (:mod:`medattn.runtime.sliding`)
with which whole inputs are predicted. :meth:`Predictor.logits` maps a collated batch (``input``; bags
also ``mask`` and ``coords``, see :func:`medattn.data.base.collate`) to logits (B, K) or per voxel
(B, K, *spatial); :meth:`Predictor.probabilities` applies the task's output activation
(:func:`probabilities`), the function an exported graph holds too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from medattn.data import input_kinds
from medattn.data.base import TaskInfo
from medattn.vocabulary import task_types

from .device import autocast
from .sliding import inference_window, sliding_window_logits


def probabilities(logits: torch.Tensor, task_type: str, target_mean=(), target_std=()) -> torch.Tensor:
    """Logits (B, K) or per voxel (B, K, *spatial) -> the task's float32 outputs: probabilities (a softmax over the K
    classes for multi-class and segmentation, a sigmoid per output for binary and multi-label), the risk score
    for survival (the logit itself: the log relative risk of the Cox model, higher = earlier event), the target
    values for regression (``logit * target_std + target_mean``: the model predicts standardised targets,
    :class:`~medattn.data.base.TaskInfo`): :meth:`~medattn.vocabulary.task_types.TaskType.activate`; an unknown
    ``task_type`` is a UserError."""
    return task_types.of(task_type).activate(logits.float(), target_mean, target_std)


def forward(model: nn.Module, batch: dict, input_kind: str) -> torch.Tensor:
    """Logits (B, K) (segmentation: (B, K, H, W, D)) of a collated batch, as the kind stored as ``input_kind``
    gives it to the model (:meth:`~medattn.data.input_kinds.InputKind.forward`): ``model(x)`` for images/volumes,
    ``model(features, mask=mask, coords=coords)`` for bags."""
    return input_kinds.of(input_kind).forward(model, batch)


@dataclass
class Predictor:
    """A model as it predicts: at its training precision, through its sliding window (see the module docstring).

    ``window``: (window size per spatial axis, overlap), or None for one forward of the whole input.
    The model is put in eval mode; gradients are the caller's choice (``torch.no_grad`` to predict).
    """

    model: nn.Module
    task_type: str
    input_kind: str
    precision: str = "fp32"
    window: tuple[tuple[int, ...], float] | None = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    target_scale: tuple[list[float], list[float]] = ([], [])  # regression: (target_mean, target_std)

    def __post_init__(self) -> None:
        task_types.of(self.task_type)  # an unknown task type is refused here, never run through a sigmoid
        self.model.eval()

    @classmethod
    def for_run(cls, model: nn.Module, config: dict, task: TaskInfo, device: torch.device) -> Predictor:
        """The predictor of a run's model: ``train.precision``, ``eval.sliding_window``/``window_overlap``."""
        return cls(model, task.task_type, task.input_kind, config["train"]["precision"],
                   inference_window(config, task), device, (task.target_mean, task.target_std))

    def to_device(self, batch: dict) -> dict:
        return {k: v.to(self.device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}

    def logits(self, batch: dict) -> torch.Tensor:
        """Collated batch -> logits (B, K) or (B, K, *spatial), in the autocast dtype under bf16."""
        batch = self.to_device(batch)
        with autocast(self.device, self.precision):
            if self.window is None:
                return forward(self.model, batch, self.input_kind)
            return sliding_window_logits(self.model, batch["input"], *self.window, batch_size=len(batch["input"]))

    def probabilities(self, batch: dict) -> torch.Tensor:
        """Collated batch -> float32 probabilities (B, K) or (B, K, *spatial), risk scores or target values
        (:func:`probabilities`)."""
        return probabilities(self.logits(batch), self.task_type, *self.target_scale)
