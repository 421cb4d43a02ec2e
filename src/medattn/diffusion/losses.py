"""The VQ-AE's loss: L1 reconstruction + commitment + an optional perceptual or gradient term.

BinaryFormer (App. A.2) weights "posterior (codebook) loss, L1 reconstruction error and perceptual
dissimilarity" equally, the perceptual term being a VGG loss on three orthogonal slices of each
output patch. VGG needs ImageNet weights, which nothing here downloads, so:

* ``perceptual_net``: a network the user provides as a local ``torch.export`` file (``.pt2``, made with
  ``torch.export.save``; export it with a dynamic batch dimension). It receives the three central
  orthogonal slices of every patch as a batch of 2D images (3 P, C, p, p) and returns features; the
  term is ``mean |f(x_hat) - f(x)|``. Only load files you trust (the program runs on your machine).
* ``gradient``: a weight-free stand-in, ``mean |grad x_hat - grad x|`` over the forward differences
  along the three axes: it penalises blurred edges, which L1 alone tolerates, but it is not a
  perceptual (feature-space) distance and numbers trained with it are not comparable to the paper's.

With both weights 0 (the packaged defaults) the loss is L1 + commitment; the trainer says so once.
The EMA codebook needs no codebook loss term: its entries move by the EMA update
(:mod:`medattn.diffusion.codebook`), so the "codebook loss" here is the commitment term.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from medattn.errors import UserError


def central_slices(patches: torch.Tensor) -> torch.Tensor:
    """(P, C, p, p, p) -> the central slice along each axis, stacked: (3 P, C, p, p)."""
    h, w, d = (n // 2 for n in patches.shape[2:])
    return torch.cat([patches[:, :, h], patches[:, :, :, w], patches[:, :, :, :, d]])


def gradient_loss(recon: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``mean_axes mean |diff(recon) - diff(target)|`` with forward differences along H, W and D."""
    return torch.stack([(recon.diff(dim=a) - target.diff(dim=a)).abs().mean() for a in (2, 3, 4)]).mean()


def load_perceptual_net(path: str | Path) -> nn.Module:
    """A local ``torch.export`` program (``.pt2``) as a frozen module; UserError if absent or unreadable."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"diffusion.perceptual_net: {path} is not a file (give a local torch.export .pt2 file, or "
                        f"set diffusion.perceptual_weight=0)")
    try:
        module = torch.export.load(str(path)).module()
    except Exception as error:  # torch.export raises many types for foreign or corrupt files
        raise UserError(f"diffusion.perceptual_net: {path} is not a torch.export program ({error})") from None
    for parameter in module.parameters():
        parameter.requires_grad_(False)
    return module


def vqae_loss(recon: torch.Tensor, target: torch.Tensor, commitment: torch.Tensor,
              perceptual_net: nn.Module | None = None, perceptual_weight: float = 0.0,
              gradient_weight: float = 0.0) -> tuple[torch.Tensor, dict[str, float]]:
    """Total loss and its parts: ``L1 + commitment + w_p perceptual + w_g gradient``; recon/target (P, C, p, p, p)."""
    l1 = (recon - target).abs().mean()
    total = l1 + commitment
    parts = {"l1": float(l1.detach()), "commitment": float(commitment.detach())}
    if perceptual_weight > 0:
        if perceptual_net is None:
            raise UserError("diffusion.perceptual_weight > 0 needs diffusion.perceptual_net (a local .pt2 file)")
        perceptual = (perceptual_net(central_slices(recon)) - perceptual_net(central_slices(target))).abs().mean()
        total = total + perceptual_weight * perceptual
        parts["perceptual"] = float(perceptual.detach())
    if gradient_weight > 0:
        gradient = gradient_loss(recon, target)
        total = total + gradient_weight * gradient
        parts["gradient"] = float(gradient.detach())
    return total, parts
