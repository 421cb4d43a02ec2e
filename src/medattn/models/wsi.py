"""Transformer for whole-slide images given as bags of pre-extracted patch features.

Input: features (B, N, F) from a patch encoder (e.g. RetCCL, F = 2048), an optional padding mask
(B, N) bool (True = real patch) so bags of different sizes share a batch, and optional patch
coordinates (B, N, 2). The features are standardised per feature with the training split's statistics
(stored as buffers), then ``Linear(F, D')`` replaces the patch embedding, the encoder runs with the mask, and
the head reads one vector of the bag, chosen by ``readout``:

* ``"cls"`` (the paper's ViT): a class token is prepended (always real) and the head reads it;
* ``"attention"``: no class token; gated attention pooling (:class:`~medattn.models.layers.GatedAttentionPool`,
  Ilse et al. 2018) of the tokens, weights a_k from the normalised tokens, ``z = LayerNorm(sum_k a_k x_k)``;
* ``"max"``: no class token; ``z = max_k x_k``, the channel-wise maximum over the real tokens of the blocks'
  residual stream (max-pooling MIL, Wang et al. 2018), not normalised, and the head starts at zero (logits 0, the
  loss a constant predictor's): from the first step the gradient reaches the tiles that stand out in each channel,
  where attention pooling starts as a mean over the bag. The final LayerNorm is not used: normalising every token
  (as the class token is) or the pooled vector removes the scale by which a tile with all its features raised (a
  hot spot) stands out;
* ``"mean"``: ``z = LayerNorm(mean_k x_k)``, the normalised mean of the residual stream over the real tokens;
* ``"proportion"``: a learned soft share of positive tiles per channel, ``p_kc = sigmoid(u_c . LN(x_k) + b_c)``
  (c = 1..``pool_dim``), ``z_c = mean_k p_kc``: what fraction of the bag looks like c;
* ``"count"``: the same indicators summed, ``z_c = sum_k p_kc / COUNT_UNIT``: how many tiles look like c
  (``COUNT_UNIT`` = 100 keeps z near 1 for bags of hundreds to thousands of tiles).

With ``pooled_features=True`` a second, linear path reads the bag's mean and maximum of its standardised input
features, ``s = [mean_k f_k, max_k f_k]`` (2F numbers, standardised over the training bags like z): logits
``head(z) + W_s s`` (``W_s``: ``pooled_head``). Before training, :func:`medattn.train.pooled_path.fit_pooled_path`
fits ``W_s`` and the head's bias on the training bags by the run's own loss, and the head on z starts at zero: the
model starts as the independent model on pooled features (a logistic, ridge-like or Cox model on the same 2F
numbers), and the transformer learns what that model misses. Why (docs/decisions.md, "Pooled features beside the
readout"): the max readout takes the maximum of a *mix* of features (``max_k w . f_k``), which picks the tile most
extreme in that mix; a hot spot is the maximum of each DAB feature on its own (``w . max_k f_k``), which a linear
model on pooled features reads directly (AUROC 0.962 on ``ihc_bags`` from the 64 maxima alone), and 180 bags are
too few for the mix to learn it. Built without the fit (a model made outside a run), both heads are zero: a constant
predictor until trained.

Max and attention answer "is there any positive tile" (presence); a fraction target (a share of positive tiles, a
burden that drives survival) is answered by mean or proportion, a count by count: max pooling cannot fit a
fraction, since a bag with one positive tile and a bag with a hundred have the same maximum.

Attention pooling weighs the blocks' residual stream x_k with weights from the normalised tokens and normalises
the pooled vector with the encoder's final LayerNorm (timm's ``fc_norm`` with global pooling).

Why the choice matters (docs/decisions.md, "Bag readout"): under SeqNorm every token's attention output is
``Q'_i (K'^T V') / N``, so the class token learns about the bag only through per-channel means and variances of
q (its own normalisation) and the normalised k-v cross-covariance: bag moments, in which a finding in 2% of
the tiles is a 2% change. Attention pooling reads each tile's own token (each carries its features through the
residual path), so a few positive tiles can carry the bag, as in attention-MIL; its cost is O(N). Max pooling
reads them too, and learns where attention pooling, starting as a mean, does not (measured in docs/decisions.md).

Positional information (the paper is silent for WSIs): ``pos_encoding="none"`` (default) treats the
bag as a set, so the model is permutation invariant; ``"sincos"`` adds a fixed 2D sine-cosine
encoding of ``coords / coord_scale`` (e.g. ``coord_scale`` = the patch size in pixels), which then
must be given.

Streamed inference (:meth:`WSITransformer.forward_streaming`): a bag of 10^6 patch features (F = 2048) takes
8 GB in float32 before the first layer; a mechanism whose attention reduces to global per-channel statistics
(SeqNorm) needs only those statistics, never all tokens at once. For layer l the bag is streamed ``passes``
times (the mechanism's ``stream_passes``), layers < l recomputed chunk by chunk from their finished
statistics, layer l's statistics accumulated. Memory is O(chunk_size); time is O(L^2 / 2 * passes * N) layer
evaluations. The class token (``readout="cls"``) is token 0 and enters the statistics, as in the unchunked model;
the pooling readouts take one more pass (attention's softmax accumulated online: running maximum, rescaled sums;
max a running maximum). The result equals :meth:`WSITransformer.forward` up to float rounding.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from .layers import Encoder, FeatureStandardizer, GatedAttentionPool, RunningStandardizer

READOUTS = ("cls", "attention", "max", "mean", "proportion", "count")
#: What question each pooling readout answers (docs/decisions.md, "Bag readout"): presence of a few positive tiles
#: (max, attention), how large a share of the bag is positive (mean, proportion) or how many tiles are (count).
READOUT_QUESTIONS = {"max": "presence", "attention": "presence", "mean": "proportion", "proportion": "proportion",
                     "count": "count", "cls": "bag moments"}
#: The readouts whose pooled vector is standardised by default (``pool_norm=None``): with it the max readout left a
#: constant predictor's loss in its first epoch on the realistic IHC regression bags, without it it sat there for 6
#: (benchmarks/bag_learning_dynamics.py); attention pooling trained worse with it (its pooled vector moves as its
#: weights sharpen, and the running statistics lag).
POOL_NORM_READOUTS = ("max",)
#: The count readout's unit: z is the soft number of positive tiles per COUNT_UNIT tiles' worth (a scale near 1).
COUNT_UNIT = 100.0


def sincos_2d(coords: torch.Tensor, dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """Fixed sine-cosine encoding of 2D positions: (B, N, 2) -> (B, N, dim); dim must divide by 4."""
    if dim % 4:
        raise ValueError(f"the sincos encoding needs a token dim divisible by 4, got {dim}")
    freqs = temperature ** (-torch.arange(dim // 4, device=coords.device, dtype=torch.float32) / (dim // 4))
    angles = coords.float().unsqueeze(-1) * freqs  # (B, N, 2, dim/4)
    return torch.cat([angles.sin(), angles.cos()], dim=-1).flatten(-2)  # (B, N, dim)


class WSITransformer(nn.Module):
    """Bag-of-features transformer classifier.

    Args:
        feature_dim: F, the dimension of the pre-extracted features.
        num_classes, embed_dim (D'), depth, num_heads, attn_dim (D), mlp_dim, attention,
        attention_kwargs, qkv_bias, drop_rate, attn_drop_rate: as for :class:`VisionTransformer`.
        pos_encoding: "none" or "sincos" (see the module docstring); coord_scale: divisor of coords.
        activation_checkpointing: as for :class:`VisionTransformer`.
        standardize_features: standardise each feature with the training split's statistics before
            ``feature_proj`` (:class:`~medattn.models.layers.FeatureStandardizer`, fitted by :mod:`medattn.train`).
        readout: one of :data:`READOUTS` (see the module docstring); ``pool_dim``: the attention pooling's hidden
            width (L of Ilse et al.), or the number of indicators of ``proportion`` and ``count`` (default
            ``embed_dim // 2``); ``pool_norm``: standardise a pooling readout's z with running statistics of the
            training bags before the head (:class:`~medattn.models.layers.RunningStandardizer`; ignored with
            ``readout="cls"``); None: on for the readouts of :data:`POOL_NORM_READOUTS` (max), where it was measured
            to end the flat start (docs/decisions.md, "Bag readout"); ``pooled_features``: the head also reads the
            bag's mean and maximum standardised features (see the module docstring; a pooling readout only).

    ``forward(features, mask=None, coords=None)``: (B, N, F) -> (B, num_classes) logits;
    ``forward_streaming(features, coords=None, chunk_size=32768)``: one bag (N, F) -> (1, num_classes), streamed.
    """

    input_contract = "bag"  # see medattn.models.input_contract

    def __init__(self, feature_dim: int = 2048, num_classes: int = 1, embed_dim: int = 512, depth: int = 2,
                 num_heads: int = 8, attn_dim: int | None = None, mlp_dim: int = 512, attention: str = "softmax",
                 attention_kwargs: dict | None = None, qkv_bias: bool = True, drop_rate: float = 0.0,
                 attn_drop_rate: float = 0.0, pos_encoding: str = "none", coord_scale: float = 1.0,
                 activation_checkpointing: bool = False, standardize_features: bool = True, readout: str = "cls",
                 pool_dim: int | None = None, pool_norm: bool | None = None, pooled_features: bool = False) -> None:
        super().__init__()
        if pos_encoding not in ("none", "sincos"):
            raise ValueError(f"pos_encoding must be 'none' or 'sincos', got {pos_encoding!r}")
        if readout not in READOUTS:
            raise ValueError(f"readout must be one of {', '.join(READOUTS)}, got {readout!r}")
        if pooled_features and readout == "cls":
            raise ValueError("pooled_features needs a pooling readout (the class token's head reads one token)")
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        self.feature_dim = feature_dim
        self.num_classes = num_classes
        self.pos_encoding = pos_encoding
        self.coord_scale = coord_scale
        self.readout = readout
        self.feature_norm = FeatureStandardizer(feature_dim) if standardize_features else nn.Identity()
        self.feature_proj = nn.Linear(feature_dim, embed_dim)
        if readout == "cls":
            self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
            nn.init.trunc_normal_(self.cls_token, std=0.02)
        self.encoder = Encoder(embed_dim, depth, num_heads, attn_dim or embed_dim, mlp_dim, attention,
                               attention_kwargs, qkv_bias, drop_rate, attn_drop_rate, activation_checkpointing)
        if readout == "attention":
            self.pool = GatedAttentionPool(embed_dim, pool_dim or max(1, embed_dim // 2))
        if readout in ("proportion", "count"):  # per-tile soft indicators p_kc (see the module docstring)
            self.pool = nn.Linear(embed_dim, pool_dim or max(1, embed_dim // 2))
        if readout == "max":  # reads the unnormalised residual stream: the final LayerNorm would never run
            self.encoder.norm = nn.Identity()
        self.head = nn.Linear(self.pool.out_features if readout in ("proportion", "count") else embed_dim,
                              num_classes)
        if pool_norm is None:
            pool_norm = readout in POOL_NORM_READOUTS
        self.pool_norm = RunningStandardizer(self.head.in_features) if pool_norm and readout != "cls" else nn.Identity()
        self.pooled_features = pooled_features
        if pooled_features:  # s = [mean, max] of the standardised features, standardised over the training bags
            self.features_pool_norm = RunningStandardizer(2 * feature_dim)
            self.pooled_head = nn.Linear(2 * feature_dim, num_classes, bias=False)
            nn.init.zeros_(self.pooled_head.weight)  # fitted before training (see the module docstring)
        if readout == "max" or pooled_features:  # the head on z starts at zero (see the module docstring)
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)

    def forward_features(self, features: torch.Tensor, mask: torch.Tensor | None = None,
                         coords: torch.Tensor | None = None) -> torch.Tensor:
        """-> (B, 1 + N, D') normalised tokens, the class token first (``readout="cls"``); (B, N, D') otherwise
        (``readout="max"``: the residual stream, not normalised)."""
        return self.encoder(*self._tokens(features, mask, coords))

    def _tokens(self, features: torch.Tensor, mask: torch.Tensor | None,
                coords: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> the encoder's input, (B, 1 + N, D') with the class token first or (B, N, D'), and its mask (the class
        token real), checked."""
        if features.ndim != 3 or features.shape[-1] != self.feature_dim:
            raise ValueError(f"expected features (B, N, {self.feature_dim}), got {tuple(features.shape)}")
        B, N, _ = features.shape
        tokens = self.feature_proj(self.feature_norm(features))  # (B, N, D')
        if self.pos_encoding == "sincos":
            if coords is None or coords.shape != (B, N, 2):
                got = None if coords is None else tuple(coords.shape)
                raise ValueError(f"pos_encoding='sincos' needs coords of shape ({B}, {N}, 2), got {got}")
            tokens = tokens + sincos_2d(coords / self.coord_scale, tokens.shape[-1]).to(tokens.dtype)
        if mask is not None and mask.shape != (B, N):
            raise ValueError(f"mask shape {tuple(mask.shape)} does not match the bag (B, N) = ({B}, {N})")
        if self.readout == "cls":
            tokens = torch.cat([self.cls_token.expand(B, -1, -1), tokens], dim=1)  # (B, 1 + N, D')
            if mask is not None:
                mask = torch.cat([mask.new_ones(B, 1), mask], dim=1)  # the class token is real
        return tokens, mask

    def forward(self, features: torch.Tensor, mask: torch.Tensor | None = None,
                coords: torch.Tensor | None = None) -> torch.Tensor:
        if self.readout == "cls":
            return self.head(self.forward_features(features, mask, coords)[:, 0])
        return self.read(self.pool_norm(self.pooled(features, mask, coords)[0]),
                         lambda: self.features_summary(self.feature_norm(features), mask))

    def read(self, z: torch.Tensor, summary) -> torch.Tensor:
        """The head on a pooling readout's standardised z (B, P) -> (B, num_classes) logits; with
        ``pooled_features`` plus the linear path on ``summary()``, the bag's (B, 2F) mean and maximum standardised
        features."""
        if not self.pooled_features:
            return self.head(z)
        return self.head(z) + self.pooled_head(self.features_pool_norm(summary()))

    @staticmethod
    def features_summary(features: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, N, F) standardised features and the (B, N) padding mask -> (B, 2F): each feature's mean and maximum
        over the bag's real tiles."""
        if mask is None:
            return torch.cat([features.mean(1), features.amax(1)], dim=-1)
        real = mask.unsqueeze(-1)
        mean = features.masked_fill(~real, 0.0).sum(1) / mask.sum(1, keepdim=True).clamp(min=1).to(features.dtype)
        return torch.cat([mean, features.masked_fill(~real, float("-inf")).amax(1)], dim=-1)

    def tile_stream(self, features: torch.Tensor, mask: torch.Tensor | None = None,
                    coords: torch.Tensor | None = None) -> torch.Tensor:
        """(B, N, F) -> (B, N, D') the blocks' residual stream of the tiles' tokens (the class token, where there
        is one, attends with them and is dropped): what the pooling readouts pool and bag pretraining embeds."""
        x = self.encoder.residual_stream(*self._tokens(features, mask, coords))
        return x[:, 1:] if self.readout == "cls" else x

    def pooled(self, features: torch.Tensor, mask: torch.Tensor | None = None,
               coords: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Pooling readouts: -> (z (B, D') the pooled vector, the attention weights a (B, N) or None)."""
        x = self.tile_stream(features, mask, coords)  # (B, N, D')
        if self.readout == "max":
            if mask is not None:
                x = x.masked_fill(~mask.unsqueeze(-1), float("-inf"))
            return x.amax(dim=1), None
        if self.readout in ("mean", "proportion", "count"):
            terms = self.pooled_terms(x)  # (B, N, P)
            if mask is not None:
                terms = terms.masked_fill(~mask.unsqueeze(-1), 0.0)
            size = terms.new_full(terms.shape[:1], x.shape[1]) if mask is None else mask.sum(1).to(terms.dtype)
            return self.finish_sums(terms.sum(1), size), None
        a = self.pool.weights(self.encoder.norm(x), mask)  # (B, N), zero on padding
        if mask is not None:
            x = x.masked_fill(~mask.unsqueeze(-1), 0.0)  # padding cannot reach the output or its gradients
        return self.encoder.norm(torch.einsum("bn,bnd->bd", a, x)), a

    def pooled_terms(self, x: torch.Tensor) -> torch.Tensor:
        """The summed readouts' per-token terms: the residual stream x (mean) or the indicators p (proportion,
        count), (..., N, D') -> (..., N, P)."""
        return x if self.readout == "mean" else torch.sigmoid(self.pool(self.encoder.norm(x)))

    def finish_sums(self, sums: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
        """(B, P) sums of :meth:`pooled_terms` over a bag's real tokens and (B,) their numbers -> the pooled z."""
        if self.readout == "count":
            return sums / COUNT_UNIT
        means = sums / size.unsqueeze(-1)
        return self.encoder.norm(means) if self.readout == "mean" else means

    def pooling_weights(self, features: torch.Tensor, mask: torch.Tensor | None = None,
                        coords: torch.Tensor | None = None) -> torch.Tensor:
        """(B, N) the attention readout's weight a_k of each instance (zero on padding, summing to one per bag)."""
        if self.readout != "attention":
            raise ValueError("pooling weights exist only with readout='attention'")
        return self.pooled(features, mask, coords)[1]

    @property
    def forms_tile_attention(self) -> bool:
        """Whether the head reads the tiles through attention weights of its own (``readout="attention"``), which
        ``medattn explain --method attention`` draws (:meth:`tile_attention`)."""
        return self.readout == "attention"

    def tile_attention(self, features: torch.Tensor, mask: torch.Tensor | None = None,
                       coords: torch.Tensor | None = None) -> torch.Tensor:
        """(B, N) the attention readout's a_k per tile (:meth:`pooling_weights`)."""
        return self.pooling_weights(features, mask, coords)

    # --- streamed inference over one gigantic bag (see the class docstring) -------------------------------------

    def check_streamable(self, features, coords, chunk_size: int) -> None:
        """ValueError unless ``features`` is one non-empty (N, F) bag every block can stream."""
        import h5py

        from ..data.bag_rows import check_stored

        if len(features.shape) != 2 or features.shape[1] != self.feature_dim:
            raise ValueError(f"expected a single bag of features (N, {self.feature_dim}), got {tuple(features.shape)}")
        if features.shape[0] == 0:
            raise ValueError("the bag is empty")
        if isinstance(features, h5py.Dataset):  # read from disk: every declared row must be stored
            check_stored(features.name, features)
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        if self.pos_encoding == "sincos" and coords is None:
            raise ValueError("pos_encoding='sincos' needs coords")
        for block in self.encoder.blocks:
            if block.attn.stream_passes == 0:
                raise ValueError(f"{type(block.attn).__name__} cannot stream; use a mechanism with stream_passes > 0")

    def stream_chunks(self, features, coords, chunk_size: int) -> Iterator[torch.Tensor]:
        """The class token (if there is one), then the projected features chunk by chunk, each (1, n_c, D')."""
        from ..data.bag_rows import read_rows

        if self.readout == "cls":
            yield self.cls_token
        for start, chunk in self.standardised_chunks(features, chunk_size):
            x = self.feature_proj(chunk).unsqueeze(0)
            if self.pos_encoding == "sincos":
                position = read_rows(coords, start, start + chunk_size).to(chunk.device)
                x = x + sincos_2d(position.unsqueeze(0) / self.coord_scale, x.shape[-1]).to(x.dtype)
            yield x

    def standardised_chunks(self, features, chunk_size: int) -> Iterator[tuple[int, torch.Tensor]]:
        """(first row, the chunk's standardised features (n_c, F)) for a bag (N, F) read chunk by chunk."""
        from ..data.bag_rows import read_rows

        parameter = self.head.weight
        for start in range(0, features.shape[0], chunk_size):
            chunk = read_rows(features, start, start + chunk_size).to(parameter.device, parameter.dtype)
            yield start, self.feature_norm(chunk)

    def through_streamed_blocks(self, x: torch.Tensor, states: list[dict]) -> torch.Tensor:
        """A chunk (1, n_c, D') through the first ``len(states)`` blocks, whose statistics are final."""
        for block, state in zip(self.encoder.blocks, states):
            x = x + block.attn.stream_forward(state, block.norm1(x))
            x = x + block.mlp(block.norm2(x))
        return x

    @torch.no_grad()
    def stream_states(self, features, coords=None, chunk_size: int = 32_768, observe=None) -> list[dict]:
        """The finished streaming statistics of every block, the bag checked first.

        ``observe(layer, h)``, if given, sees every chunk's attention input h = norm1(x) (1, n_c, D') of
        block ``layer`` in its first pass, the class token first (it is how explanations gather their own
        per-layer statistics in the same pass).
        """
        self.check_streamable(features, coords, chunk_size)
        states: list[dict] = []
        for layer, block in enumerate(self.encoder.blocks):
            state = block.attn.stream_begin()
            for pass_index in range(block.attn.stream_passes):
                for x in self.stream_chunks(features, coords, chunk_size):
                    h = block.norm1(self.through_streamed_blocks(x, states))
                    block.attn.stream_update(state, h, pass_index)
                    if observe is not None and pass_index == 0:
                        observe(layer, h)
                block.attn.stream_end(state, pass_index)
            states.append(state)
        return states

    @torch.no_grad()
    def forward_streaming(self, features, coords=None, chunk_size: int = 32_768) -> torch.Tensor:
        """Logits (1, num_classes) for a single bag ``features`` (N, F), streamed in chunks of tokens.

        ``features`` (and ``coords``) can be anything sliceable as ``features[start:stop]`` giving (n, F): a
        tensor, a NumPy array or memory map, or an ``h5py`` dataset read straight from disk (one declared longer
        than the file stores is refused). ValueError if a mechanism cannot stream (softmax needs every token at
        once) or the input has the wrong shape.
        """
        states = self.stream_states(features, coords, chunk_size)
        if self.readout == "cls":
            cls = self.through_streamed_blocks(self.cls_token, states)
            return self.head(self.encoder.norm(cls)[:, 0])
        summary = lambda: self.streamed_features_summary(features, chunk_size)  # noqa: E731
        if self.readout == "max":
            chunks = (self.through_streamed_blocks(x, states)[0].amax(dim=0)
                      for x in self.stream_chunks(features, coords, chunk_size))
            return self.read(self.pool_norm(torch.stack(list(chunks)).amax(dim=0, keepdim=True)), summary)
        if self.readout in ("mean", "proportion", "count"):
            sums = sum(self.pooled_terms(self.through_streamed_blocks(x, states)[0]).sum(0)
                       for x in self.stream_chunks(features, coords, chunk_size))
            size = torch.tensor([float(features.shape[0])], device=sums.device, dtype=sums.dtype)
            return self.read(self.pool_norm(self.finish_sums(sums.unsqueeze(0), size)), summary)
        peak, total, weighted = None, None, None  # online softmax: running max, sum of exp(s - max), sum of weighted x
        for chunk in self.stream_chunks(features, coords, chunk_size):
            x = self.through_streamed_blocks(chunk, states)[0]  # (n_c, D')
            s = self.pool.scores(self.encoder.norm(x))  # (n_c,)
            new_peak = s.max() if peak is None else torch.maximum(peak, s.max())
            rescale = 0.0 if peak is None else torch.exp(peak - new_peak)
            e = torch.exp(s - new_peak)
            total = e.sum() + (0.0 if total is None else rescale * total)
            weighted = e @ x + (0.0 if weighted is None else rescale * weighted)
            peak = new_peak
        return self.read(self.pool_norm(self.encoder.norm((weighted / total).unsqueeze(0))), summary)

    def streamed_features_summary(self, features, chunk_size: int) -> torch.Tensor:
        """:meth:`features_summary` of one bag (N, F) read chunk by chunk -> (1, 2F)."""
        sums, peak = None, None
        for _, chunk in self.standardised_chunks(features, chunk_size):
            sums = chunk.sum(0) if sums is None else sums + chunk.sum(0)
            peak = chunk.amax(0) if peak is None else torch.maximum(peak, chunk.amax(0))
        return torch.cat([sums / features.shape[0], peak]).unsqueeze(0)
