"""Vision transformer for 2D images and 3D volumes (Dosovitskiy et al. 2021), any attention.

Layout follows MONAI: 2D input (B, C, H, W), 3D input (B, C, H, W, D); ``patch_size`` is given in
the same axis order, e.g. (16, 16, 4) on H x W x D for the paper's ViT_3D.

``x -> stem (B, N, D') -> [cls] + tokens + pos_embed -> blocks -> norm -> pool (cls, or the patch tokens' mean)
-> head``

The learned positional embedding is stored for the training grid; at another input size it is
interpolated (bicubic in 2D, trilinear in 3D; the class token's position is kept), so a model
trained at 224 runs at 448.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .layers import ConvStem, Encoder
from .resnet import ResidualStem

GLOBAL_POOLS = ("token", "avg")


def _as_tuple(value, spatial_dims: int, name: str) -> tuple[int, ...]:
    values = (value,) * spatial_dims if isinstance(value, int) else tuple(value)
    if len(values) != spatial_dims or any(v <= 0 for v in values):
        raise ValueError(f"{name} must be a positive int or {spatial_dims} positive ints, got {value!r}")
    return values


def resample_position_embedding(pos_embed: torch.Tensor, grid: tuple[int, ...],
                                new_grid: tuple[int, ...]) -> torch.Tensor:
    """(1, 1 + prod(grid), D') -> (1, 1 + prod(new_grid), D'): the patch positions interpolated (bicubic in
    2D, trilinear in 3D, ``align_corners=False``), the class token's position kept."""
    cls_pos, patch_pos = pos_embed[:, :1], pos_embed[:, 1:]
    patch_pos = patch_pos.reshape(1, *grid, pos_embed.shape[-1]).movedim(-1, 1)  # (1, D', *grid)
    mode = "bicubic" if len(grid) == 2 else "trilinear"
    patch_pos = F.interpolate(patch_pos, size=tuple(new_grid), mode=mode, align_corners=False)
    patch_pos = patch_pos.flatten(2).transpose(1, 2)  # (1, prod(new_grid), D')
    return torch.cat([cls_pos, patch_pos], dim=1)


class VisionTransformer(nn.Module):
    """ViT classifier with a class token and a pluggable attention.

    Args:
        img_size: training input size (int or per-axis tuple); sets the positional-embedding grid.
        patch_size: patch size (int or per-axis tuple).
        in_chans: input channels C.
        num_classes: logits returned (1 for a binary task).
        embed_dim: token dimension D'.
        depth: number of blocks.
        num_heads: attention heads J.
        attn_dim: attention dimension D (the mechanism's ``inner_dim``); defaults to ``embed_dim``.
        mlp_dim: hidden width of the MLP.
        attention: registry name of the mechanism; ``attention_kwargs`` go to its constructor.
        spatial_dims: 2 or 3.
        qkv_bias, drop_rate, attn_drop_rate: as in timm.
        stem: ``"patch"`` (one strided convolution, the ViT's patchify), ``"conv"`` (early convolutions,
            :class:`~medattn.models.layers.ConvStem`, Xiao et al. 2021: 3x3 stride-2 convolutions down to
            the same token grid; helps ViTs trained on little data; power-of-two patch sizes) or ``"residual"``
            (a hybrid ViT: the small ResNet's trunk down to the token grid,
            :class:`~medattn.models.resnet.ResidualStem`).
        activation_checkpointing: recompute each block's activations in the backward pass instead of
            storing them (less memory, about one more forward of compute; see
            :class:`~medattn.models.layers.Encoder`); ``train.activation_checkpointing`` sets it.
        global_pool: what the head reads (timm's argument): ``"token"`` the class token, or ``"avg"`` the mean of
            the normalised patch tokens (the class token still takes part in attention). See :meth:`pool`.
        init_values: LayerScale on every residual branch, starting at this value (timm's argument; None: none).
            See :class:`~medattn.models.layers.Block`.

    ``forward(x)``: (B, C, *spatial) -> (B, num_classes) logits.
    ``forward_features(x)``: -> (B, 1 + N, D') normalised tokens, the class token first.
    """

    def __init__(self, img_size=224, patch_size=16, in_chans: int = 3, num_classes: int = 1, embed_dim: int = 768,
                 depth: int = 12, num_heads: int = 12, attn_dim: int | None = None, mlp_dim: int = 3072,
                 attention: str = "softmax", attention_kwargs: dict | None = None, spatial_dims: int = 2,
                 qkv_bias: bool = True, drop_rate: float = 0.0, attn_drop_rate: float = 0.0,
                 stem: str = "patch", activation_checkpointing: bool = False, global_pool: str = "token",
                 init_values: float | None = None) -> None:
        super().__init__()
        if stem not in ("patch", "conv", "residual"):
            raise ValueError(f"stem must be 'patch', 'conv' or 'residual', got {stem!r}")
        if global_pool not in GLOBAL_POOLS:
            raise ValueError(f"global_pool must be one of {', '.join(GLOBAL_POOLS)}, got {global_pool!r}")
        self.global_pool = global_pool
        if spatial_dims not in (2, 3):
            raise ValueError(f"spatial_dims must be 2 or 3, got {spatial_dims}")
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        self.spatial_dims = spatial_dims
        self.img_size = _as_tuple(img_size, spatial_dims, "img_size")
        self.patch_size = _as_tuple(patch_size, spatial_dims, "patch_size")
        self.grid_size = self._grid(self.img_size)
        self.in_chans = in_chans
        self.num_classes = num_classes
        self.embed_dim = embed_dim
        conv = nn.Conv2d if spatial_dims == 2 else nn.Conv3d
        if stem == "conv":
            self.patch_embed = ConvStem(in_chans, embed_dim, self.patch_size)
        elif stem == "residual":
            self.patch_embed = ResidualStem(in_chans, embed_dim, self.patch_size)
        else:
            self.patch_embed = conv(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + math.prod(self.grid_size), embed_dim))
        self.pos_drop = nn.Dropout(drop_rate) if drop_rate > 0 else nn.Identity()
        self.encoder = Encoder(embed_dim, depth, num_heads, attn_dim or embed_dim, mlp_dim, attention,
                               attention_kwargs, qkv_bias, drop_rate, attn_drop_rate, activation_checkpointing,
                               init_values)
        self.head = nn.Linear(embed_dim, num_classes)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)

    def _grid(self, size: tuple[int, ...]) -> tuple[int, ...]:
        if any(s % p for s, p in zip(size, self.patch_size)):
            raise ValueError(f"input size {size} is not divisible by the patch size {self.patch_size}")
        return tuple(s // p for s, p in zip(size, self.patch_size))

    def position_embedding(self, grid: tuple[int, ...]) -> torch.Tensor:
        """(1, 1 + prod(grid), D'): the learned embedding, interpolated if ``grid`` is not the training grid."""
        if grid == self.grid_size:
            return self.pos_embed
        return resample_position_embedding(self.pos_embed, self.grid_size, grid)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 2 + self.spatial_dims or x.shape[1] != self.in_chans:
            raise ValueError(
                f"expected input (B, {self.in_chans}, {', '.join('*' * self.spatial_dims)}) with "
                f"{self.spatial_dims} spatial axes, got {tuple(x.shape)}"
            )
        grid = self._grid(tuple(x.shape[2:]))
        tokens = self.patch_embed(x).flatten(2).transpose(1, 2)  # (B, N, D')
        tokens = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), tokens], dim=1)  # (B, 1 + N, D')
        tokens = self.pos_drop(tokens + self.position_embedding(grid))
        return self.encoder(tokens)

    def readout_weights(self, tokens: int) -> torch.Tensor:
        """(tokens,) float64: the weights with which the head's input combines the final tokens (class token first):
        one-hot on the class token (``global_pool="token"``) or 1/N on each patch token (``"avg"``). Attention
        rollout starts from them (:mod:`medattn.explain.rollout`)."""
        weights = torch.zeros(tokens, dtype=torch.float64)
        if self.global_pool == "token":
            weights[0] = 1.0
        else:
            weights[1:] = 1.0 / (tokens - 1)
        return weights

    def pool(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, 1 + N, D') normalised tokens -> (B, D') the vector the head reads: the class token
        (``global_pool="token"``) or the mean of the patch tokens (``"avg"``)."""
        return tokens[:, 0] if self.global_pool == "token" else tokens[:, 1:].mean(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.forward_features(x)))
