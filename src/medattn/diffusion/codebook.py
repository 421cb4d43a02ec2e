"""Vector quantisation with an exponential-moving-average codebook split into sub-codebooks.

BinaryFormer (App. A.2) splits the VQ-AE's codebook into ``G = 8`` sub-codebooks of ``K = 64``
entries each: a latent vector of ``E`` channels is cut into ``G`` groups of ``E / G`` channels and
each group is quantised to the nearest entry of its own sub-codebook, so one latent position is a
tuple of ``G`` indices in ``[0, K)`` (6 bits each) and the transformer predicts it with ``G`` heads.

EMA update (van den Oord et al. 2017, App. A.1; used instead of a codebook gradient). For
sub-codebook ``g`` and entry ``k``, with ``n_k`` the number of vectors assigned to ``k`` in the
batch and ``s_k`` their sum::

    N_k <- d N_k + (1 - d) n_k          (EMA cluster size)
    S_k <- d S_k + (1 - d) s_k          (EMA sum)
    e_k  = S_k / N~_k,   N~_k = (N_k + eps) / (sum_j N_j + K eps) * sum_j N_j   (Laplace smoothing)

so every entry moves toward the mean of the vectors assigned to it. The encoder is pulled toward its
codes by the commitment loss ``beta * mean((z - sg(e))^2)``; the decoder's gradient reaches the encoder
through the straight-through estimator ``z + sg(e - z)``.

Dead codes (a decision the paper leaves open): an entry whose EMA cluster size ``N_k`` falls below
``dead_threshold`` (default 1e-3, i.e. unused for roughly ``log(1e-3) / log(d)`` ~ 690 steps at
d = 0.99 after a last use of one vector) is restarted at a vector drawn at random from the current
batch's group-``g`` vectors, with ``N_k = 1`` and ``S_k`` that vector. Before the first training step
the codebooks are initialised from the first batch (random draws of its vectors), so no entry starts
far from the data. Both happen only in training mode; evaluation never changes the codebook.
"""

from __future__ import annotations

import torch
from torch import nn


class SubCodebookEMA(nn.Module):
    """``G`` EMA codebooks of ``K`` entries of ``dim / G`` channels.

    Args:
        dim: channels E of a latent vector (divisible by ``num_codebooks``).
        num_codebooks: G.
        codebook_size: K entries per sub-codebook.
        decay: EMA decay d.
        commitment: beta of the commitment loss.
        eps: Laplace smoothing of the cluster sizes.
        dead_threshold: EMA cluster size under which an entry is restarted from the batch.

    ``forward(z)``: z (M, E) -> (quantised (M, E) with straight-through gradient, indices (M, G) int64,
    commitment loss (scalar)).
    """

    def __init__(self, dim: int, num_codebooks: int = 8, codebook_size: int = 64, decay: float = 0.99,
                 commitment: float = 0.25, eps: float = 1e-5, dead_threshold: float = 1e-3) -> None:
        super().__init__()
        if num_codebooks < 1 or dim % num_codebooks:
            raise ValueError(f"embed_dim {dim} must be divisible by num_codebooks {num_codebooks}")
        if codebook_size < 2:
            raise ValueError(f"codebook_size must be at least 2, got {codebook_size}")
        if not 0 <= decay < 1:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.dim, self.num_codebooks, self.codebook_size = dim, num_codebooks, codebook_size
        self.group_dim = dim // num_codebooks
        self.decay, self.commitment, self.eps, self.dead_threshold = decay, commitment, eps, dead_threshold
        codes = torch.randn(num_codebooks, codebook_size, self.group_dim)
        self.register_buffer("codes", codes)
        self.register_buffer("cluster_size", torch.ones(num_codebooks, codebook_size))
        self.register_buffer("code_sum", codes.clone())
        self.register_buffer("initialised", torch.zeros((), dtype=torch.bool))

    def assign(self, z: torch.Tensor) -> torch.Tensor:
        """Nearest entry per group: z (M, E) -> indices (M, G) (squared Euclidean distance)."""
        groups = z.reshape(-1, self.num_codebooks, self.group_dim).transpose(0, 1)  # (G, M, E/G)
        distances = (groups.pow(2).sum(-1, keepdim=True) - 2 * groups @ self.codes.transpose(1, 2)
                     + self.codes.pow(2).sum(-1).unsqueeze(1))  # (G, M, K)
        return distances.argmin(-1).transpose(0, 1).contiguous()

    def lookup(self, indices: torch.Tensor) -> torch.Tensor:
        """indices (..., G) -> code vectors (..., E) (the G entries concatenated)."""
        groups = torch.arange(self.num_codebooks, device=indices.device)
        return self.codes[groups, indices].flatten(-2)

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if z.ndim != 2 or z.shape[1] != self.dim:
            raise ValueError(f"expected latent vectors (M, {self.dim}), got {tuple(z.shape)}")
        if self.training:
            self._initialise(z.detach())
        indices = self.assign(z.detach())
        if self.training:
            self._update(z.detach(), indices)
        quantised = self.lookup(indices)
        loss = self.commitment * (z - quantised.detach()).pow(2).mean()
        return z + (quantised - z).detach(), indices, loss

    @torch.no_grad()
    def _initialise(self, z: torch.Tensor) -> None:
        if bool(self.initialised):
            return
        groups = z.reshape(-1, self.num_codebooks, self.group_dim)
        pick = torch.randint(groups.shape[0], (self.num_codebooks, self.codebook_size), device=z.device)
        self.codes.copy_(groups[pick, torch.arange(self.num_codebooks, device=z.device)[:, None]])
        self.code_sum.copy_(self.codes)
        self.cluster_size.fill_(1.0)
        self.initialised.fill_(True)

    @torch.no_grad()
    def _update(self, z: torch.Tensor, indices: torch.Tensor) -> None:
        groups = z.reshape(-1, self.num_codebooks, self.group_dim).transpose(0, 1)  # (G, M, E/G)
        onehot = nn.functional.one_hot(indices.transpose(0, 1), self.codebook_size).to(z.dtype)  # (G, M, K)
        counts = onehot.sum(1)  # (G, K)
        sums = onehot.transpose(1, 2) @ groups  # (G, K, E/G)
        self.cluster_size.mul_(self.decay).add_(counts, alpha=1 - self.decay)
        self.code_sum.mul_(self.decay).add_(sums, alpha=1 - self.decay)
        total = self.cluster_size.sum(-1, keepdim=True)
        smoothed = (self.cluster_size + self.eps) / (total + self.codebook_size * self.eps) * total
        self.codes.copy_(self.code_sum / smoothed.unsqueeze(-1))
        dead = self.cluster_size < self.dead_threshold  # (G, K)
        if dead.any():
            g, k = dead.nonzero(as_tuple=True)
            draw = groups[g, torch.randint(groups.shape[1], (len(g),), device=z.device)]
            self.codes[g, k] = draw
            self.code_sum[g, k] = draw
            self.cluster_size[g, k] = 1.0

    def usage(self) -> torch.Tensor:
        """Fraction of entries per sub-codebook whose EMA cluster size is above the dead threshold: (G,)."""
        return (self.cluster_size >= self.dead_threshold).float().mean(-1)
