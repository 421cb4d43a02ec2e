"""The training batches: loaders in an order fixed by the seed and the epoch, and what the loop draws for rare
findings and bags (the small-data recipe, issue 10).

* :func:`make_loader`: this rank's share of a split, in an order fixed by the seed and the epoch, each sample
  carrying its position so that predictions gathered from several ranks can be put back in order;
  :func:`seed_everything`: torch, numpy and random from the run's ``seed``.
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
import random

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.data.distributed import DistributedSampler

from medattn.data.base import TaskInfo, collate, dataset_labels
from medattn.errors import UserError
from medattn.runtime import distributed
from medattn.vocabulary import task_types

from .survival_bags import EventBalancedSampler


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _seed_worker(worker_id: int) -> None:
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


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


def make_loader(dataset: Dataset, batch_size: int, shuffle: bool, seed: int, num_workers: int = 0,
                balance: torch.Tensor | None = None, events: torch.Tensor | None = None) -> DataLoader:
    """A loader over this rank's share, in an order fixed by ``seed`` (and the epoch, via ``set_epoch``).
    With ``balance`` (the dataset's labels) samples are drawn class-balanced with replacement
    (:class:`ClassBalancedSampler`, ``train.class_balance``); with ``events`` (N,) each batch
    holds the split's share of events (:class:`medattn.train.survival_bags.EventBalancedSampler`)."""
    if len(dataset) == 0:
        raise UserError("a data split is empty")
    indexed = _Indexed(dataset)
    if events is not None:
        sampler = EventBalancedSampler(events, seed)
    elif balance is not None:
        sampler = ClassBalancedSampler(balance, seed, distributed.world_size(), distributed.rank())
    else:
        sampler = DistributedSampler(indexed, num_replicas=distributed.world_size(), rank=distributed.rank(),
                                     shuffle=shuffle, seed=seed)
    return DataLoader(indexed, batch_size=batch_size, sampler=sampler, collate_fn=_collate_indexed,
                      num_workers=num_workers, worker_init_fn=_seed_worker,
                      generator=torch.Generator().manual_seed(seed))


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
