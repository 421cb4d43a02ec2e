"""What the training loop draws for rare findings and bags (the small-data recipe, issue 10).

* :class:`ClassBalancedSampler` (``train.class_balance``): each epoch draws the training set's size of
  samples with replacement, with probability proportional to ``1 / count(class)``, so every class (for
  multi-label tasks: every distinct label vector) carries the same expected share; for a binary task with
  2% positives about half of each batch is positive.
* :func:`positive_weight` (``train.pos_weight: balanced``): ``n_neg / n_pos`` per output, the weight of
  the positive term in the binary cross-entropy (scikit-learn's "balanced" weighting, up to a constant).
* :func:`drop_instances` (``train.instance_dropout``): each training bag keeps a random subset of its
  instances, so a bag model cannot lean on a few and sees fewer tokens per step.
* :func:`recipe_labels`: the training labels the first two need (classification only).

All randomness comes from torch (the sampler's generator is seeded from ``seed`` and the epoch, the
instance draws use the global RNG that the loop seeds and a resumed run restores).
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import Dataset, Sampler

from medattn.data.base import TaskInfo, dataset_labels
from medattn.errors import UserError
from medattn.vocabulary import task_types


def class_keys(labels: torch.Tensor) -> torch.Tensor:
    """(N,) class of each sample: the class index, or the index of its distinct label vector."""
    rows = labels.reshape(len(labels), -1).float()
    return torch.unique(rows, dim=0, return_inverse=True)[1]


class ClassBalancedSampler(Sampler[int]):
    """Indices drawn with replacement, ``P(i) ~ 1 / count(class of i)``; ``ceil(N / world)`` per rank.

    Every rank draws the same ``world * ceil(N / world)`` indices from a generator seeded with
    ``seed * 1_000_003 + epoch`` (:meth:`set_epoch`, as ``DistributedSampler``) and keeps every
    ``world``-th from its rank, so the ranks' shares are disjoint draws of one balanced sample.
    """

    def __init__(self, labels: torch.Tensor, seed: int, num_replicas: int = 1, rank: int = 0) -> None:
        keys = class_keys(labels)
        counts = torch.bincount(keys).double()
        self.weights = 1.0 / counts[keys]
        self.seed, self.num_replicas, self.rank, self.epoch = seed, num_replicas, rank, 0
        self.num_samples = math.ceil(len(keys) / num_replicas)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        drawn = torch.multinomial(self.weights, self.num_samples * self.num_replicas, replacement=True,
                                  generator=generator)
        return iter(drawn[self.rank::self.num_replicas].tolist())


def positive_weight(labels: torch.Tensor, task_type: str, value: float | str | None) -> torch.Tensor | None:
    """``train.pos_weight`` as a (K,) tensor: a number for every output, or ``"balanced"`` = n_neg / n_pos
    per output of the training labels (N, K). Binary and multi-label tasks only (a UserError otherwise, or
    when an output has no positive training sample)."""
    if value is None:
        return None
    if not task_types.of(task_type).thresholds:
        raise UserError(f"train.pos_weight applies to binary and multi-label tasks; this task is {task_type} "
                        f"(use train.class_balance=true)")
    labels = labels.reshape(len(labels), -1).float()
    if value != "balanced":
        return torch.full((labels.shape[1],), float(value))
    positives = labels.sum(0)
    if bool((positives == 0).any()):
        raise UserError("train.pos_weight=balanced: an output has no positive training sample")
    return (len(labels) - positives) / positives


def drop_instances(batch: dict, rate: float) -> dict:
    """A bag batch with each bag's real instances reduced to a random ``round((1 - rate) * n)`` of its ``n``
    (at least one), in their order, re-packed: ``input`` (B, N', F) with N' the largest kept count, ``mask``
    (B, N') True for kept instances, ``coords`` (B, N', 2) alike. ``rate`` 0 returns the batch unchanged."""
    if rate <= 0:
        return batch
    features, mask, coords = batch["input"], batch.get("mask"), batch.get("coords")
    B, N = features.shape[:2]
    valid = mask if mask is not None else torch.ones(B, N, dtype=torch.bool, device=features.device)
    kept = []
    for b in range(B):
        real = valid[b].nonzero().squeeze(1)  # (n,)
        k = max(1, round((1 - rate) * len(real)))
        kept.append(real[torch.randperm(len(real))[:k].sort().values.to(real.device)])
    width = max(len(k) for k in kept)
    new_mask = torch.zeros(B, width, dtype=torch.bool, device=features.device)
    new_features = features.new_zeros(B, width, features.shape[2])
    new_coords = None if coords is None else coords.new_zeros(B, width, coords.shape[2])
    for b, index in enumerate(kept):
        new_features[b, : len(index)] = features[b, index]
        new_mask[b, : len(index)] = True
        if new_coords is not None:
            new_coords[b, : len(index)] = coords[b, index]
    return {**batch, "input": new_features, "mask": new_mask, "coords": new_coords}


def recipe_labels(train_cfg: dict, task: TaskInfo, train_set: Dataset) -> torch.Tensor | None:
    """The training labels when ``train.class_balance`` or ``train.pos_weight`` needs them (classification
    only: a UserError for segmentation), else None."""
    if not train_cfg["class_balance"] and train_cfg["pos_weight"] is None:
        return None
    if not task_types.of(task.task_type).classes:
        raise UserError(f"train.class_balance and train.pos_weight apply to classification tasks; this task is "
                        f"{task.task_type}")
    return dataset_labels(train_set)
