"""Chunked streaming inference over one bag equals the unchunked WSI model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from medattn.models import create_model


def seqnorm_model(**kwargs):
    model = create_model("vitwsi_tiny", attention="seqnorm", num_classes=2, **kwargs).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith(("weight", "bias")):
                p.add_(0.2 * torch.randn_like(p))
        torch.nn.init.normal_(model.head.weight, std=0.5)  # the max readout's head starts at zero
    return model


@pytest.mark.parametrize("chunk_size", [1, 97, 5000])
@pytest.mark.parametrize("attention_kwargs", [{}, {"value_dim": 3}, {"eps": 0.5}])
@pytest.mark.parametrize("readout", ["cls", "attention", "max"])
def test_streaming_equals_unchunked(chunk_size, attention_kwargs, readout):
    model = seqnorm_model(attention_kwargs=attention_kwargs, readout=readout)
    if "eps" in attention_kwargs:  # each norm's own eps counts
        model.encoder.blocks[0].attn.k_norm.eps = 2.0
    features = torch.randn(700, 16)
    with torch.no_grad():
        expected = model(features[None])
    torch.testing.assert_close(model.forward_streaming(features, chunk_size=chunk_size), expected,
                               rtol=1e-5, atol=1e-5)


def test_streaming_reads_a_memory_map_with_positions_and_offset_features(tmp_path):
    model = seqnorm_model(pos_encoding="sincos", coord_scale=256.0)
    features = (torch.randn(500, 16) + 40.0).numpy()  # a large common offset
    coords = np.random.default_rng(0).integers(0, 50_000, size=(500, 2)).astype(np.float32)
    path = tmp_path / "bag.npy"
    np.save(path, features)
    with torch.no_grad():
        expected = model(torch.from_numpy(features)[None], coords=torch.from_numpy(coords)[None])
    actual = model.forward_streaming(np.load(path, mmap_mode="r"), coords=coords, chunk_size=64)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)


def test_streaming_refuses_mechanisms_that_need_all_tokens():
    model = create_model("vitwsi_tiny", attention="softmax")
    with pytest.raises(ValueError, match="cannot stream"):
        model.forward_streaming(torch.randn(10, 16))


@pytest.mark.parametrize("features, message", [(torch.randn(10, 15), "expected"), (torch.randn(0, 16), "empty")])
def test_streaming_rejects_bad_bags(features, message):
    with pytest.raises(ValueError, match=message):
        seqnorm_model().forward_streaming(features)


def test_streaming_refuses_an_hdf5_bag_declared_longer_than_stored(tmp_path):
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "bag.h5", "w") as f:
        f.create_dataset("features", shape=(3000, 16), chunks=(100, 16), dtype="f4")[:1000] = 1.0
    with h5py.File(tmp_path / "bag.h5", "r") as f, pytest.raises(ValueError, match="declares 3000 rows"):
        seqnorm_model().forward_streaming(f["features"], chunk_size=256)
