"""TransMIL-style bag classifier (Shao et al., NeurIPS 2021), a transformer baseline for whole-slide bags.

TransMIL's layout, reimplemented from the paper: instance features are embedded, the bag is made square
(its first instances repeated until N' = ceil(sqrt(N))^2, so the tokens fill an H x H grid), a class token is
prepended, then

    x = x + Attn(LN(x))                       TransLayer 1     (1 + N', D)
    x = PPEG(x)                               grid tokens + depthwise conv 7x7 + 5x5 + 3x3 (position encoding)
    x = x + Attn(LN(x))                       TransLayer 2
    logits = head(LN(x)[class token])         (num_classes)

Two choices differ from TransMIL's code, both documented in docs/decisions.md: the attention is exact softmax
attention (medattn's ``softmax`` mechanism, qkv without bias as TransMIL's) where TransMIL uses the Nystrom
approximation, which exists for GPU memory and changes nothing a CPU user can measure on bags of <= 10^4
instances; and padded batches run bag by bag (each bag's square grid is built from its own instances only),
so a bag padded into a batch gives exactly its own output. Features are standardised with the training
split's statistics (:class:`~medattn.models.layers.FeatureStandardizer`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from medattn.attention import build_attention

from .layers import FeatureStandardizer


class PPEG(nn.Module):
    """Pyramid position encoding generator: tokens on their H x H grid + three depthwise convolutions.
    ``forward(x, side)``: (B, 1 + side^2, D) -> same shape; the class token passes unchanged."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(dim, dim, k, padding=k // 2, groups=dim) for k in (7, 5, 3))

    def forward(self, x: torch.Tensor, side: int) -> torch.Tensor:
        cls_token, tokens = x[:, :1], x[:, 1:]
        B, N, D = tokens.shape
        grid = tokens.transpose(1, 2).reshape(B, D, side, side)  # (B, D, H, H)
        grid = grid + sum(conv(grid) for conv in self.convs)
        return torch.cat([cls_token, grid.flatten(2).transpose(1, 2)], dim=1)  # (B, 1 + H^2, D)


class TransLayer(nn.Module):
    """``x + Attn(LN(x))`` (TransMIL's layer: no MLP)."""

    def __init__(self, dim: int, num_heads: int, attn_drop: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attn = build_attention("softmax", dim, num_heads=num_heads, qkv_bias=False, attn_drop=attn_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(self.norm(x))


class TransMIL(nn.Module):
    """TransMIL-style classifier over bags of instance features.

    Args:
        feature_dim: F, the dimension of the pre-extracted features.
        num_classes: logits returned.
        embed_dim: D (512 in TransMIL).
        num_heads: attention heads (8 in TransMIL).
        drop_rate: dropout after the embedding; attn_drop_rate: on the attention weights.
        standardize_features: standardise features with the training split's statistics.

    ``forward(features, mask=None, coords=None)``: (B, N, F) -> (B, num_classes); coords are ignored.
    """

    input_contract = "bag"
    tokens_are_inputs = False  # the square grid repeats instances and PPEG mixes them: no attention rollout

    def __init__(self, feature_dim: int = 2048, num_classes: int = 1, embed_dim: int = 512, num_heads: int = 8,
                 drop_rate: float = 0.0, attn_drop_rate: float = 0.0, standardize_features: bool = True) -> None:
        super().__init__()
        if min(feature_dim, num_classes, embed_dim, num_heads) < 1 or embed_dim % num_heads:
            raise ValueError("feature_dim, num_classes, embed_dim and num_heads must be positive, embed_dim a "
                             "multiple of num_heads")
        self.feature_dim, self.num_classes = feature_dim, num_classes
        self.feature_norm = FeatureStandardizer(feature_dim) if standardize_features else nn.Identity()
        self.embed = nn.Sequential(nn.Linear(feature_dim, embed_dim), nn.ReLU(),
                                   nn.Dropout(drop_rate) if drop_rate > 0 else nn.Identity())
        self.cls_token = nn.Parameter(torch.randn(1, 1, embed_dim) * 0.02)
        self.layer1 = TransLayer(embed_dim, num_heads, attn_drop_rate)
        self.ppeg = PPEG(embed_dim)
        self.layer2 = TransLayer(embed_dim, num_heads, attn_drop_rate)
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, num_classes)

    def _bags(self, features: torch.Tensor) -> torch.Tensor:
        """Bags of one size (B, N, F) -> (B, num_classes)."""
        h = self.embed(self.feature_norm(features))  # (B, N, D)
        side = math.ceil(math.sqrt(h.shape[1]))
        h = torch.cat([h, h[:, : side * side - h.shape[1]]], dim=1)  # (B, side^2, D): first instances repeated
        x = torch.cat([self.cls_token.expand(len(h), -1, -1), h], dim=1)  # (B, 1 + side^2, D)
        x = self.layer2(self.ppeg(self.layer1(x), side))
        return self.head(self.norm(x)[:, 0])

    def forward(self, features: torch.Tensor, mask: torch.Tensor | None = None,
                coords: torch.Tensor | None = None) -> torch.Tensor:
        if features.ndim != 3 or features.shape[-1] != self.feature_dim:
            raise ValueError(f"expected features (B, N, {self.feature_dim}), got {tuple(features.shape)}")
        if mask is None or bool(mask.all()):
            return self._bags(features)
        if mask.shape != features.shape[:2]:
            raise ValueError(f"mask shape {tuple(mask.shape)} does not match the bag (B, N) = "
                             f"{tuple(features.shape[:2])}")
        if not bool(mask.any(dim=-1).all()):
            raise ValueError("every bag needs at least one real instance (a mask row is all False)")
        return torch.cat([self._bags(bag[keep][None]) for bag, keep in zip(features, mask)])  # bag by bag: exact
