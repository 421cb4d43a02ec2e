"""Pixel-wise transformer of BinaryFormer's Appendix B (Heinrich, MIDL 2025; setting of Sun et al. 2021).

Every pixel is a token: its C intensity channels and its two coordinates (in [-1, 1]) give C + 2
features, linearly embedded to ``embed_dim``; no patch embedding, no positional embedding beyond the
coordinates. ``depth`` pre-norm blocks (:class:`medattn.models.layers.Encoder`), then the tokens are
max-pooled and a linear head gives the logits. The paper's setting (32 x 32 images, N = 1,024 tokens):
``embed_dim=384, depth=8, num_heads=4, mlp_dim=1536`` and the values narrowed to D_v = 64 in total,
i.e. ``attention_kwargs={"value_dim": 16}`` per head for the binary mechanisms (an interpretation:
the appendix says D_v = 64; §A.1 narrows 64 -> 16 per head).
"""

from __future__ import annotations

import torch
from torch import nn

from .layers import Encoder


def pixel_tokens(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) images -> (B, H*W, C + 2) tokens: intensities then (row, column) in [-1, 1]."""
    B, C, H, W = x.shape
    # linspace(-1, 1, n) written with arange, so exported graphs keep H and W symbolic (linspace fixes them)
    rows = torch.arange(H, dtype=x.dtype, device=x.device) * (2.0 / torch.sym_max(H - 1, 1)) - 1
    cols = torch.arange(W, dtype=x.dtype, device=x.device) * (2.0 / torch.sym_max(W - 1, 1)) - 1
    coords = torch.stack(torch.meshgrid(rows, cols, indexing="ij"))  # (2, H, W)
    tokens = torch.cat([x, coords.expand(B, -1, -1, -1)], dim=1)  # (B, C + 2, H, W)
    return tokens.flatten(2).transpose(1, 2)  # (B, H*W, C + 2)


class PixelTransformer(nn.Module):
    """Classifier with one token per pixel, max pooling and a pluggable attention.

    Args:
        in_chans: intensity channels C (3 for RGB, 1 for grey).
        num_classes: logits returned.
        embed_dim: token dimension D'.
        depth: number of blocks.
        num_heads: attention heads.
        attn_dim: the mechanism's ``inner_dim`` (default ``embed_dim``).
        mlp_dim: hidden width of the MLP (the paper: 4 x embed_dim).
        attention: registry name of the mechanism; ``attention_kwargs`` go to its constructor.
        qkv_bias, drop_rate, attn_drop_rate: as in timm.
        activation_checkpointing: as for :class:`~medattn.models.vit.VisionTransformer`.

    ``forward(x)``: (B, C, H, W) -> (B, num_classes). Any H, W works (N = H * W tokens; cost O(N^2)).
    """

    any_input_size = True  # exported graphs keep H and W dynamic (medattn.deploy.export)

    def __init__(self, in_chans: int = 3, num_classes: int = 10, embed_dim: int = 384, depth: int = 8,
                 num_heads: int = 4, attn_dim: int | None = None, mlp_dim: int = 1536, attention: str = "softmax",
                 attention_kwargs: dict | None = None, qkv_bias: bool = True, drop_rate: float = 0.0,
                 attn_drop_rate: float = 0.0, activation_checkpointing: bool = False) -> None:
        super().__init__()
        if in_chans < 1 or num_classes < 1:
            raise ValueError(f"in_chans and num_classes must be at least 1, got {in_chans}, {num_classes}")
        self.in_chans = in_chans
        self.num_classes = num_classes
        self.embed = nn.Linear(in_chans + 2, embed_dim)
        self.encoder = Encoder(embed_dim, depth, num_heads, attn_dim or embed_dim, mlp_dim, attention,
                               attention_kwargs, qkv_bias, drop_rate, attn_drop_rate, activation_checkpointing)
        self.head = nn.Linear(embed_dim, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, H*W, D') normalised tokens."""
        if x.ndim != 4 or x.shape[1] != self.in_chans:
            raise ValueError(f"expected images of shape (B, {self.in_chans}, H, W), got {tuple(x.shape)}")
        return self.encoder(self.embed(pixel_tokens(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x).amax(dim=1))
