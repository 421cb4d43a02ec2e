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
    """``length`` synthetic samples; ``make(index) -> sample dict`` must be deterministic in ``index``
    (training augmentation inside ``make`` draws from torch's global RNG, which the engine seeds)."""

    def __init__(self, length: int, make: Callable[[int], dict]) -> None:
        self.length = length
        self.make = make

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for {self.length} synthetic samples")
        return self.make(index)
