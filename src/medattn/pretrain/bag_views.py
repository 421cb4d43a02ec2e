"""Two views of a bag: contrastive pretraining of a bag-of-features transformer on unlabelled bags.

The slide-level habit of Giga-SSL (Lazard et al., "Giga-SSL: Self-Supervised Learning for Gigapixel Images", CVPR
Workshops 2023): a random sparse subset of a slide's tiles is a view of the slide, and two views of one slide should
embed closer to each other than to the views of the other slides in the batch (SimCLR's NT-Xent loss, Chen et al.,
ICML 2020). For a batch of B bags, each of its real tiles f_k (F features), a view share s and at most T tiles::

    view      = m = clamp(round(s n), 1, T) of the bag's n real tiles, drawn without replacement   (B, m_max, F)
    x         = model.tile_stream(view)        the blocks' residual stream of the view's tiles          (B, m_max, D')
    e         = [mean_k LN(x_k), max_k LN(x_k)] over the view's real tiles                         (B, 2D')
    h         = normalise(Linear(GELU(Linear(e))))                                                    (B, P)
    loss      = NT-Xent over the 2B projections h of views a and b, temperature tau:
                mean_i -log( exp(h_i . h_i' / tau) / sum_{j != i} exp(h_i . h_j / tau) )

Choices the papers leave open here (docs/decisions.md, "Pretraining on unlabelled bags"):

* **Views are subsets of tiles, nothing else.** Tile features come from a frozen extractor, so there is no pixel
  augmentation to make; two halves of one bag (s = 0.5) share its findings in proportion, and T bounds a step's cost
  on bags of 20,000 tiles. A view never holds a padding tile, and each view of a bag is drawn anew every step.
* **The embedding pools mean and maximum** of the normalised tile tokens, so that a finding in a few tiles (the
  maximum) and a share of the bag (the mean) both tell bags apart; the LayerNorm and the projection are the
  objective's own and are dropped after pretraining. What ``medattn train --init-from`` takes is the model's
  feature projection and blocks (the readout and its head start fresh, whichever readout the run uses).
* **Masked-feature prediction is not offered**: without positions (the bag presets' default) every masked tile's
  token is the same mask token, so under SeqNorm (``Q'_i (K'^T V') / N``) every masked tile of a bag gets the same
  prediction, and the objective reduces to predicting the bag's mean feature.

``BagViews(model)(features, mask, coords=None, generator=None)`` -> (loss, the two views' projections (B, P) each);
an encoder that learned nothing scores ln(2B - 1) (:meth:`BagViews.chance_loss`).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from medattn.data.base import pad_bags
from medattn.models.wsi import WSITransformer

#: NT-Xent's temperature (SimCLR's setting for small batches).
TEMPERATURE = 0.1
#: The projection's output width (SimCLR: 128).
PROJECTION_DIM = 128


def nt_xent(a: torch.Tensor, b: torch.Tensor, temperature: float = TEMPERATURE) -> torch.Tensor:
    """SimCLR's loss of two views' projections a, b (B, P), each row of a the positive of the same row of b; rows
    are L2-normalised here. The 2B - 2 other projections are the negatives; needs B >= 2."""
    if a.shape != b.shape or a.ndim != 2 or a.shape[0] < 2:
        raise ValueError(f"nt_xent needs two (B, P) projections with B >= 2, got {tuple(a.shape)}, {tuple(b.shape)}")
    z = F.normalize(torch.cat([a, b]), dim=1)  # (2B, P)
    logits = z @ z.T / temperature
    logits = logits.masked_fill(torch.eye(len(z), dtype=torch.bool, device=z.device), float("-inf"))
    B = a.shape[0]
    positives = torch.cat([torch.arange(B, 2 * B), torch.arange(B)]).to(z.device)
    return F.cross_entropy(logits, positives)


def random_view(features: torch.Tensor, mask: torch.Tensor | None, share: float, max_tiles: int,
                coords: torch.Tensor | None = None, generator: torch.Generator | None = None):
    """A random subset of each bag's real tiles: (B, N, F), mask (B, N) (None: every tile real) -> (features (B, m,
    F), mask (B, m), coords (B, m, 2) or None), each bag keeping round(share x its real tiles), at least 1 and at most
    ``max_tiles``, in random order, zero-padded to the batch's largest view."""
    B, N, _ = features.shape
    real = torch.ones(B, N, dtype=torch.bool) if mask is None else mask.cpu()
    views = []
    for b in range(B):
        tiles = real[b].nonzero().squeeze(1)
        size = min(max_tiles, max(1, round(share * len(tiles))))
        chosen = tiles[torch.randperm(len(tiles), generator=generator)[:size]].to(features.device)
        views.append({"input": features[b, chosen],
                      "coords": features.new_zeros(size, 2) if coords is None else coords[b, chosen]})
    view, view_coords, view_mask = pad_bags(views)
    return view, view_mask, None if coords is None else view_coords


class BagViews(nn.Module):
    """Two-view contrastive pretraining (module docstring) around ``encoder``, whose weights it trains in place.

    Args:
        encoder: the bag model to pretrain (:class:`~medattn.models.wsi.WSITransformer`, any mechanism and readout).
        view_share: s, the share of a bag's real tiles in each view, in (0, 1).
        view_tiles: T, the most tiles a view holds.
        projection_dim: P; temperature: NT-Xent's tau.

    ``forward(features, mask=None, coords=None, generator=None)``: (B, N, F) bags, B >= 2 -> (loss, a, b).
    """

    def __init__(self, encoder: WSITransformer, view_share: float = 0.5, view_tiles: int = 512,
                 projection_dim: int = PROJECTION_DIM, temperature: float = TEMPERATURE) -> None:
        super().__init__()
        if not isinstance(encoder, WSITransformer):
            raise TypeError(f"two views of a bag pretrain a WSITransformer, got {type(encoder).__name__}")
        if not 0 < view_share < 1:
            raise ValueError(f"view_share must lie in (0, 1), got {view_share}")
        if view_tiles < 1:
            raise ValueError(f"view_tiles must be at least 1, got {view_tiles}")
        self.encoder = encoder
        self.view_share, self.view_tiles, self.temperature = view_share, view_tiles, temperature
        width = encoder.feature_proj.out_features
        self.norm = nn.LayerNorm(width)
        self.projector = nn.Sequential(nn.Linear(2 * width, width), nn.GELU(), nn.Linear(width, projection_dim))

    def embed(self, features: torch.Tensor, mask: torch.Tensor, coords: torch.Tensor | None = None) -> torch.Tensor:
        """A view (B, m, F) with its mask (B, m) -> (B, P) projections (not normalised)."""
        x = self.norm(self.encoder.tile_stream(features, mask, coords))  # (B, m, D')
        real = mask.unsqueeze(-1)
        mean = x.masked_fill(~real, 0.0).sum(1) / mask.sum(1, keepdim=True).to(x.dtype)
        top = x.masked_fill(~real, float("-inf")).amax(1)
        return self.projector(torch.cat([mean, top], dim=-1))

    def forward(self, features: torch.Tensor, mask: torch.Tensor | None = None, coords: torch.Tensor | None = None,
                generator: torch.Generator | None = None):
        a = self.embed(*random_view(features, mask, self.view_share, self.view_tiles, coords, generator))
        b = self.embed(*random_view(features, mask, self.view_share, self.view_tiles, coords, generator))
        return nt_xent(a, b, self.temperature), a, b

    @staticmethod
    def chance_loss(batch: int) -> float:
        """NT-Xent of views that learned nothing (every projection alike): ln(2B - 1), the positive one of the
        2B - 1 equally likely others. The log prints it beside the loss."""
        return math.log(2 * batch - 1)
