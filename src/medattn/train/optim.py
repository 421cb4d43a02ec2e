"""The optimizer and the learning-rate schedule of a training run."""

from __future__ import annotations

import math

import torch
from torch import nn


def make_optimizer(model: nn.Module, train_cfg: dict) -> torch.optim.Optimizer:
    """AdamW with weight decay on matrices only: biases, norms, ``pos_embed`` and ``cls_token`` get none."""
    def decays(name: str, p: torch.Tensor) -> bool:
        return p.ndim > 1 and "pos_embed" not in name and "cls_token" not in name

    decay = [p for n, p in model.named_parameters() if decays(n, p)]
    no_decay = [p for n, p in model.named_parameters() if not decays(n, p)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": train_cfg["weight_decay"]},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=train_cfg["lr"], betas=tuple(train_cfg["betas"]))


def lr_at(step: int, total_steps: int, warmup_steps: int, lr: float, min_lr: float) -> float:
    """Linear warm-up over ``warmup_steps`` then cosine decay from ``lr`` to ``min_lr`` at ``total_steps``."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
