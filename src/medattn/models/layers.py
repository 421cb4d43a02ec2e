"""Transformer building blocks shared by every model: MLP, pre-norm block, encoder.

Names follow timm (``norm1``, ``attn``, ``norm2``, ``mlp.fc1``, ``mlp.fc2``) so checkpoints
interchange. The attention is built by name through :func:`medattn.attention.build_attention`;
nothing here knows which mechanism runs.
"""

from __future__ import annotations

import torch
from torch import nn

from medattn.attention import build_attention


class Mlp(nn.Module):
    """``fc2(drop(gelu(fc1(x))))``: (B, N, dim) -> (B, N, dim) with a hidden width ``mlp_dim``."""

    def __init__(self, dim: int, mlp_dim: int, drop: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, mlp_dim)
        self.act = nn.GELU()
        self.drop = nn.Dropout(drop) if drop > 0 else nn.Identity()
        self.fc2 = nn.Linear(mlp_dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(self.act(self.fc1(x))))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(norm1(x)); x + mlp(norm2(x))``. Shapes (B, N, dim)."""

    def __init__(self, dim: int, num_heads: int, attn_dim: int, mlp_dim: int, attention: str,
                 attention_kwargs: dict | None = None, qkv_bias: bool = True, drop_rate: float = 0.0,
                 attn_drop_rate: float = 0.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = build_attention(attention, dim, num_heads=num_heads, inner_dim=attn_dim, qkv_bias=qkv_bias,
                                    attn_drop=attn_drop_rate, proj_drop=drop_rate, **(attention_kwargs or {}))
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, mlp_dim, drop_rate)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), mask)
        return x + self.mlp(self.norm2(x))


class Encoder(nn.Module):
    """``depth`` blocks followed by a final LayerNorm; (B, N, dim) -> (B, N, dim).

    Args are the model-level names: ``embed_dim`` (D'), ``depth``, ``num_heads``, ``attn_dim`` (D,
    the attention's inner_dim), ``mlp_dim``, ``attention`` (registry name) and its ``attention_kwargs``.
    """

    def __init__(self, embed_dim: int, depth: int, num_heads: int, attn_dim: int, mlp_dim: int, attention: str,
                 attention_kwargs: dict | None = None, qkv_bias: bool = True, drop_rate: float = 0.0,
                 attn_drop_rate: float = 0.0) -> None:
        super().__init__()
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self.blocks = nn.ModuleList(
            Block(embed_dim, num_heads, attn_dim, mlp_dim, attention, attention_kwargs, qkv_bias, drop_rate,
                  attn_drop_rate)
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, mask)
        return self.norm(x)
