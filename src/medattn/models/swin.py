"""Windowed (Swin) attention classifier: the baseline radiology users pick instead of a plain ViT.

Swin (Liu et al., ICCV 2021; the lecture notes' windowed attention) restricts self-attention to
non-overlapping windows of ``window_size`` tokens per axis, shifts the windows by half a window every
other block so information crosses window borders, and merges 2 x 2 (x 2) neighbouring tokens between
stages (a pyramid, as a CNN has). Cost: O(N * window tokens) instead of O(N^2). The blocks are MONAI's
(the SwinUNETR encoder, Hatamizadeh et al. 2022), 2D or 3D; MONAI is an optional dependency
(``pip install monai``). Two designs (``stem``):

``stem="patch"`` (``swin2d``, ``swin3d``, ``*_tiny``): MONAI's ``SwinTransformer`` as is, with the
classification head of Swin's paper::

    x        (B, C, *S)
    h        = SwinTransformer(x)[-1]            (B, C_L, *S / (patch * 2^4)), layer-normed per token
    z        = mean over the tokens of h         (B, C_L)
    logits   = Linear(LayerNorm(z))              (B, num_classes)

``embed_dim`` C after the patch embedding, doubled by each of the four stages: C_L = C * 2^4. Inputs
whose size is not a multiple of the merging factor are padded by MONAI's patch merging.

``stem="residual"`` (``swin2d_small``, ``swin3d_small``): a hybrid, as the CPU ViT presets are. The small
ResNet's trunk (:class:`~medattn.models.resnet.ResidualStem`) is the pyramid down to the patch grid and
makes C-wide tokens; one stage of Swin blocks (MONAI's ``BasicLayer``: windows, shifted every other
block, no merging) attends over them::

    h        = SwinBlocks(ResidualStem(x))       (B, C, *S / patch)
    logits   = Linear(LayerNorm(mean over the tokens of h))

From scratch on a few hundred cases the patch design did not learn the realistic benchmark's lesions in
2D or 3D (issue 40, docs/realistic.md, "Swin"); ``depths`` and ``num_heads`` then have one entry.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
from torch import nn

from medattn.extras import require

from .layers import LayerScale
from .resnet import ResidualStem

STAGES = 4  # MONAI's SwinTransformer: layers1 ... layers4
STEM_STAGES = {"patch": STAGES, "residual": 1}


def _monai_swin():
    return require("monai.networks.nets.swin_unetr", "the Swin presets (MONAI's Swin blocks)")


def _scale_branches(stage: nn.Module, dim: int, init_values: float) -> None:
    """LayerScale on each block's two residual branches: ``x + g1 * attn(norm1 x)``, then ``+ g2 * mlp(norm2 x)``.
    The window attention's projection is its last channel-mixing step (the window merge, reverse shift and crop
    after it only move tokens), so scaling its output scales the branch."""
    for block in stage.blocks:
        block.attn.proj = nn.Sequential(block.attn.proj, LayerScale(dim, init_values))
        block.mlp = nn.Sequential(block.mlp, LayerScale(dim, init_values))


class SwinClassifier(nn.Module):
    """Swin encoder (MONAI's, after a patch embedding or a ResNet trunk) + mean pooling + LayerNorm + linear head.

    Args:
        spatial_dims: 2 or 3.
        in_chans: input channels C.
        num_classes: logits returned.
        embed_dim: channels of the first stage's tokens (48 in SwinUNETR).
        depths: Swin blocks in each stage (four stages for ``stem="patch"``, one for ``"residual"``).
        num_heads: attention heads per stage.
        window_size: tokens per window along each axis (7 in SwinUNETR).
        patch_size: voxels per token along each axis (2 in SwinUNETR; powers of two for the residual stem).
        mlp_ratio, drop_rate, attn_drop_rate, drop_path_rate: as in MONAI/timm.
        stem: ``"patch"`` (MONAI's SwinTransformer) or ``"residual"`` (ResNet trunk + one stage; module docstring).
        init_values: None, or LayerScale on both residual branches of every block of the residual design, starting
            at this value (as ``vit*_small``: the hybrid starts as its ResNet trunk and the blocks enter as they
            learn): the window attention's output projection and the MLP are each followed by a
            :class:`~medattn.models.layers.LayerScale` (``attn.proj.1.gamma``, ``mlp.1.gamma``).

    ``forward(x)``: (B, C, *spatial) -> (B, num_classes) logits.
    """

    has_attention = True  # windowed softmax attention of its own (no mechanism argument): planned as a transformer

    def __init__(self, spatial_dims: int = 2, in_chans: int = 1, num_classes: int = 1, embed_dim: int = 48,
                 depths: Sequence[int] = (2, 2, 2, 2), num_heads: Sequence[int] = (3, 6, 12, 24), window_size: int = 7,
                 patch_size: int | Sequence[int] = 2, mlp_ratio: float = 4.0, drop_rate: float = 0.0,
                 attn_drop_rate: float = 0.0, drop_path_rate: float = 0.0, stem: str = "patch",
                 init_values: float | None = None) -> None:
        super().__init__()
        if spatial_dims not in (2, 3):
            raise ValueError(f"spatial_dims must be 2 or 3, got {spatial_dims}")
        if stem not in STEM_STAGES:
            raise ValueError(f"stem must be 'patch' or 'residual', got {stem!r}")
        stages = STEM_STAGES[stem]
        if len(depths) != stages or len(num_heads) != stages:
            raise ValueError(f"depths {tuple(depths)} and num_heads {tuple(num_heads)} need one entry for each of "
                             f"the encoder's {stages} stages (stem={stem!r})")
        if init_values is not None and stem != "residual":
            raise ValueError("init_values (LayerScale) is built for stem='residual' only")
        if embed_dim % num_heads[0]:
            raise ValueError(f"embed_dim {embed_dim} is not a multiple of the first stage's {num_heads[0]} heads")
        patch = tuple(patch_size) if isinstance(patch_size, Sequence) else (patch_size,) * spatial_dims
        if min(in_chans, num_classes, embed_dim, window_size, *patch, *depths, *num_heads) < 1:
            raise ValueError("in_chans, num_classes, embed_dim, window_size, patch_size, depths and num_heads must "
                             "be positive")
        self.spatial_dims, self.in_chans, self.num_classes, self.stem = spatial_dims, in_chans, num_classes, stem
        window = (window_size,) * spatial_dims
        # MONAI's constructor reads a tensor value (.item()), which the meta device (shape-only builds) cannot
        # give: there the encoder is built on the CPU; its shapes are the same.
        on_meta = torch.empty(0).device.type == "meta"
        with torch.device("cpu") if on_meta else contextlib.nullcontext():
            if stem == "patch":
                self.encoder = _monai_swin().SwinTransformer(
                    in_chans=in_chans, embed_dim=embed_dim, window_size=window, patch_size=patch,
                    depths=tuple(depths), num_heads=tuple(num_heads), mlp_ratio=mlp_ratio, drop_rate=drop_rate,
                    attn_drop_rate=attn_drop_rate, drop_path_rate=drop_path_rate, spatial_dims=spatial_dims)
            else:
                self.patch_embed = ResidualStem(in_chans, embed_dim, patch)
                self.blocks = _monai_swin().BasicLayer(
                    dim=embed_dim, depth=depths[0], num_heads=num_heads[0], window_size=window,
                    drop_path=torch.linspace(0, drop_path_rate, depths[0]).tolist(), mlp_ratio=mlp_ratio,
                    qkv_bias=True, drop=drop_rate, attn_drop=attn_drop_rate)
                if init_values is not None:
                    _scale_branches(self.blocks, embed_dim, init_values)
        width = embed_dim * 2**STAGES if stem == "patch" else embed_dim
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, *spatial) -> the last stage's tokens (B, C_L, *S_L)."""
        if self.stem == "patch":
            return self.encoder(x)[-1]
        return self.blocks(self.patch_embed(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 2 + self.spatial_dims or x.shape[1] != self.in_chans:
            raise ValueError(f"expected input (B, {self.in_chans}, {', '.join('*' * self.spatial_dims)}), got "
                             f"{tuple(x.shape)}")
        pooled = self.features(x).flatten(2).mean(-1)  # (B, C_L)
        return self.head(self.norm(pooled))
