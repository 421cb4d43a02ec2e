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

Attention per tile (:meth:`TransMIL.tile_attention`, ``medattn explain --method attention``): the class token's row
of TransLayer 2's softmax weights, the layer whose class token the head reads, averaged over the heads,

    a_j = mean_h softmax(q_cls^h k^h^T / sqrt(d))_j        j over the 1 + N' tokens (class token first)

mapped back to the tiles: grid token j < N is tile j, grid token N + j (a repeated copy) adds to tile j, so a tile's
weight is the attention its copies receive together; the class token's own share is left out (the tiles' weights
sum to 1 minus that share). PPEG mixes neighbouring grid tokens before this layer, so a token is its tile plus a
little of its neighbours on the square grid (which is not the slide's layout). Padded tiles get 0.
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
    has_attention = True  # exact softmax attention of its own (no mechanism argument): planned as a transformer
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

    forms_tile_attention = True  # explain --method attention: the class token's last attention row per tile

    def _bags(self, features: torch.Tensor, attention: bool = False) -> torch.Tensor:
        """Bags of one size (B, N, F) -> (B, num_classes), or with ``attention`` the tiles' weights (B, N) (module
        docstring)."""
        h = self.embed(self.feature_norm(features))  # (B, N, D)
        n = h.shape[1]
        side = math.ceil(math.sqrt(n))
        h = torch.cat([h, h[:, : side * side - n]], dim=1)  # (B, side^2, D): first instances repeated
        x = torch.cat([self.cls_token.expand(len(h), -1, -1), h], dim=1)  # (B, 1 + side^2, D)
        x = self.ppeg(self.layer1(x), side)
        if attention:
            return self._class_row_per_tile(self.layer2, x, n)
        x = self.layer2(x)
        return self.head(self.norm(x)[:, 0])

    @staticmethod
    def _class_row_per_tile(layer: TransLayer, x: torch.Tensor, n: int) -> torch.Tensor:
        """The class token's softmax row in ``layer`` (input x (B, 1 + side^2, D)), mean over heads, without the class
        token and with each repeated copy added to its tile -> (B, n)."""
        q, k, _ = layer.attn.split_heads(layer.attn.qkv(layer.norm(x)))  # (B, H, 1 + side^2, d)
        row = torch.softmax(q[:, :, :1] @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)  # (B, H, 1, 1 + side^2)
        tokens = row[:, :, 0, 1:].mean(dim=1)  # (B, side^2)
        weights = tokens[:, :n].clone()
        weights[:, : tokens.shape[1] - n] += tokens[:, n:]  # the copies belong to the first tiles
        return weights

    def tile_attention(self, features: torch.Tensor, mask: torch.Tensor | None = None,
                       coords: torch.Tensor | None = None) -> torch.Tensor:
        """(B, N) the class token's head-mean attention in the last layer per tile (module docstring), zero on
        padding; padded batches run bag by bag as in :meth:`forward`."""
        self._check(features, mask)
        if mask is None or bool(mask.all()):
            return self._bags(features, attention=True)
        out = features.new_zeros(features.shape[:2])
        for index, (bag, keep) in enumerate(zip(features, mask)):
            out[index, keep] = self._bags(bag[keep][None], attention=True)[0]
        return out

    def _check(self, features: torch.Tensor, mask: torch.Tensor | None) -> None:
        if features.ndim != 3 or features.shape[-1] != self.feature_dim:
            raise ValueError(f"expected features (B, N, {self.feature_dim}), got {tuple(features.shape)}")
        if mask is None:
            return
        if mask.shape != features.shape[:2]:
            raise ValueError(f"mask shape {tuple(mask.shape)} does not match the bag (B, N) = "
                             f"{tuple(features.shape[:2])}")
        if not bool(mask.any(dim=-1).all()):
            raise ValueError("every bag needs at least one real instance (a mask row is all False)")

    def forward(self, features: torch.Tensor, mask: torch.Tensor | None = None,
                coords: torch.Tensor | None = None) -> torch.Tensor:
        if features.ndim != 3 or features.shape[-1] != self.feature_dim:
            raise ValueError(f"expected features (B, N, {self.feature_dim}), got {tuple(features.shape)}")
        if mask is None or bool(mask.all()):
            return self._bags(features)
        self._check(features, mask)
        return torch.cat([self._bags(bag[keep][None]) for bag, keep in zip(features, mask)])  # bag by bag: exact
