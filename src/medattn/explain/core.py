"""``explain(model, inputs, method)``: relevance per pixel/voxel (images, volumes) or per tile (bags).

Methods:

* ``rollout``: class-token attention rollout (:mod:`medattn.explain.rollout`), exact and linear-time for
  linear attention (SeqNorm, SimA, elu+1), from the explicit weights for softmax. Class-agnostic (no
  target). Each patch token's value is given to every pixel of its patch (nearest, no smoothing), so a
  heatmap shows the tokens as they are.
* ``gradxinput``: gradient x input, ``sum_c x_c * d logit_t / d x_c`` over the channels (images) or the
  feature dimension (bags), for any model and any mechanism (binary ones through their surrogate
  gradients). The input is the preprocessed one (after normalisation), so the reference "absent" input
  is zero in that space. ``target`` picks the logit (default: the predicted class; 0 for one output).

The model should be in eval mode (dropout off); weights are not changed and no parameter gradient is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UserError
from .rollout import attention_rollout

METHODS = ("rollout", "gradxinput")


@dataclass
class Explanation:
    """relevance: (B, *spatial) on the input's grid for images/volumes, (B, N) per tile for bags (float32);
    logits: (B, num_classes); target: the logit explained per sample (None for rollout)."""

    relevance: torch.Tensor
    logits: torch.Tensor
    method: str
    target: torch.Tensor | None = None


def target_index(logits: torch.Tensor, target: int | None) -> torch.Tensor:
    """(B,) logit indices: ``target`` for every sample, or the predicted class (argmax; 0 for one output)."""
    if target is None:
        return logits.argmax(dim=1)
    if not 0 <= target < logits.shape[1]:
        raise UserError(f"target {target} is not one of the model's {logits.shape[1]} output(s)")
    return torch.full((logits.shape[0],), target, dtype=torch.long, device=logits.device)


def gradient_x_input(model: nn.Module, x: torch.Tensor, target: int | None = None, **kwargs):
    """-> (logits, target indices (B,), x * d logit_target / dx) for ``model(x, **kwargs)``; shapes of x."""
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        logits = model(x, **kwargs)
        index = target_index(logits, target)
        (grad,) = torch.autograd.grad(logits.gather(1, index[:, None]).sum(), x)
    return logits.detach(), index, grad * x.detach()


def is_bag_model(model: nn.Module) -> bool:
    return getattr(model, "input_contract", "image") == "bag"


def explain(model: nn.Module, inputs: torch.Tensor, method: str = "rollout", target: int | None = None,
            mask: torch.Tensor | None = None, coords: torch.Tensor | None = None) -> Explanation:
    """Relevance of each input element for ``model``'s prediction on ``inputs``.

    inputs: images (B, C, H, W), volumes (B, C, H, W, D) or bags (B, N, F) (with ``mask`` (B, N) bool and
    ``coords`` (B, N, 2) as the bag model takes them). -> :class:`Explanation`. Padded tiles get 0.
    """
    if method not in METHODS:
        raise UserError(f"unknown explanation method {method!r}; choose one of {', '.join(METHODS)}")
    bag = is_bag_model(model)
    if inputs.ndim < 3 or (bag and inputs.ndim != 3):
        raise UserError(f"explain: expected a batch of {'bags (B, N, F)' if bag else 'images (B, C, ...)'}, "
                        f"got shape {tuple(inputs.shape)}")
    kwargs = {"mask": mask, "coords": coords} if bag else {}
    try:
        if method == "gradxinput":
            logits, index, relevance = gradient_x_input(model, inputs, target, **kwargs)
            relevance = relevance.sum(dim=-1 if bag else 1)
            if mask is not None:
                relevance = relevance * mask
            return Explanation(relevance.float(), logits, method, index)
        logits, r = attention_rollout(model, inputs, **kwargs)
    except ValueError as error:  # the model's own input checks
        if isinstance(error, UserError):
            raise
        raise UserError(f"explain: {error}") from None
    tokens = r[:, 1:].float()  # (B, N) without the class token
    if bag:
        return Explanation(tokens if mask is None else tokens * mask, logits, method)
    spatial = tuple(inputs.shape[2:])
    grid = tuple(s // p for s, p in zip(spatial, model.patch_size))
    heat = tokens.reshape(inputs.shape[0], 1, *grid)
    heat = F.interpolate(heat, size=tuple(g * p for g, p in zip(grid, model.patch_size)), mode="nearest")
    return Explanation(heat[:, 0], logits, method)
