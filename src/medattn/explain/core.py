"""``explain(model, inputs, method)``: relevance per pixel/voxel (images, volumes) or per tile (bags).

Methods (``method="auto"``, the default, picks ``gradrollout`` for transformers whose every attention
module has a rule, SeqNorm, SimA, elu+1 and softmax, and ``gradxinput`` otherwise: :func:`default_method`):

* ``gradrollout``: gradient-weighted rollout of logit ``target`` (Chefer et al.'s attention-gradient rule
  with the positive part taken per head on the relevance row, :mod:`medattn.explain.rollout`), linear
  time and memory for linear attention; >= 0, class-specific. One backward pass.
* ``rollout``: class-token attention rollout (:mod:`medattn.explain.rollout`), exact and linear-time for
  linear attention (SeqNorm, SimA, elu+1), from the explicit weights for softmax. Class-agnostic (no
  target). Each patch token's value is given to every pixel of its patch (nearest, no smoothing), so a
  heatmap shows the tokens as they are.
* ``attention``: the model's own attention weights per tile, for bag models whose head reads the tiles through
  attention weights (``forms_tile_attention``: attention-MIL's gated attention pooling a_k, TransMIL's class-token
  row of its last softmax layer, a bag transformer with ``readout="attention"``); the explainer asks the model
  (``model.tile_attention(features, mask, coords)``, (B, N), zero on padding) and never looks at its class. >= 0,
  class-agnostic (no target), one forward pass. Other models are refused (:func:`check_method`).
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

from ..data import input_kinds
from ..errors import UserError
from .rollout import attention_rollout, check_rollout_model, gradient_rollout, target_index

METHODS = ("gradrollout", "rollout", "gradxinput", "attention")


@dataclass
class Explanation:
    """relevance: (B, *spatial) on the input's grid for images/volumes, (B, N) per tile for bags (float32);
    logits: (B, num_classes); method: the method used; target: the logit explained per sample (None for
    rollout, which is class-agnostic)."""

    relevance: torch.Tensor
    logits: torch.Tensor
    method: str
    target: torch.Tensor | None = None


def gradient_x_input(model: nn.Module, x: torch.Tensor, target: int | None = None, **kwargs):
    """-> (logits, target indices (B,), x * d logit_target / dx) for ``model(x, **kwargs)``; shapes of x."""
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        logits = model(x, **kwargs)
        index = target_index(logits, target)
        (grad,) = torch.autograd.grad(logits.gather(1, index[:, None]).sum(), x)
    return logits.detach(), index, grad * x.detach()


def is_bag_model(model: nn.Module) -> bool:
    """Whether ``model`` takes sets of instances (bags (B, N, F) with ``mask`` and ``coords``): the kinds it runs
    on by its ``input_contract`` (default "image") are made of instances."""
    return any(kind.instances for kind in input_kinds.taken_by(getattr(model, "input_contract", "image")))


def default_method(model: nn.Module) -> str:
    """``gradrollout`` where the model is a transformer with a class token and every attention module has a
    rule (:func:`~medattn.explain.rows.rows_for`), else ``gradxinput`` (binary mechanisms, CNNs)."""
    try:
        check_rollout_model(model)
    except UserError:
        return "gradxinput"
    return "gradrollout"


def forms_tile_attention(model: nn.Module) -> bool:
    """Whether ``model`` says it has attention weights per tile (``forms_tile_attention``) and can give them
    (``tile_attention``)."""
    return bool(getattr(model, "forms_tile_attention", False)) and callable(getattr(model, "tile_attention", None))


def check_method(model: nn.Module, method: str) -> str:
    """The method ``method`` resolves to for ``model`` ("auto": :func:`default_method`); one-line UserError for an
    unknown method or one the model cannot give (rollout without a class token and rules, attention without
    attention weights per tile)."""
    if method == "auto":
        return default_method(model)
    if method not in METHODS:
        raise UserError(f"unknown explanation method {method!r}; choose auto or one of {', '.join(METHODS)}")
    if method in ("rollout", "gradrollout"):
        check_rollout_model(model)
    if method == "attention" and not forms_tile_attention(model):
        raise UserError(f"--method attention draws a bag model's own attention weights per tile (attention-MIL, "
                        f"TransMIL, a bag transformer with readout 'attention'); {type(model).__name__} "
                        f"{'has another readout' if is_bag_model(model) else 'is not a bag model'} (use --method "
                        f"{default_method(model)})")
    return method


def tile_attention(model: nn.Module, features: torch.Tensor, mask: torch.Tensor | None = None,
                   coords: torch.Tensor | None = None) -> Explanation:
    """The ``attention`` method: logits and the model's own attention weights per tile (B, N) float32, 0 on
    padding."""
    with torch.no_grad():
        logits = model(features, mask=mask, coords=coords)
        weights = model.tile_attention(features, mask=mask, coords=coords).float()
    if mask is not None:
        weights = weights * mask
    return Explanation(weights, logits, "attention", None)


def explain(model: nn.Module, inputs: torch.Tensor, method: str = "auto", target: int | None = None,
            mask: torch.Tensor | None = None, coords: torch.Tensor | None = None) -> Explanation:
    """Relevance of each input element for ``model``'s prediction on ``inputs``.

    inputs: images (B, C, H, W), volumes (B, C, H, W, D) or bags (B, N, F) (with ``mask`` (B, N) bool and
    ``coords`` (B, N, 2) as the bag model takes them). ``method``: one of :data:`METHODS` or "auto"
    (:func:`default_method`), checked by :func:`check_method`. -> :class:`Explanation` (``method`` the one used).
    Padded tiles get 0.
    """
    method = check_method(model, method)
    bag = is_bag_model(model)
    if inputs.ndim < 3 or (bag and inputs.ndim != 3):
        raise UserError(f"explain: expected a batch of {'bags (B, N, F)' if bag else 'images (B, C, ...)'}, "
                        f"got shape {tuple(inputs.shape)}")
    kwargs = {"mask": mask, "coords": coords} if bag else {}
    try:
        if method == "attention":
            return tile_attention(model, inputs, **kwargs)
        if method == "gradxinput":
            logits, index, relevance = gradient_x_input(model, inputs, target, **kwargs)
            relevance = relevance.sum(dim=-1 if bag else 1)
            if mask is not None:
                relevance = relevance * mask
            return Explanation(relevance.float(), logits, method, index)
        if method == "gradrollout":
            logits, index, r = gradient_rollout(model, inputs, target=target, **kwargs)
        else:
            logits, r = attention_rollout(model, inputs, **kwargs)
            index = None
    except ValueError as error:  # the model's own input checks
        if isinstance(error, UserError):
            raise
        raise UserError(f"explain: {error}") from None
    tokens = r[:, 1:].float()  # (B, N) without the class token
    if bag:
        return Explanation(tokens if mask is None else tokens * mask, logits, method, index)
    spatial = tuple(inputs.shape[2:])
    grid = tuple(s // p for s, p in zip(spatial, model.patch_size))
    heat = tokens.reshape(inputs.shape[0], 1, *grid)
    heat = F.interpolate(heat, size=tuple(g * p for g, p in zip(grid, model.patch_size)), mode="nearest")
    return Explanation(heat[:, 0], logits, method, index)
