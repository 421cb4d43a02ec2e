"""Windowed (Swin) attention classifier: the baseline radiology users pick instead of a plain ViT.

Swin (Liu et al., ICCV 2021; the lecture notes' windowed attention) restricts self-attention to
non-overlapping windows of ``window_size`` tokens per axis, shifts the windows by half a window every
other block so information crosses window borders, and merges 2 x 2 (x 2) neighbouring tokens between
stages (a pyramid, as a CNN has). Cost: O(N * window tokens) instead of O(N^2).

The encoder is MONAI's ``SwinTransformer`` (the SwinUNETR encoder, Hatamizadeh et al. 2022) used as is,
2D or 3D; MONAI is an optional dependency (``pip install monai``). This class adds the classification
head of Swin's paper:

    x        (B, C, *S)
    h_s      = SwinTransformer(x)[-1]            (B, C_L, *S / (patch * 2^4)), layer-normed per token
    z        = mean over the tokens of h_s       (B, C_L)
    logits   = Linear(LayerNorm(z))              (B, num_classes)

Widths: ``embed_dim`` C after the patch embedding, doubled by each of the four stages, so
C_L = embed_dim * 2^4. Inputs whose size is not a multiple of the merging factor are padded by
MONAI's patch merging.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
from torch import nn

from medattn.extras import require

STAGES = 4  # MONAI's SwinTransformer: layers1 ... layers4


def _monai_swin():
    return require("monai.networks.nets.swin_unetr", "the Swin presets (MONAI's SwinTransformer)").SwinTransformer


class SwinClassifier(nn.Module):
    """Swin encoder (MONAI) + mean pooling + LayerNorm + linear head.

    Args:
        spatial_dims: 2 or 3.
        in_chans: input channels C.
        num_classes: logits returned.
        embed_dim: channels after the patch embedding (48 in SwinUNETR).
        depths: Swin blocks in each of the 4 stages (MONAI's encoder has four).
        num_heads: attention heads per stage.
        window_size: tokens per window along each axis (7 in SwinUNETR).
        patch_size: voxels per patch along each axis (2 in SwinUNETR).
        mlp_ratio, drop_rate, attn_drop_rate, drop_path_rate: as in MONAI/timm.

    ``forward(x)``: (B, C, *spatial) -> (B, num_classes) logits.
    """

    def __init__(self, spatial_dims: int = 2, in_chans: int = 1, num_classes: int = 1, embed_dim: int = 48,
                 depths: Sequence[int] = (2, 2, 2, 2), num_heads: Sequence[int] = (3, 6, 12, 24), window_size: int = 7,
                 patch_size: int = 2, mlp_ratio: float = 4.0, drop_rate: float = 0.0, attn_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0) -> None:
        super().__init__()
        if spatial_dims not in (2, 3):
            raise ValueError(f"spatial_dims must be 2 or 3, got {spatial_dims}")
        if len(depths) != STAGES or len(num_heads) != STAGES:
            raise ValueError(f"depths {tuple(depths)} and num_heads {tuple(num_heads)} need one entry for each of "
                             f"the encoder's {STAGES} stages")
        if embed_dim % num_heads[0]:
            raise ValueError(f"embed_dim {embed_dim} is not a multiple of the first stage's {num_heads[0]} heads")
        if min(in_chans, num_classes, embed_dim, window_size, patch_size, *depths, *num_heads) < 1:
            raise ValueError("in_chans, num_classes, embed_dim, window_size, patch_size, depths and num_heads must "
                             "be positive")
        self.spatial_dims, self.in_chans, self.num_classes = spatial_dims, in_chans, num_classes
        # MONAI's constructor reads a tensor value (.item()), which the meta device (shape-only builds) cannot
        # give: there the encoder is built on the CPU; its shapes are the same.
        on_meta = torch.empty(0).device.type == "meta"
        with torch.device("cpu") if on_meta else contextlib.nullcontext():
            self.encoder = _monai_swin()(
                in_chans=in_chans, embed_dim=embed_dim, window_size=(window_size,) * spatial_dims,
                patch_size=(patch_size,) * spatial_dims, depths=tuple(depths), num_heads=tuple(num_heads),
                mlp_ratio=mlp_ratio, drop_rate=drop_rate, attn_drop_rate=attn_drop_rate,
                drop_path_rate=drop_path_rate, spatial_dims=spatial_dims)
        width = embed_dim * 2**STAGES
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 2 + self.spatial_dims or x.shape[1] != self.in_chans:
            raise ValueError(f"expected input (B, {self.in_chans}, {', '.join('*' * self.spatial_dims)}), got "
                             f"{tuple(x.shape)}")
        features = self.encoder(x)[-1]  # (B, C_L, *S_L)
        pooled = features.flatten(2).mean(-1)  # (B, C_L)
        return self.head(self.norm(pooled))
