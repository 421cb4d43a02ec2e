"""Data loaders of the training loop: this rank's share of a split, in an order fixed by the seed and the epoch,
each sample carrying its position so that predictions gathered from several ranks can be put back in order."""

from __future__ import annotations

import random

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from medattn.data.base import collate
from medattn.errors import UserError
from medattn.runtime import distributed

from .sampling import ClassBalancedSampler
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
    (:class:`medattn.train.sampling.ClassBalancedSampler`, ``train.class_balance``); with ``events`` (N,) each batch
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
