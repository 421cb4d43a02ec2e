"""Transformer building blocks shared by every model: MLP, pre-norm block, encoder.

Names follow timm (``norm1``, ``attn``, ``norm2``, ``mlp.fc1``, ``mlp.fc2``) so checkpoints
interchange. The attention is built by name through :func:`medattn.attention.build_attention`;
nothing here knows which mechanism runs.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from medattn.attention import build_attention
from medattn.attention.base import is_traced


class Mlp(nn.Module):
    """``fc2(drop(gelu(fc1(x))))``: (B, N, dim) -> (B, N, dim) with a hidden width ``mlp_dim``.

    ``swiglu``: timm's packed SwiGLU (``SwiGLUPacked``) instead, ``fc2(drop(silu(x1) * x2))`` with ``x1, x2`` the
    halves of ``fc1(x)``: fc1 (dim -> 2 mlp_dim), fc2 (mlp_dim -> dim), the same parameter names.
    """

    def __init__(self, dim: int, mlp_dim: int, drop: float = 0.0, swiglu: bool = False) -> None:
        super().__init__()
        self.swiglu = swiglu
        self.fc1 = nn.Linear(dim, 2 * mlp_dim if swiglu else mlp_dim)
        self.act = nn.SiLU() if swiglu else nn.GELU()
        self.drop = nn.Dropout(drop) if drop > 0 else nn.Identity()
        self.fc2 = nn.Linear(mlp_dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc1(x)  # (B, N, mlp_dim), or (B, N, 2 mlp_dim) for SwiGLU
        if self.swiglu:
            gate, value = x.chunk(2, dim=-1)
            return self.fc2(self.drop(self.act(gate) * value))
        return self.fc2(self.drop(self.act(x)))


class LayerScale(nn.Module):
    """LayerScale (Touvron et al., "Going deeper with Image Transformers", ICCV 2021; timm's ``init_values``): a
    learned per-channel factor on a residual branch, ``x * gamma``, (..., dim) -> (..., dim), ``gamma`` (dim,)
    starting at ``init_values``."""

    def __init__(self, dim: int, init_values: float = 1.0) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init_values)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Block(nn.Module):
    """Pre-norm transformer block: ``x + ls1(attn(norm1(x))); x + ls2(mlp(norm2(x)))``. Shapes (B, N, dim).

    ``init_values``: None (default) leaves the branches unscaled (``ls1``, ``ls2`` are identities, so older
    checkpoints load); a number puts a :class:`LayerScale` starting there on each branch. A small value starts the
    block as the identity, so a hybrid ViT begins as its CNN stem with the head on the pooled tokens and the
    attention enters as it learns (docs/decisions.md, "LayerScale").

    ``norm_eps``: the LayerNorms' eps (timm's ViTs and the published tile encoders use 1e-6); ``swiglu``: a packed
    SwiGLU MLP (:class:`Mlp`).
    """

    def __init__(self, dim: int, num_heads: int, attn_dim: int, mlp_dim: int, attention: str,
                 attention_kwargs: dict | None = None, qkv_bias: bool = True, drop_rate: float = 0.0,
                 attn_drop_rate: float = 0.0, init_values: float | None = None, norm_eps: float = 1e-5,
                 swiglu: bool = False) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = build_attention(attention, dim, num_heads=num_heads, inner_dim=attn_dim, qkv_bias=qkv_bias,
                                    attn_drop=attn_drop_rate, proj_drop=drop_rate, **(attention_kwargs or {}))
        self.ls1 = nn.Identity() if init_values is None else LayerScale(dim, init_values)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, mlp_dim, drop_rate, swiglu)
        self.ls2 = nn.Identity() if init_values is None else LayerScale(dim, init_values)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.ls1(self.attn(self.norm1(x), mask))
        return x + self.ls2(self.mlp(self.norm2(x)))


class Encoder(nn.Module):
    """``depth`` blocks followed by a final LayerNorm; (B, N, dim) -> (B, N, dim).

    Args are the model-level names: ``embed_dim`` (D'), ``depth``, ``num_heads``, ``attn_dim`` (D,
    the attention's inner_dim), ``mlp_dim``, ``attention`` (registry name) and its ``attention_kwargs``;
    ``init_values`` the blocks' LayerScale start (None: no LayerScale); ``norm_eps`` the LayerNorms' eps and
    ``swiglu`` a packed SwiGLU MLP (:class:`Block`).

    ``activation_checkpointing`` (attribute, settable after construction): while gradients are being
    recorded, each block keeps only its input (B, N, dim) and recomputes its activations during the
    backward pass (``torch.utils.checkpoint``, non-reentrant, dropout masks replayed from the saved RNG
    state), so the stored activations of ``depth`` blocks shrink to ``depth`` token tensors plus one
    block's worth, for about one extra forward pass of compute. The gradients are the same.
    """

    def __init__(self, embed_dim: int, depth: int, num_heads: int, attn_dim: int, mlp_dim: int, attention: str,
                 attention_kwargs: dict | None = None, qkv_bias: bool = True, drop_rate: float = 0.0,
                 attn_drop_rate: float = 0.0, activation_checkpointing: bool = False,
                 init_values: float | None = None, norm_eps: float = 1e-5, swiglu: bool = False) -> None:
        super().__init__()
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self.activation_checkpointing = activation_checkpointing
        self.blocks = nn.ModuleList(
            Block(embed_dim, num_heads, attn_dim, mlp_dim, attention, attention_kwargs, qkv_bias, drop_rate,
                  attn_drop_rate, init_values, norm_eps, swiglu)
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(embed_dim, eps=norm_eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.norm(self.residual_stream(x, mask))

    def residual_stream(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The blocks' output before the final LayerNorm (B, N, dim), for a readout that pools the tokens first
        and normalises the pooled vector (timm's ``fc_norm`` habit)."""
        recompute = self.activation_checkpointing and torch.is_grad_enabled()
        for block in self.blocks:
            x = checkpoint(block, x, mask, use_reentrant=False) if recompute else block(x, mask)
        return x


def set_activation_checkpointing(model: nn.Module, enabled: bool = True) -> int:
    """Turn per-block activation checkpointing on or off in every :class:`Encoder` of ``model``.

    Returns the number of encoders changed; 0 means the model has no transformer blocks to checkpoint.
    """
    encoders = [module for module in model.modules() if isinstance(module, Encoder)]
    for encoder in encoders:
        encoder.activation_checkpointing = enabled
    return len(encoders)


class ConvStem(nn.Module):
    """Early convolutions (Xiao et al. 2021, "Early Convolutions Help Transformers See Better") in place
    of the patchify convolution: (B, C, *spatial) -> (B, embed_dim, *spatial / patch_size).

    ``k = log2(max(patch_size))`` blocks of ``conv 3x3(x3) -> BatchNorm -> ReLU``, each halving every axis
    whose patch is not yet covered (stride 2 on that axis, 1 on the others), then a 1x1 convolution to
    ``embed_dim`` (the paper's design: channels double per block and end at ``embed_dim / 2``, here
    ``embed_dim / 2^(k - i)`` for block i = 1..k, at least 8). Patch sizes must be powers of two. The
    paper drops one transformer block to keep the FLOPs; we keep ``depth`` as given (the stem is a small
    share of a small ViT's cost) and leave that choice to ``depth``.
    """

    def __init__(self, in_chans: int, embed_dim: int, patch_size: tuple[int, ...]) -> None:
        super().__init__()
        if any(p & (p - 1) for p in patch_size):
            raise ValueError(f"the convolutional stem needs power-of-two patch sizes, got {patch_size} "
                             f"(stem='patch' takes any)")
        conv = nn.Conv2d if len(patch_size) == 2 else nn.Conv3d
        norm = nn.BatchNorm2d if len(patch_size) == 2 else nn.BatchNorm3d
        steps = max(p.bit_length() - 1 for p in patch_size)
        layers, chans, remaining = [], in_chans, list(patch_size)
        for i in range(1, steps + 1):
            stride = tuple(2 if r > 1 else 1 for r in remaining)
            remaining = [r // s for r, s in zip(remaining, stride)]
            width = max(8, embed_dim // 2 ** (steps - i + 1))
            layers += [conv(chans, width, 3, stride=stride, padding=1, bias=False), norm(width), nn.ReLU(inplace=True)]
            chans = width
        self.stem = nn.Sequential(*layers)
        self.proj = conv(chans, embed_dim, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.stem(x))  # (B, embed_dim, *grid)


class FeatureStandardizer(nn.Module):
    """Per-feature standardisation of pre-extracted instance features, ``(x - mean) / std``, with the statistics
    held as buffers: fitted on the training split (:meth:`set_statistics`, called by
    :func:`medattn.train.model_setup.fit_feature_norm`), saved in the checkpoint and applied wherever the model
    runs (eval, predict, export), since feature scales differ by extractor (a ResNet-50's pooled features lie in
    [0, 3], a ViT's in [-10, 10], hand-made ones in counts).

    ``forward(x)``: (..., F) -> (..., F). A new layer is the identity (mean 0, std 1).
    """

    def __init__(self, feature_dim: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(feature_dim))
        self.register_buffer("std", torch.ones(feature_dim))

    def set_statistics(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        """Copy the per-feature ``mean`` and ``std`` (F,); a std below 1e-6 (a constant feature) becomes 1."""
        if mean.shape != self.mean.shape or std.shape != self.std.shape:
            raise ValueError(f"statistics of shape {tuple(mean.shape)}/{tuple(std.shape)} for {self.mean.shape[0]} "
                             f"features")
        self.mean.copy_(mean)
        self.std.copy_(torch.where(std < 1e-6, torch.ones_like(std), std))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)


class RunningStandardizer(nn.Module):
    """Standardises a bag's pooled vector with running statistics of the training bags' pooled vectors::

        z' = (z - m) / sqrt(v + eps)                      (B, D) -> (B, D)

    m and v (buffers, per channel) follow the pooled vectors seen in training: their cumulative mean and variance
    over the first 1 / ``momentum`` bags, then an exponential moving average (BatchNorm's running statistics, but
    also used in training, so a batch of one bag works and evaluation is training's function). Why: a pooled vector
    of hundreds of tiles varies little from bag to bag next to its size, so a head on it starts as a constant
    predictor and learns only as its weights grow to 1 / (that variation) (issue 48's learning-dynamics finding);
    standardised, the between-bag variation the head sees is of order one from the first step. In evaluation (and
    in exported graphs) m and v are constants. Gradients do not flow through m and v.
    """

    def __init__(self, dim: int, momentum: float = 0.02, eps: float = 1e-5) -> None:
        super().__init__()
        self.momentum, self.eps = momentum, eps
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def _update(self, z: torch.Tensor) -> None:
        for row in z.detach().float():  # bag by bag: the same statistics whatever the batch size
            if self.count == 0:  # the first bag sets the mean; the variance keeps its prior of one
                self.mean.copy_(row)
            else:  # Welford's update (unbiased variance), weights floored at the momentum
                delta = row - self.mean
                self.mean.add_(max(self.momentum, 1.0 / float(self.count + 1)) * delta)
                rate = max(self.momentum, 1.0 / float(self.count))
                self.var.mul_(1 - rate).add_(rate * delta * (row - self.mean))
            self.count += 1

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        if self.training and not is_traced():
            self._update(z)
        return (z - self.mean.to(z.dtype)) / torch.sqrt(self.var.to(z.dtype) + self.eps)


class GatedAttentionPool(nn.Module):
    """Gated attention pooling of a set of tokens (Ilse, Tomczak & Welling, ICML 2018), the readout that lets
    a bag model single out its rare instances::

        s_k = w^T (tanh(V h_k) * sigmoid(U h_k))          (B, N),  V, U: dim -> attn_dim
        a_k = exp(s_k) / sum_{j real} exp(s_j)             over the real tokens only
        z   = sum_k a_k h_k                                (B, dim)

    ``w`` has no bias (a shift shared by every token cancels in the softmax). The parameter names are those of
    :class:`~medattn.models.mil.AttentionMIL`'s pooling.

    ``forward(h, mask=None)``: h (B, N, dim), mask (B, N) bool (True = real) -> (z (B, dim), a (B, N), exactly
    zero on padding). ``weights(h, mask=None)``: -> a alone. ``scores(h)``: (..., N, dim) -> (..., N) the
    unnormalised s_k (streamed pooling).
    """

    def __init__(self, dim: int, attn_dim: int) -> None:
        super().__init__()
        self.attention_v = nn.Linear(dim, attn_dim)
        self.attention_u = nn.Linear(dim, attn_dim)
        self.attention_w = nn.Linear(attn_dim, 1, bias=False)

    def scores(self, h: torch.Tensor) -> torch.Tensor:
        return self.attention_w(torch.tanh(self.attention_v(h)) * torch.sigmoid(self.attention_u(h))).squeeze(-1)

    def weights(self, h: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, N) a_k, the softmax of the scores over the real tokens (exactly 0 on padding)."""
        s = self.scores(h)  # (B, N)
        return torch.softmax(s if mask is None else s.masked_fill(~mask, float("-inf")), dim=-1)

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        a = self.weights(h, mask)
        if mask is not None:
            h = h.masked_fill(~mask.unsqueeze(-1), 0.0)  # padding cannot reach the output or its gradients
        return torch.einsum("bn,bnd->bd", a, h), a
