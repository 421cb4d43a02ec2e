"""Inference over one gigantic bag in bounded memory, by streaming its tokens in chunks.

A whole-slide bag of 10^6 patch features (F = 2048) takes 8 GB in float32 before the first layer;
a mechanism whose attention reduces to global per-channel statistics (seqnorm) needs only those
statistics, never all tokens at once. For layer l this function streams the bag ``passes`` times
(the mechanism's ``stream_passes``), recomputing layers < l chunk by chunk from their finished
statistics, and accumulates layer l's statistics. Memory is O(chunk_size); time is
O(L^2 / 2 * passes * N) layer evaluations. The class token is token 0 and enters the statistics,
as in the unchunked model; the result equals :meth:`WSITransformer.forward` up to float rounding.

The features can be anything sliceable as ``features[start:stop]`` giving an (n, F) array: a
torch tensor, a NumPy array or memory map, or an ``h5py`` dataset read straight from disk. An HDF5
dataset declared longer than the file stores is refused (its unwritten rows would read as zeros).
"""

from __future__ import annotations

from collections.abc import Iterator

import h5py
import numpy as np
import torch

from ..data.bags import check_stored
from .wsi import WSITransformer, sincos_2d


def _rows(source, start: int, stop: int) -> torch.Tensor:
    """Rows [start, stop) of a tensor, array, memory map or HDF5 dataset, as a float32 tensor."""
    if torch.is_tensor(source):
        return source[start:stop].float()
    return torch.from_numpy(np.array(source[start:stop], dtype=np.float32))


def check_bag(model: WSITransformer, features, coords, chunk_size: int) -> None:
    """ValueError unless ``features`` is one non-empty (N, F) bag every block of ``model`` can stream."""
    if len(features.shape) != 2 or features.shape[1] != model.feature_dim:
        raise ValueError(f"expected a single bag of features (N, {model.feature_dim}), got {tuple(features.shape)}")
    if features.shape[0] == 0:
        raise ValueError("the bag is empty")
    if isinstance(features, h5py.Dataset):
        check_stored(features.name, features)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if model.pos_encoding == "sincos" and coords is None:
        raise ValueError("pos_encoding='sincos' needs coords")
    for block in model.encoder.blocks:
        if block.attn.stream_passes == 0:
            raise ValueError(f"{type(block.attn).__name__} cannot stream; use a mechanism with stream_passes > 0")


def bag_chunks(model: WSITransformer, features, coords, chunk_size: int) -> Iterator[torch.Tensor]:
    """The class token, then the projected features chunk by chunk, each (1, n_c, D')."""
    parameter = next(model.parameters())
    yield model.cls_token
    for start in range(0, features.shape[0], chunk_size):
        chunk = _rows(features, start, start + chunk_size).to(parameter.device, parameter.dtype)
        x = model.feature_proj(model.feature_norm(chunk)).unsqueeze(0)
        if model.pos_encoding == "sincos":
            position = _rows(coords, start, start + chunk_size).to(parameter.device)
            x = x + sincos_2d(position.unsqueeze(0) / model.coord_scale, x.shape[-1]).to(x.dtype)
        yield x


def through_blocks(blocks, x: torch.Tensor, states: list[dict]) -> torch.Tensor:
    """A chunk (1, n_c, D') through the first ``len(states)`` blocks, whose statistics are final."""
    for block, state in zip(blocks, states):
        x = x + block.attn.stream_forward(state, block.norm1(x))
        x = x + block.mlp(block.norm2(x))
    return x


@torch.no_grad()
def stream_states(model: WSITransformer, features, coords=None, chunk_size: int = 32_768,
                  observe=None) -> list[dict]:
    """The finished streaming statistics of every block (see the module docstring), bag checked first.

    ``observe(layer, h)``, if given, sees every chunk's attention input h = norm1(x) (1, n_c, D') of
    block ``layer`` in its first pass, the class token first (it is how explanations gather their own
    per-layer statistics in the same pass).
    """
    check_bag(model, features, coords, chunk_size)
    blocks = model.encoder.blocks
    states: list[dict] = []
    for layer, block in enumerate(blocks):
        state = block.attn.stream_begin()
        for pass_index in range(block.attn.stream_passes):
            for x in bag_chunks(model, features, coords, chunk_size):
                h = block.norm1(through_blocks(blocks, x, states))
                block.attn.stream_update(state, h, pass_index)
                if observe is not None and pass_index == 0:
                    observe(layer, h)
            block.attn.stream_end(state, pass_index)
        states.append(state)
    return states


@torch.no_grad()
def wsi_forward_streaming(model: WSITransformer, features, coords=None, chunk_size: int = 32_768) -> torch.Tensor:
    """Logits (1, num_classes) for a single bag ``features`` (N, F), streamed in chunks of tokens.

    Raises ValueError if a mechanism of the model cannot stream (e.g. softmax, which needs every
    token at once) or if the input has the wrong shape.
    """
    states = stream_states(model, features, coords, chunk_size)
    cls = through_blocks(model.encoder.blocks, model.cls_token, states)
    return model.head(model.encoder.norm(cls)[:, 0])
