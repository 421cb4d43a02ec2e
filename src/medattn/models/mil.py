"""Gated attention-based multiple-instance learning (Ilse, Tomczak & Welling, ICML 2018), the bag baseline.

Takes the same input as :class:`~medattn.models.wsi.WSITransformer`: features (B, N, F), a padding
mask (B, N) bool (True = real instance) and coordinates, which this model ignores (a bag is a set).
For the instances k of one bag:

    x_k <- (x_k - mu) / sigma        the training split's per-feature statistics   (B, N, F)
    h_k = ReLU(W x_k + b)                                           (B, N, M), M = embed_dim
    s_k = w^T (tanh(V h_k) * sigmoid(U h_k))                        (B, N),    V, U: M -> L = attn_dim
    a_k = exp(s_k) / sum_{j real} exp(s_j)   over the bag's REAL instances only
    z   = sum_k a_k h_k                                             (B, M)
    logits = classifier(dropout(z))                                 (B, num_classes)

Padded instances are zeroed before the embedding and get a_k = 0 and h_k = 0, so whatever the padding
holds (zeros, large values, NaN) a padded bag gives the bag's own output and gradients. ``w`` has no
bias: a shift shared by every instance cancels in the softmax (Ilse et al.'s code keeps one, which
never gets a gradient). The ReLU after ``W`` is the embedding non-linearity of Ilse et al.'s code (and
CLAM's ``fc``).
"""

from __future__ import annotations

import torch
from torch import nn

from ..attention.base import is_traced
from .layers import FeatureStandardizer, GatedAttentionPool


class AttentionMIL(GatedAttentionPool):
    """Gated attention-MIL classifier over bags of instance features.

    Args:
        feature_dim: F, the dimension of the pre-extracted features.
        num_classes: logits returned (1 for a binary task).
        embed_dim: M, the instance embedding width (500 in Ilse et al.).
        attn_dim: L, the attention hidden width (128 in Ilse et al.).
        drop_rate: dropout on the embeddings and before the classifier.
        standardize_features: standardise each feature with the training split's statistics
            (:class:`~medattn.models.layers.FeatureStandardizer`, fitted by :mod:`medattn.train`) before the embedding.

    ``forward(features, mask=None, coords=None)``: (B, N, F) -> (B, num_classes) logits.
    ``attention_weights(features, mask=None)``: -> (B, N) a_k, zero on padding, summing to one per bag.
    ``tile_attention(features, mask=None, coords=None)``: the same a_k, what ``medattn explain --method attention``
    draws (:mod:`medattn.explain.core` asks a model for them when its ``forms_tile_attention`` is true).

    The pooling is :class:`~medattn.models.layers.GatedAttentionPool`'s (this class extends it: its
    ``attention_v``, ``attention_u`` and ``attention_w`` keep their names in the state dict).
    """

    input_contract = "bag"
    forms_tile_attention = True  # explain --method attention: the pooling weights a_k per tile

    def __init__(self, feature_dim: int = 2048, num_classes: int = 1, embed_dim: int = 512, attn_dim: int = 128,
                 drop_rate: float = 0.0, standardize_features: bool = True) -> None:
        if min(feature_dim, num_classes, embed_dim, attn_dim) < 1:
            raise ValueError("feature_dim, num_classes, embed_dim and attn_dim must be positive")
        super().__init__(embed_dim, attn_dim)
        self.feature_dim, self.num_classes = feature_dim, num_classes
        self.feature_norm = FeatureStandardizer(feature_dim) if standardize_features else nn.Identity()
        self.embed = nn.Linear(feature_dim, embed_dim)
        self.act = nn.ReLU()
        self.drop = nn.Dropout(drop_rate) if drop_rate > 0 else nn.Identity()
        self.head = nn.Linear(embed_dim, num_classes)

    def _embed(self, features: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, N, F) -> embeddings h (B, N, M), zero on padding, and weights a (B, N), zero on padding."""
        if features.ndim != 3 or features.shape[-1] != self.feature_dim:
            raise ValueError(f"expected features (B, N, {self.feature_dim}), got {tuple(features.shape)}")
        B, N, _ = features.shape
        features = self.feature_norm(features)
        if mask is not None:
            if mask.shape != (B, N):
                raise ValueError(f"mask shape {tuple(mask.shape)} does not match the bag (B, N) = ({B}, {N})")
            if not is_traced() and not bool(mask.any(dim=-1).all()):  # data-dependent: eager mode only
                raise ValueError("every bag needs at least one real instance (a mask row is all False)")
            features = features.masked_fill(~mask.unsqueeze(-1), 0.0)  # padding cannot reach values or gradients
        h = self.drop(self.act(self.embed(features)))  # (B, N, M)
        a = self.weights(h, mask)  # (B, N): exactly 0 on padding
        return (h if mask is None else h.masked_fill(~mask.unsqueeze(-1), 0.0)), a

    def attention_weights(self, features: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, N) attention a_k of each instance (zero on padding), e.g. for a heatmap."""
        return self._embed(features, mask)[1]

    def tile_attention(self, features: torch.Tensor, mask: torch.Tensor | None = None,
                       coords: torch.Tensor | None = None) -> torch.Tensor:
        """(B, N) the gated attention pooling's a_k per tile (zero on padding, summing to one per bag); coords are
        ignored, as in :meth:`forward`."""
        return self.attention_weights(features, mask)

    def forward(self, features: torch.Tensor, mask: torch.Tensor | None = None,
                coords: torch.Tensor | None = None) -> torch.Tensor:
        h, a = self._embed(features, mask)
        z = torch.einsum("bn,bnm->bm", a, h)  # (B, M)
        return self.head(self.drop(z))
