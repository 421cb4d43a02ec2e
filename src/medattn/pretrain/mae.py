"""Masked autoencoding (He et al., "Masked Autoencoders Are Scalable Vision Learners", CVPR 2022) around a
:class:`~medattn.models.vit.VisionTransformer` of any attention mechanism, 2D or 3D.

For an input x (B, C, *S) with a grid of N patches of P = C * prod(patch) values each::

    keep      = a random (1 - mask_ratio) share of the N patches per sample        (B, n), n = round(N (1 - r))
    x_vis     = x with the masked patches' pixels set to 0                          (B, C, *S)
    t         = patch_embed(x_vis) + pos_embed, the n kept tokens gathered          (B, n, D')
    z         = encoder([cls; t])                                                   (B, 1 + n, D')
    u         = decoder([cls; unshuffle(Linear(z), mask tokens)] + decoder_pos)     (B, 1 + N, D_dec)
    pred      = Linear(u)[:, 1:]                                                    (B, N, P)
    target    = patchify(x), each patch standardised by its own mean and variance (``norm_pix_loss``)
    loss      = sum_{masked k} mean_p (pred_kp - target_kp)^2 / #masked

The encoder sees only the kept tokens (gathered, every sample keeps the same number), so no mechanism needs a
padding mask and the cost of an encoder step falls with the masking ratio. Choices MAE leaves open here
(docs/decisions.md, "Masked-autoencoder pretraining"):

* **Pixels of masked patches are zeroed before the patch embedding.** A strided patchify convolution sees only
  its own patch, so zeroing changes nothing there; the convolutional stem of the ``*_small`` presets
  (:class:`~medattn.models.layers.ConvStem`, 3x3 kernels) would otherwise let a kept token see into its masked
  neighbours and the loss could be met by copying them. With the zeroing no masked pixel reaches the encoder
  (tested).
* The decoder is small (``decoder_depth`` blocks of width ``decoder_dim``, softmax attention over N + 1
  tokens: it runs on the short grids of the CPU presets) with learned positions; it is dropped after
  pretraining. Only the encoder's weights go on to ``train --init-from``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from medattn.models.layers import Encoder
from medattn.models.vit import VisionTransformer


def patchify(x: torch.Tensor, patch_size: tuple[int, ...]) -> torch.Tensor:
    """(B, C, *S) -> (B, N, C * prod(patch)): patches in the order of the ViT's tokens (the grid flattened in
    row-major order, as ``patch_embed(x).flatten(2)``), each patch's values channel first."""
    B, C, *spatial = x.shape
    grid = [s // p for s, p in zip(spatial, patch_size)]
    shape = [B, C]
    for g, p in zip(grid, patch_size):
        shape += [g, p]
    x = x.reshape(shape)  # (B, C, g1, p1, g2, p2[, g3, p3])
    dims = len(patch_size)
    grid_axes = [2 + 2 * i for i in range(dims)]
    patch_axes = [3 + 2 * i for i in range(dims)]
    x = x.permute(0, *grid_axes, 1, *patch_axes)  # (B, g1, g2[, g3], C, p1, p2[, p3])
    return x.reshape(B, math.prod(grid), C * math.prod(patch_size))


def unpatchify_mask(keep: torch.Tensor, grid: tuple[int, ...], patch_size: tuple[int, ...]) -> torch.Tensor:
    """(B, N) bool per patch -> (B, 1, *S) the same per pixel (to zero the pixels of masked patches)."""
    B = keep.shape[0]
    pixels = keep.reshape(B, 1, *grid)
    for axis, p in enumerate(patch_size):
        pixels = pixels.repeat_interleave(p, dim=2 + axis)
    return pixels


def masked_patch_loss(pred: torch.Tensor, target: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """Mean over the masked patches of the per-patch mean squared error: pred, target (B, N, P), masked (B, N)
    bool (True = masked). Kept patches contribute nothing, not even through their gradients."""
    per_patch = (pred - target).square().mean(dim=-1)  # (B, N)
    weights = masked.to(per_patch.dtype)
    return (per_patch * weights).sum() / weights.sum().clamp_min(1.0)


class MaskedAutoencoder(nn.Module):
    """MAE pretraining wrapper (module docstring) around ``encoder``, whose weights it trains in place.

    Args:
        encoder: the ViT to pretrain (any mechanism, 2D or 3D, either stem).
        mask_ratio: share of the patches masked per sample (MAE: 0.75).
        decoder_dim, decoder_depth, decoder_heads: the light decoder's width, blocks and heads.
        norm_pix_loss: standardise each target patch by its own mean and variance (MAE's better setting).

    ``forward(x, generator=None)``: (B, C, *S) -> (loss scalar, pred (B, N, P), masked (B, N) bool).
    """

    def __init__(self, encoder: VisionTransformer, mask_ratio: float = 0.75, decoder_dim: int = 64,
                 decoder_depth: int = 1, decoder_heads: int = 4, norm_pix_loss: bool = True) -> None:
        super().__init__()
        if not isinstance(encoder, VisionTransformer):
            raise TypeError(f"masked autoencoding pretrains a VisionTransformer, got {type(encoder).__name__}")
        if not 0 < mask_ratio < 1:
            raise ValueError(f"mask_ratio must lie in (0, 1), got {mask_ratio}")
        num_patches = math.prod(encoder.grid_size)
        if round(num_patches * (1 - mask_ratio)) < 1 or round(num_patches * (1 - mask_ratio)) >= num_patches:
            raise ValueError(f"mask_ratio {mask_ratio} keeps no patch or every patch of {num_patches}")
        self.encoder = encoder
        self.mask_ratio, self.norm_pix_loss = mask_ratio, norm_pix_loss
        patch_values = encoder.in_chans * math.prod(encoder.patch_size)
        self.decoder_embed = nn.Linear(encoder.embed_dim, decoder_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_dim))
        self.decoder_pos = nn.Parameter(torch.zeros(1, 1 + num_patches, decoder_dim))
        self.decoder = Encoder(decoder_dim, decoder_depth, decoder_heads, decoder_dim, 4 * decoder_dim, "softmax")
        self.decoder_pred = nn.Linear(decoder_dim, patch_values)
        nn.init.trunc_normal_(self.mask_token, std=0.02)
        nn.init.trunc_normal_(self.decoder_pos, std=0.02)

    def random_keep(self, batch: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """(B, n) indices of the kept patches, sorted, a uniform random subset per sample (MAE's argsort of noise)."""
        num_patches = math.prod(self.encoder.grid_size)
        kept = round(num_patches * (1 - self.mask_ratio))
        noise = torch.rand(batch, num_patches, generator=generator)
        return noise.argsort(dim=1)[:, :kept].sort(dim=1).values.to(self.decoder_pos.device)

    def encode(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """(B, C, *S), kept indices (B, n) -> (B, 1 + n, D') the encoder's tokens of the kept patches."""
        vit = self.encoder
        grid = vit.grid_size
        if tuple(x.shape[2:]) != tuple(g * p for g, p in zip(grid, vit.patch_size)):
            raise ValueError(f"pretraining runs at the model's input size {vit.img_size}, got {tuple(x.shape[2:])}")
        B, N = x.shape[0], math.prod(grid)
        kept_patches = torch.zeros(B, N, dtype=torch.bool, device=x.device).scatter_(1, keep, True)
        x = x * unpatchify_mask(kept_patches, grid, vit.patch_size).to(x.dtype)  # masked pixels never enter
        tokens = vit.patch_embed(x).flatten(2).transpose(1, 2) + vit.pos_embed[:, 1:]  # (B, N, D')
        tokens = tokens.gather(1, keep.unsqueeze(-1).expand(-1, -1, tokens.shape[-1]))  # (B, n, D')
        cls = (vit.cls_token + vit.pos_embed[:, :1]).expand(B, -1, -1)
        return vit.encoder(vit.pos_drop(torch.cat([cls, tokens], dim=1)))  # (B, 1 + n, D')

    def decode(self, latent: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """(B, 1 + n, D'), kept indices (B, n) -> pred (B, N, P) for every patch."""
        B, N = latent.shape[0], self.decoder_pos.shape[1] - 1
        y = self.decoder_embed(latent)  # (B, 1 + n, D_dec)
        full = self.mask_token.expand(B, N, -1).clone()  # (B, N, D_dec)
        full = full.scatter(1, keep.unsqueeze(-1).expand(-1, -1, y.shape[-1]), y[:, 1:])
        y = torch.cat([y[:, :1], full], dim=1) + self.decoder_pos  # (B, 1 + N, D_dec)
        return self.decoder_pred(self.decoder(y)[:, 1:])  # (B, N, P)

    def target(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, *S) -> (B, N, P) the patches to reconstruct (standardised per patch with ``norm_pix_loss``)."""
        patches = patchify(x, self.encoder.patch_size)
        if not self.norm_pix_loss:
            return patches
        mean, var = patches.mean(dim=-1, keepdim=True), patches.var(dim=-1, keepdim=True)
        return (patches - mean) / (var + 1e-6).sqrt()

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None):
        keep = self.random_keep(x.shape[0], generator)
        pred = self.decode(self.encode(x, keep), keep)
        masked = torch.ones(pred.shape[:2], dtype=torch.bool, device=x.device).scatter_(1, keep, False)
        return masked_patch_loss(pred, self.target(x), masked), pred, masked

    def chance_loss(self, batch: int) -> float | None:
        """The loss of predicting each standardised patch's mean, 0 (a model that learned nothing):
        mean_p ((x_p - mean) / sqrt(var + eps))^2 = (P - 1) / P with the unbiased variance, eps aside; None
        without ``norm_pix_loss`` (the pixels' own variance, which the data set). ``batch`` plays no part."""
        if not self.norm_pix_loss:
            return None
        patch_values = self.decoder_pred.out_features
        return (patch_values - 1) / patch_values
