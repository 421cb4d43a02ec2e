"""Dice loss and per-class Dice for segmentation.

Soft Dice loss over classes c (one-hot target t, softmax probabilities p, sums over batch and voxels):

    loss = 1 - mean_c (2 sum p_c t_c + eps) / (sum p_c + sum t_c + eps)

Per-class Dice on hard labels: ``2 |P_c & T_c| / (|P_c| + |T_c|)``, NaN for a class absent from both.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F


def soft_dice_loss(logits: torch.Tensor, target: torch.Tensor, eps: float = 1e-5,
                   include_background: bool = True) -> torch.Tensor:
    """logits (B, K, H, W, D) float, target (B, H, W, D) int labels in [0, K) -> scalar loss."""
    if logits.dim() != target.dim() + 1 or logits.shape[2:] != target.shape[1:] \
            or logits.shape[0] != target.shape[0]:
        raise ValueError(f"logits {tuple(logits.shape)} and target {tuple(target.shape)} do not match")
    num_classes = logits.shape[1]
    probs = logits.float().softmax(dim=1)
    onehot = F.one_hot(target.long(), num_classes).movedim(-1, 1).to(probs.dtype)  # (B, K, ...)
    dims = [0] + list(range(2, probs.dim()))
    dice = (2 * (probs * onehot).sum(dims) + eps) / (probs.sum(dims) + onehot.sum(dims) + eps)  # (K,)
    return 1 - (dice if include_background else dice[1:]).mean()


def dice_per_class(prediction: torch.Tensor, target: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Hard labels ``prediction`` and ``target`` of the same shape -> Dice (num_classes,) float64."""
    if prediction.shape != target.shape:
        raise ValueError(f"prediction {tuple(prediction.shape)} and target {tuple(target.shape)} differ")
    pred = F.one_hot(prediction.long().flatten(), num_classes).sum(0).double()
    true = F.one_hot(target.long().flatten(), num_classes).sum(0).double()
    both = torch.bincount(target.long().flatten()[prediction.flatten() == target.flatten()],
                          minlength=num_classes).double()
    total = pred + true
    return torch.where(total > 0, 2 * both / total.clamp_min(1), torch.full_like(total, float("nan")))
