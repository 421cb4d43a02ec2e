"""Inpainting a volume: encode, mask tokens, fill them (diffusion or random), decode, score.

Masks are on the latent token grid (one token per ``p / l`` voxels per axis, 16^3 in the paper):

* :func:`centre_mask`: the centre box covering ``fraction`` of every latent axis (at least one token),
  BinaryFormer's "centre region unknown";
* :func:`voxel_mask_to_tokens`: a voxel mask (e.g. a NIfTI file, nonzero = unknown) -> the tokens whose
  cell holds any unknown voxel.

Scores (:func:`score_case`, volumes normalised to [0, 1], data range 1): PSNR and SSIM of the output
against the input volume (``psnr``, ``ssim``), PSNR inside the unknown cells (``psnr_masked``), and
PSNR/SSIM against the VQ-AE reconstruction of the whole unmasked volume (``psnr_recon``, ``ssim_recon``:
what the paper calls the ground-truth reconstruction; the VQ-AE's own error is then left out).
"""

from __future__ import annotations

import torch

from medattn.diffusion.metrics import psnr, ssim
from medattn.diffusion.model import DiffusionModel
from medattn.diffusion.sampling import random_fill, sample_tokens
from medattn.diffusion.vqae import decode_volume, encode_volume

METHODS = ("diffusion", "random")


def centre_mask(grid: tuple[int, int, int], fraction: float = 0.5) -> torch.Tensor:
    """Unknown tokens (Lh, Lw, Ld) bool: the centred box of ``max(1, round(fraction L))`` tokens per axis."""
    unknown = torch.zeros(grid, dtype=torch.bool)
    box = []
    for n in grid:
        k = min(n, max(1, round(fraction * n)))
        start = (n - k) // 2
        box.append(slice(start, start + k))
    unknown[tuple(box)] = True
    return unknown


def voxel_mask_to_tokens(mask: torch.Tensor, cell: int) -> torch.Tensor:
    """(H, W, D) voxel mask (nonzero = unknown) -> (H/cell, W/cell, D/cell) token mask (any voxel unknown)."""
    h, w, d = mask.shape
    cells = mask.bool().reshape(h // cell, cell, w // cell, cell, d // cell, cell)
    return cells.any(5).any(3).any(1)


def tokens_to_voxels(unknown: torch.Tensor, cell: int) -> torch.Tensor:
    """(Lh, Lw, Ld) token mask -> (Lh cell, Lw cell, Ld cell) voxel mask."""
    return unknown.repeat_interleave(cell, 0).repeat_interleave(cell, 1).repeat_interleave(cell, 2)


@torch.no_grad()
def inpaint(model: DiffusionModel, volume: torch.Tensor, unknown: torch.Tensor, method: str = "diffusion",
            steps: int = 200, temperature: float = 0.8, seed: int = 0) -> dict[str, torch.Tensor]:
    """Fill the unknown tokens of one volume (1, H, W, D) in [0, 1].

    -> {"output": (H, W, D) decoded filled tokens, "reconstruction": (H, W, D) the unmasked volume through
    the VQ-AE, "tokens": (Lh, Lw, Ld, G) filled tokens, "original_tokens": the unmasked volume's tokens}.
    Known tokens are kept exactly (the decoder still sees their neighbours' new codes only inside each patch).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    vqae = model.vqae
    device = next(vqae.parameters()).device
    tokens = encode_volume(vqae, volume[None].to(device))  # (1, Lh, Lw, Ld, G)
    grid = tokens.shape[1:4]
    if tuple(unknown.shape) != tuple(grid):
        raise ValueError(f"the mask's token grid {tuple(unknown.shape)} does not match the volume's {tuple(grid)}")
    flat = tokens.reshape(1, -1, vqae.num_codebooks)
    known = ~unknown.reshape(1, -1).to(device)
    if method == "random":
        filled = random_fill(flat, known, vqae.codebook_size, seed)
    else:
        if model.transformer is None:
            raise ValueError("method 'diffusion' needs a diffusion_transformer checkpoint (or use method 'random')")
        if tuple(model.transformer.grid) != tuple(grid):
            raise ValueError(f"the transformer was trained on a token grid {model.transformer.grid}, the volume "
                             f"gives {tuple(grid)}")
        filled = sample_tokens(model.transformer, flat, known, steps=steps, temperature=temperature, seed=seed)
    filled = filled.reshape(tokens.shape)
    return {"output": decode_volume(vqae, filled)[0, 0].cpu(),
            "reconstruction": decode_volume(vqae, tokens)[0, 0].cpu(),
            "tokens": filled[0].cpu(), "original_tokens": tokens[0].cpu()}


def score_case(output: torch.Tensor, target: torch.Tensor, reconstruction: torch.Tensor,
               unknown_voxels: torch.Tensor) -> dict[str, float]:
    """The scores of the module docstring for volumes (H, W, D) in [0, 1]."""
    output, reconstruction = output.clamp(0, 1), reconstruction.clamp(0, 1)
    return {"psnr": psnr(output, target), "ssim": ssim(output, target),
            "psnr_masked": psnr(output[unknown_voxels], target[unknown_voxels]),
            "psnr_recon": psnr(output, reconstruction), "ssim_recon": ssim(output, reconstruction)}


def versus_random(diffusion: dict[str, float], random: dict[str, float], identical: bool) -> str | None:
    """A warning when diffusion's inpainting means nothing, else None: its output equals the uniformly random
    codes' (``identical``: the VQ-AE decodes every code alike, so the first stage learned nothing), or its PSNR
    inside the unknown cells (``psnr_masked`` of :func:`score_case`) is no higher than random codes'."""
    if identical:
        return ("diffusion and random codes decode to the same volume: the first stage (VQ-AE) ignores its codes "
                "(train it longer); the inpainting means nothing")
    if diffusion["psnr_masked"] <= random["psnr_masked"]:
        return (f"diffusion is no better than random codes inside the mask (PSNR {diffusion['psnr_masked']:.2f} "
                f"vs {random['psnr_masked']:.2f} dB): the transformer learned nothing usable (train it longer); "
                f"the inpainting means nothing")
    return None
