"""3D convolutional VQ autoencoder on non-overlapping patches (BinaryFormer §3.2, App. A.2).

A volume (B, 1, H, W, D) with H, W, D multiples of the patch size ``p`` (32 in the paper) is cut into
non-overlapping p^3 patches; each patch is encoded on its own to an ``l x l x l`` grid of latent
vectors (l = 2 in the paper: one latent per 16^3 voxels) of ``embed_dim`` channels, quantised by
:class:`~medattn.diffusion.codebook.SubCodebookEMA` to ``G`` indices per position, and decoded back
to a patch. The latent grids of all patches, put side by side, form the volume's token grid
(B, H l/p, W l/p, D l/p, G): 10 x 14 x 12 = 1,680 positions for the paper's 160 x 224 x 192 OASIS grid.
Patches never see each other, so the VQ-AE cannot learn long-range structure (the transformer must)
and block artefacts at patch borders are expected, as the paper notes.

Encoder: a 3x3x3 convolution to ``channels[0]``, then per level a stride-2 4x4x4 convolution and a
3x3x3 convolution (each followed by BatchNorm and SiLU), ``log2(p / l)`` levels, and a 1x1x1
convolution to ``embed_dim``.
The decoder mirrors it with stride-2 transposed convolutions. The loss (paper: all terms weighted
equally) is :func:`medattn.diffusion.losses.vqae_loss`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from medattn.diffusion.codebook import SubCodebookEMA
from medattn.errors import UserError


def _levels(patch_size: int, latent_size: int) -> int:
    ratio = patch_size // latent_size if latent_size > 0 else 0
    if latent_size < 1 or patch_size % latent_size or ratio < 1 or ratio & (ratio - 1):
        raise ValueError(f"patch_size / latent_size must be a power of two, got {patch_size} / {latent_size}")
    return int(math.log2(ratio))


def _unit(conv: nn.Module) -> tuple[nn.Module, nn.Module, nn.Module]:
    """``conv -> BatchNorm -> SiLU``. Batch statistics, not per-patch ones: GroupNorm normalises each patch (an
    empty patch's noise is scaled like tissue). Without normalisation, and with GroupNorm, the autoencoder
    stayed at a constant (zero) output in most of our short CPU runs on SYNTHETIC volumes (3 of 4 seeds
    with GroupNorm); with BatchNorm the packaged run left that plateau (docs/diffusion.md)."""
    return conv, nn.BatchNorm3d(conv.out_channels), nn.SiLU()


class VQAutoencoder3d(nn.Module):
    """Patch-wise 3D VQ-AE: (P, C, p, p, p) -> reconstruction, indices (P, l, l, l, G), commitment loss.

    Args:
        in_chans: image channels C.
        patch_size: p (voxels per patch side).
        latent_size: l (latent positions per patch side); ``p / l`` must be a power of two.
        channels: convolution widths, one per level (``log2(p / l)`` entries), shallow to deep.
        embed_dim: channels E of a latent vector (384 in the paper).
        num_codebooks, codebook_size, decay, commitment: see :class:`SubCodebookEMA`.
    """

    def __init__(self, in_chans: int = 1, patch_size: int = 32, latent_size: int = 2,
                 channels: list[int] | tuple[int, ...] = (32, 64, 128, 256), embed_dim: int = 384,
                 num_codebooks: int = 8, codebook_size: int = 64, decay: float = 0.99,
                 commitment: float = 0.25) -> None:
        super().__init__()
        levels = _levels(patch_size, latent_size)
        channels = list(channels)
        if len(channels) != levels or any(not isinstance(c, int) or c < 1 for c in channels):
            raise ValueError(f"channels must list {levels} positive widths (one per level from {patch_size} to "
                             f"{latent_size}), got {channels}")
        self.in_chans, self.patch_size, self.latent_size = in_chans, patch_size, latent_size
        self.num_codebooks, self.codebook_size, self.embed_dim = num_codebooks, codebook_size, embed_dim
        enc: list[nn.Module] = [*_unit(nn.Conv3d(in_chans, channels[0], 3, padding=1))]
        widths = [channels[0], *channels]
        for c_in, c_out in zip(widths[:-1], widths[1:]):
            enc += [*_unit(nn.Conv3d(c_in, c_out, 4, stride=2, padding=1)),
                    *_unit(nn.Conv3d(c_out, c_out, 3, padding=1))]
        enc.append(nn.Conv3d(channels[-1], embed_dim, 1))
        self.encoder = nn.Sequential(*enc)
        self.codebook = SubCodebookEMA(embed_dim, num_codebooks, codebook_size, decay, commitment)
        dec: list[nn.Module] = [*_unit(nn.Conv3d(embed_dim, channels[-1], 3, padding=1))]
        for c_in, c_out in zip(widths[::-1][:-1], widths[::-1][1:]):
            dec += [*_unit(nn.ConvTranspose3d(c_in, c_out, 4, stride=2, padding=1)),
                    *_unit(nn.Conv3d(c_out, c_out, 3, padding=1))]
        dec.append(nn.Conv3d(channels[0], in_chans, 3, padding=1))
        self.decoder = nn.Sequential(*dec)

    def encode(self, patches: torch.Tensor) -> torch.Tensor:
        """(P, C, p, p, p) -> latent vectors (P, E, l, l, l)."""
        expected = (self.in_chans, self.patch_size, self.patch_size, self.patch_size)
        if patches.ndim != 5 or tuple(patches.shape[1:]) != expected:
            raise ValueError(f"expected patches (P, {', '.join(map(str, expected))}), got {tuple(patches.shape)}")
        return self.encoder(patches)

    def quantise(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(P, E, l, l, l) -> (quantised, same shape; indices (P, l, l, l, G); commitment loss)."""
        flat = z.movedim(1, -1).reshape(-1, self.embed_dim)
        quantised, indices, loss = self.codebook(flat)
        grid = z.shape[2:]
        return (quantised.reshape(z.shape[0], *grid, self.embed_dim).movedim(-1, 1),
                indices.reshape(z.shape[0], *grid, self.num_codebooks), loss)

    def decode(self, quantised: torch.Tensor) -> torch.Tensor:
        """(P, E, l, l, l) -> patches (P, C, p, p, p)."""
        return self.decoder(quantised)

    def decode_indices(self, indices: torch.Tensor) -> torch.Tensor:
        """indices (P, l, l, l, G) -> patches (P, C, p, p, p)."""
        return self.decode(self.codebook.lookup(indices).movedim(-1, 1))

    def forward(self, patches: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        quantised, indices, loss = self.quantise(self.encode(patches))
        return self.decode(quantised), indices, loss


def patch_grid(shape: tuple[int, ...], patch_size: int) -> tuple[int, int, int]:
    """Patches per axis of a (H, W, D) volume; UserError when a side is not a multiple of the patch size."""
    if len(shape) != 3 or any(n <= 0 or n % patch_size for n in shape):
        raise UserError(f"volume size {tuple(shape)} is not a multiple of the patch size {patch_size} along every "
                        f"axis (crop or pad it, e.g. data.target_size)")
    return tuple(n // patch_size for n in shape)


def to_patches(volume: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(B, C, H, W, D) -> (B nh nw nd, C, p, p, p), patches in (h, w, d) raster order per volume."""
    b, c = volume.shape[:2]
    nh, nw, nd = patch_grid(tuple(volume.shape[2:]), patch_size)
    p = patch_size
    blocks = volume.reshape(b, c, nh, p, nw, p, nd, p).permute(0, 2, 4, 6, 1, 3, 5, 7)
    return blocks.reshape(b * nh * nw * nd, c, p, p, p)


def from_patches(patches: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
    """Inverse of :func:`to_patches`: (B nh nw nd, C, p, p, p) -> (B, C, nh p, nw p, nd p)."""
    nh, nw, nd = grid
    c, p = patches.shape[1], patches.shape[-1]
    b = patches.shape[0] // (nh * nw * nd)
    blocks = patches.reshape(b, nh, nw, nd, c, p, p, p).permute(0, 4, 1, 5, 2, 6, 3, 7)
    return blocks.reshape(b, c, nh * p, nw * p, nd * p)


def patch_tokens_to_grid(indices: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
    """Per-patch indices (B nh nw nd, l, l, l, G) -> the volume's token grid (B, nh l, nw l, nd l, G)."""
    nh, nw, nd = grid
    l, g = indices.shape[1], indices.shape[-1]
    b = indices.shape[0] // (nh * nw * nd)
    return indices.reshape(b, nh, nw, nd, l, l, l, g).permute(0, 1, 4, 2, 5, 3, 6, 7).reshape(
        b, nh * l, nw * l, nd * l, g)


def grid_to_patch_tokens(tokens: torch.Tensor, latent_size: int) -> torch.Tensor:
    """Inverse of :func:`patch_tokens_to_grid`: (B, Lh, Lw, Ld, G) -> (B nh nw nd, l, l, l, G)."""
    b, lh, lw, ld, g = tokens.shape
    l = latent_size
    nh, nw, nd = lh // l, lw // l, ld // l
    return tokens.reshape(b, nh, l, nw, l, nd, l, g).permute(0, 1, 3, 5, 2, 4, 6, 7).reshape(
        b * nh * nw * nd, l, l, l, g)


@torch.no_grad()
def encode_volume(model: VQAutoencoder3d, volume: torch.Tensor, batch: int = 64) -> torch.Tensor:
    """Token grid of volumes (B, C, H, W, D) -> (B, H l/p, W l/p, D l/p, G) int64 (model in eval mode)."""
    grid = patch_grid(tuple(volume.shape[2:]), model.patch_size)
    patches = to_patches(volume, model.patch_size)
    indices = torch.cat([model.quantise(model.encode(chunk))[1] for chunk in patches.split(batch)])
    return patch_tokens_to_grid(indices, grid)


@torch.no_grad()
def decode_volume(model: VQAutoencoder3d, tokens: torch.Tensor, batch: int = 64) -> torch.Tensor:
    """Token grid (B, Lh, Lw, Ld, G) -> volumes (B, C, Lh p/l, Lw p/l, Ld p/l)."""
    l = model.latent_size
    grid = tuple(n // l for n in tokens.shape[1:4])
    per_patch = grid_to_patch_tokens(tokens, l)
    patches = torch.cat([model.decode_indices(chunk) for chunk in per_patch.split(batch)])
    return from_patches(patches, grid)
