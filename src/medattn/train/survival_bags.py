"""Survival losses for bags (issue 51): the Cox loss over a batch of whole bags, and batches that hold events.

* :func:`forward_each`: every bag of a padded batch through the model alone (its real instances only), the risks
  stacked -> (B, 1). The Cox loss of those risks (:func:`~medattn.train.survival_loss.cox_partial_likelihood`) is the
  batch's partial likelihood over bags of different sizes, and one ``backward`` gives its exact gradient. Memory:
  the graphs of all B bags are held until the backward, so activations grow with the sum of the bags' instance
  counts (a padded batch holds B times the largest); compute is the same as B batch-1 steps.
* :class:`EventBalancedSampler` (``train.event_balance``): each batch of ``train.batch_size`` holds events and
  censored cases in the training split's proportions (stratified batches; at least one event when the batch is
  large enough), so no batch has a zero partial likelihood for want of an event.
* :func:`survival_training`: what the training loop sets up from ``train.loss`` and ``train.event_balance``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset, Sampler

from medattn.data import input_kinds
from medattn.data.base import TaskInfo, dataset_labels
from medattn.errors import UserError
from medattn.runtime import distributed
from medattn.runtime.predictor import forward
from medattn.vocabulary import task_types


def forward_each(model: nn.Module, batch: dict, input_kind: str) -> torch.Tensor:
    """Logits (B, K) of a padded bag batch, each bag ``b`` run alone on its real instances ``mask[b]``
    (``input`` (B, N, F), ``mask`` (B, N), ``coords`` (B, N, 2)): no padding reaches the model."""
    mask = batch.get("mask")
    if mask is None:
        return forward(model, batch, input_kind)
    outputs = []
    for b in range(len(mask)):
        real = mask[b].nonzero().squeeze(1)  # (n_b,)
        one = {**batch, "input": batch["input"][b:b + 1, real], "mask": mask[b:b + 1, real]}
        if batch.get("coords") is not None:
            one["coords"] = batch["coords"][b:b + 1, real]
        outputs.append(forward(model, one, input_kind))
    return torch.cat(outputs)


class EventBalancedSampler(Sampler[int]):
    """Indices of one epoch without replacement, ordered so that every run of ``batch_size`` (the loader's
    batches) holds events and censored cases in the split's proportions: with E events in N cases, position p is
    an event when ``floor((p + 1) E / N) > floor(p E / N)``, so a batch holds ``floor(B E / N)`` or one more events
    (at least one when ``B E >= N``). Events and censored cases are shuffled apart each epoch (a generator seeded
    with ``seed * 1_000_003 + epoch``, as ``DistributedSampler``). One process only (several ranks: a UserError).
    """

    def __init__(self, event: torch.Tensor, seed: int) -> None:
        if distributed.world_size() > 1:
            raise UserError("train.event_balance runs in one process; use train.grad_accum instead of several ranks")
        self.event, self.seed, self.epoch = event.bool(), seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.event)

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        events, censored = (torch.nonzero(flag).squeeze(1) for flag in (self.event, ~self.event))
        events = events[torch.randperm(len(events), generator=generator)].tolist()
        censored = censored[torch.randperm(len(censored), generator=generator)].tolist()
        n, e = len(self.event), len(events)
        return iter([events.pop() if (p + 1) * e // n > p * e // n else censored.pop() for p in range(n)])


def survival_training(objectives: tuple, task: TaskInfo, train_set: Dataset,
                      train_cfg: dict) -> tuple[bool, torch.Tensor | None]:
    """The loop's survival setup -> (run each bag alone (:func:`forward_each`), the training events for
    :class:`EventBalancedSampler` or None). ``objectives``: (the scoring objective, the training objective); each fits
    the discrete-time intervals on the training labels (``objective.fit``), so validation is scored with the
    likelihood that trains (per bag, whatever the evaluation batch). ``train.event_balance`` outside a survival task
    is a UserError."""
    if not task_types.of(task.task_type).events:
        if train_cfg.get("event_balance"):
            raise UserError(f"train.event_balance applies to survival tasks; this task is {task.task_type}")
        return False, None
    labels = dataset_labels(train_set)
    for objective in objectives:
        objective.fit(labels, train_cfg.get("time_bins", 4))
    per_bag = objectives[-1].batch_coupled and input_kinds.of(task.input_kind).instances
    return per_bag, labels[:, 1] if train_cfg.get("event_balance") else None
