"""Shared machinery of the synthetic benchmark: a Dataset whose item i is drawn from its own seeded generator.

Every item depends only on (generator name, seed, split, index), so any worker, process or access
order yields the same sample, and nothing is stored: items are rendered on the fly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import torch
from torch.utils.data import Dataset


def item_seed(name: str, seed: int, split: str, index: int) -> int:
    """A 63-bit seed that differs for every (generator, seed, split, index)."""
    digest = hashlib.blake2b(f"{name}:{seed}:{split}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def item_generator(name: str, seed: int, split: str, index: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded by :func:`item_seed`."""
    return torch.Generator().manual_seed(item_seed(name, seed, split, index))


class SyntheticDataset(Dataset):
    """``length`` synthetic samples.

    ``make(index) -> sample dict`` must be deterministic in ``index``; with ``cache`` (default) its
    result is kept, so later epochs skip the rendering (a few ms per item on one thread, far more
    when torch's intra-op threads compete for a busy CPU). ``finish(sample) -> sample`` runs on every
    access, after the cache: training augmentation (drawing from torch's global RNG, which the training
    loop, :mod:`medattn.train.loop`, seeds per epoch and worker) and normalisation. Each DataLoader worker
    process fills its own cache.
    """

    def __init__(self, length: int, make: Callable[[int], dict], finish: Callable[[dict], dict] | None = None,
                 cache: bool = True) -> None:
        self.length = length
        self.make = make
        self.finish = finish
        self.cache: dict[int, dict] | None = {} if cache else None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for {self.length} synthetic samples")
        if self.cache is None:
            sample = self.make(index)
        else:
            if index not in self.cache:
                self.cache[index] = self.make(index)
            sample = dict(self.cache[index])  # finish() may replace entries, never the cached tensors
        return sample if self.finish is None else self.finish(sample)
