"""Whole-slide images as bags of pre-extracted patch features (HDF5 per slide, CLAM or STAMP layout)."""

from __future__ import annotations

import torch


def subsample(features: torch.Tensor, coords: torch.Tensor, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep a random ``limit`` instances of a bag (all if it is shorter), in their original order.

    Uses torch's global RNG (seeded by the engine per epoch and worker)."""
    if features.shape[0] <= limit:
        return features, coords
    keep = torch.randperm(features.shape[0])[:limit].sort().values
    return features[keep], coords[keep]
