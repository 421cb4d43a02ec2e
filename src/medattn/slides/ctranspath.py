"""CTransPath (Wang et al., Medical Image Analysis 2022): a Swin-T whose patch embedding is a convolutional stem, in
medattn's own module, loading the published checkpoint's layout (timm 0.5.4's ``SwinTransformer``), no timm needed.

Architecture (Swin-T, Liu et al. 2021): a stem of two 3x3 stride-2 convolutions (3 -> 12 -> 24 channels, no
bias, each followed by BatchNorm and ReLU) and a 1x1 convolution to 96 channels, then LayerNorm: a 224 px tile
becomes 56 x 56 tokens. Four stages of (2, 2, 6, 2) blocks with (3, 6, 12, 24) heads of 32 at widths 96, 192, 384
and 768; each block is windowed self-attention over 7 x 7 windows with a learned relative position bias
``B[(dy + 6) 13 + (dx + 6)]`` per head, every second block on windows shifted by 3 tokens (cyclically, with a
mask of -100 between tokens that were not neighbours), then an MLP of 4x width; pre-norm, residual. A patch
merging (2 x 2 neighbours concatenated in the order (0,0), (1,0), (0,1), (1,1) (row, column), LayerNorm over 4C,
linear 4C -> 2C without bias) ends stages 1-3, as in the original Swin (timm 1.x moved it to the start of the next
stage). The embedding is the final LayerNorm's tokens averaged: (B, 768).

Checkpoint layout (``ctranspath.pth``: ``{"model": state_dict}``): ``patch_embed.proj.{0,3,6}`` (convolutions),
``patch_embed.proj.{1,4}`` (BatchNorm), ``patch_embed.norm``, ``layers.{i}.blocks.{j}.{norm1, attn.qkv,
attn.proj, attn.relative_position_bias_table, norm2, mlp.fc1, mlp.fc2}``, ``layers.{i}.downsample.{norm,
reduction}`` for i < 3, ``norm``. The buffers old timm saved (``relative_position_index``, ``attn_mask``) are
computed here and checked against the file's when present; a classifier ``head`` is dropped.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UserError

DEPTHS, HEADS, WIDTH, WINDOW = (2, 2, 6, 2), (3, 6, 12, 24), 96, 7
#: Keys of the file computed here (checked when present) or dropped.
BUFFERS = ("relative_position_index", "attn_mask")


class ConvStem(nn.Module):
    """(B, 3, H, W) -> (B, H / 4, W / 4, 96): two 3x3 stride-2 conv-BN-ReLU (12, 24 channels), a 1x1 conv, LayerNorm."""

    def __init__(self, dim: int = WIDTH) -> None:
        super().__init__()
        self.proj = nn.Sequential(
            nn.Conv2d(3, dim // 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(dim // 8), nn.ReLU(inplace=True),
            nn.Conv2d(dim // 8, dim // 4, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(dim // 4),
            nn.ReLU(inplace=True), nn.Conv2d(dim // 4, dim, 1))
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x).permute(0, 2, 3, 1))


def relative_position_index(window: int) -> torch.Tensor:
    """(w^2, w^2) index into the (2w - 1)^2 bias table: ``(dy + w - 1)(2w - 1) + (dx + w - 1)`` for the offset of
    token j from token i in a window (row-major)."""
    y, x = torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")
    coords = torch.stack([y.flatten(), x.flatten()])  # (2, w^2)
    offset = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + window - 1  # (w^2, w^2, 2)
    return offset[..., 0] * (2 * window - 1) + offset[..., 1]


def windows(x: torch.Tensor, window: int) -> torch.Tensor:
    """(B, H, W, C) -> (B H W / w^2, w^2, C), windows in row-major order."""
    B, H, W, C = x.shape
    x = x.view(B, H // window, window, W // window, window, C).transpose(2, 3)
    return x.reshape(-1, window * window, C)


def unwindow(x: torch.Tensor, window: int, B: int, H: int, W: int) -> torch.Tensor:
    """Inverse of :func:`windows`: (B H W / w^2, w^2, C) -> (B, H, W, C)."""
    x = x.view(B, H // window, W // window, window, window, -1).transpose(2, 3)
    return x.reshape(B, H, W, -1)


def shift_mask(H: int, W: int, window: int, shift: int) -> torch.Tensor:
    """(windows, w^2, w^2) additive mask of a shifted-window block: -100 between tokens from different regions
    of the cyclically shifted image (not neighbours before the shift), 0 elsewhere."""
    regions = torch.zeros(1, H, W, 1)
    label = 0
    for rows in (slice(0, -window), slice(-window, -shift), slice(-shift, None)):
        for cols in (slice(0, -window), slice(-window, -shift), slice(-shift, None)):
            regions[:, rows, cols] = label
            label += 1
    labels = windows(regions, window).squeeze(-1)  # (windows, w^2)
    different = labels[:, None, :] != labels[:, :, None]
    return torch.zeros(different.shape).masked_fill(different, -100.0)


class WindowAttention(nn.Module):
    """Multi-head self-attention within windows, with the learned relative position bias: (B', w^2, C) -> same."""

    def __init__(self, dim: int, heads: int, window: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window - 1) ** 2, heads))
        self.register_buffer("relative_position_index", relative_position_index(window), persistent=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        Bw, N, C = x.shape
        q, k, v = self.qkv(x).view(Bw, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        bias = self.relative_position_bias_table[self.relative_position_index].permute(2, 0, 1)  # (heads, N, N)
        if mask is not None:  # (windows, N, N): the same for every image of the batch
            bias = (bias[None] + mask[:, None]).repeat(Bw // mask.shape[0], 1, 1, 1)  # (B', heads, N, N)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.proj(out.transpose(1, 2).reshape(Bw, N, C))


class SwinBlock(nn.Module):
    """(B, H, W, C) -> same: x + attention over (shifted) windows, then x + MLP; pre-norm."""

    def __init__(self, dim: int, heads: int, resolution: int, shifted: bool) -> None:
        super().__init__()
        self.window = min(WINDOW, resolution)
        self.shift = WINDOW // 2 if shifted and resolution > WINDOW else 0
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, heads, self.window)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential()
        self.mlp.add_module("fc1", nn.Linear(dim, 4 * dim))
        self.mlp.add_module("act", nn.GELU())
        self.mlp.add_module("fc2", nn.Linear(4 * dim, dim))
        mask = shift_mask(resolution, resolution, self.window, self.shift) if self.shift else None
        self.register_buffer("attn_mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape
        y = self.norm1(x)
        if self.shift:
            y = torch.roll(y, (-self.shift, -self.shift), dims=(1, 2))
        y = unwindow(self.attn(windows(y, self.window), self.attn_mask), self.window, B, H, W)
        if self.shift:
            y = torch.roll(y, (self.shift, self.shift), dims=(1, 2))
        x = x + y
        return x + self.mlp(self.norm2(x))


class PatchMerging(nn.Module):
    """(B, H, W, C) -> (B, H / 2, W / 2, 2C): each 2 x 2 neighbourhood concatenated, normalised, projected."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape
        x = x.view(B, H // 2, 2, W // 2, 2, C).permute(0, 1, 3, 4, 2, 5).reshape(B, H // 2, W // 2, 4 * C)
        return self.reduction(self.norm(x))


class Stage(nn.Module):
    def __init__(self, dim: int, depth: int, heads: int, resolution: int, merge: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(SwinBlock(dim, heads, resolution, shifted=j % 2 == 1) for j in range(depth))
        self.downsample = PatchMerging(dim) if merge else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x if self.downsample is None else self.downsample(x)


class CTransPath(nn.Module):
    """(B, 3, 224, 224) ImageNet-normalised tiles -> (B, 768) embeddings (module docstring)."""

    input_px = 224

    def __init__(self) -> None:
        super().__init__()
        self.patch_embed = ConvStem()
        resolution = self.input_px // 4
        self.layers = nn.ModuleList()
        for i, (depth, heads) in enumerate(zip(DEPTHS, HEADS)):
            self.layers.append(Stage(WIDTH * 2**i, depth, heads, resolution // 2**i, merge=i < len(DEPTHS) - 1))
        self.norm = nn.LayerNorm(WIDTH * 2 ** (len(DEPTHS) - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-2:] != (self.input_px, self.input_px):
            raise ValueError(f"CTransPath takes {self.input_px} px tiles, got {tuple(x.shape[-2:])}")
        x = self.patch_embed(x)
        for stage in self.layers:
            x = stage(x)
        return self.norm(x).mean(dim=(1, 2))


def load_ctranspath(path: Path) -> CTransPath:
    """CTransPath from the published checkpoint (or any file with its state dict), strictly; UserError naming
    ``path`` for another layout or buffers that disagree with the architecture."""
    from ..models.weights import load_strictly, read_state_dict

    state = {k.removeprefix("module."): v for k, v in read_state_dict(path).items()}
    model = CTransPath()
    buffers = dict(model.named_buffers())  # the computed index and masks (not saved by this module) among them
    for key in [k for k in state if k.endswith(BUFFERS)]:
        saved, expected = state.pop(key), buffers.get(key)
        if expected is None or saved.shape != expected.shape or not torch.equal(saved.to(expected.dtype), expected):
            raise UserError(f"{path}: {key} is not the Swin-T buffer of CTransPath's architecture")
    load_strictly(model, state, path, "not CTransPath's layout", drop=("head.",))
    return model.eval()


def build(card=None) -> CTransPath:
    """CTransPath with fresh weights, in eval mode (the ``ctranspath`` card, :mod:`medattn.slides.encoders`)."""
    return CTransPath().eval()


def load(card, path: Path) -> CTransPath:
    """CTransPath from ``path`` (:func:`load_ctranspath`)."""
    return load_ctranspath(path)
