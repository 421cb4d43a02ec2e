"""Absorbing-diffusion transformer over a volume's VQ token grid (Bond-Taylor et al. 2022; BinaryFormer A.2).

Discrete absorbing diffusion: the forward process replaces tokens, one position at a time, by an
absorbing [MASK] state until all are masked after T steps; the reverse model sees a partly masked
grid and predicts the original token at every masked position at once ("parallel token prediction").

Tokens: a position holds ``G`` sub-codebook indices in ``[0, K)`` (:mod:`medattn.diffusion.codebook`);
index ``K`` is the mask. A position is masked as a whole (all ``G`` indices at once).

Model: ``x = sum_g Emb_g[t_g] + P`` with a learned positional embedding ``P`` of one vector per position
of the (Lh, Lw, Ld) grid (the paper's "positional embedding for a quantised latent space of shape
10 x 14 x 12"), then ``depth`` pre-norm transformer blocks (:class:`medattn.models.layers.Encoder`,
any registered attention mechanism, non-causal), then ``G`` linear heads of ``K`` logits each:
logits (B, N, G, K).

Training loss (:func:`absorbing_loss`): draw ``t ~ U{1..T}`` per sample, mask exactly
``max(1, round(N t / T))`` positions chosen uniformly (:func:`mask_schedule`), and take the mean over
masked positions of the mean over the ``G`` heads of the cross-entropy with the true indices:
``L = E_t [ 1/|M_t| sum_{i in M_t} 1/G sum_g CE(logits_{i,g}, x_{i,g}) ]`` ("the average of 8
cross-entropy scores", A.2). Bond-Taylor et al. weight the ELBO by ``1/t``; we use this normalised
per-sample mean (their reweighting's intent: every mask ratio counts equally), a decision the
BinaryFormer paper leaves open.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from medattn.models.layers import Encoder


class AbsorbingTransformer(nn.Module):
    """Tokens (B, N, G) int64 with ``K`` = mask -> logits (B, N, G, K); N = prod(grid).

    Args:
        grid: latent grid (Lh, Lw, Ld); the positional embedding has one vector per position.
        num_codebooks: G heads; codebook_size: K classes per head.
        dim: token width D (384 in the paper); depth: blocks (8); num_heads: attention heads.
        attention: registered mechanism name; attention_kwargs: its extra arguments.
        mlp_ratio: MLP hidden width over D.
    """

    def __init__(self, grid: tuple[int, int, int] | list[int], num_codebooks: int = 8, codebook_size: int = 64,
                 dim: int = 384, depth: int = 8, num_heads: int = 8, attention: str = "softmax",
                 attention_kwargs: dict | None = None, mlp_ratio: float = 4.0, drop_rate: float = 0.0) -> None:
        super().__init__()
        grid = tuple(int(n) for n in grid)
        if len(grid) != 3 or min(grid) < 1:
            raise ValueError(f"grid must be three positive sizes, got {grid}")
        self.grid, self.num_codebooks, self.codebook_size = grid, num_codebooks, codebook_size
        self.mask_index = codebook_size
        self.num_tokens = grid[0] * grid[1] * grid[2]
        self.embed = nn.ModuleList(nn.Embedding(codebook_size + 1, dim) for _ in range(num_codebooks))
        self.pos_embed = nn.Parameter(torch.zeros(1, self.num_tokens, dim))
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        self.encoder = Encoder(dim, depth, num_heads, dim, int(dim * mlp_ratio), attention, attention_kwargs,
                               drop_rate=drop_rate)
        self.head = nn.Linear(dim, num_codebooks * codebook_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.ndim != 3 or tokens.shape[1:] != (self.num_tokens, self.num_codebooks):
            raise ValueError(f"expected tokens (B, {self.num_tokens}, {self.num_codebooks}), got {tuple(tokens.shape)}")
        x = self.pos_embed + sum(emb(tokens[..., g]) for g, emb in enumerate(self.embed))
        logits = self.head(self.encoder(x))
        return logits.reshape(*tokens.shape[:2], self.num_codebooks, self.codebook_size)


def mask_schedule(batch: int, num_tokens: int, timesteps: int, generator: torch.Generator | None = None,
                  device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Absorbing forward process at a random time: -> (t (B,) in [1, T], masked (B, N) bool).

    Sample b has exactly ``max(1, round(N t_b / T))`` masked positions, chosen uniformly at random.
    """
    t = torch.randint(1, timesteps + 1, (batch,), generator=generator)
    counts = (num_tokens * t.double() / timesteps).round().long().clamp(1, num_tokens)
    ranks = torch.rand(batch, num_tokens, generator=generator).argsort(1).argsort(1)
    masked = ranks < counts[:, None]
    return t.to(device), masked.to(device)


def per_head_ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each head: logits (..., G, K), targets (..., G) -> (..., G)."""
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten(), reduction="none").reshape(targets.shape)


def absorbing_loss(model: AbsorbingTransformer, tokens: torch.Tensor, timesteps: int,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """The training loss of the module docstring for clean tokens (B, N, G); a scalar."""
    _, masked = mask_schedule(tokens.shape[0], tokens.shape[1], timesteps, generator, tokens.device)
    return masked_ce(model, tokens, masked)


def masked_ce(model: AbsorbingTransformer, tokens: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """Mean over samples of the mean, over masked positions, of the mean of the G cross-entropies."""
    noisy = tokens.masked_fill(masked[..., None], model.mask_index)
    ce = per_head_ce(model(noisy), tokens).mean(-1)  # (B, N)
    return ((ce * masked).sum(1) / masked.sum(1)).mean()
