"""The bag transformer's pooled-feature path (``pooled_features=True``): the head reads the bag's mean and maximum
standardised features beside every pooling readout's z. Each readout equals a slow reference over the real tiles,
streams to the same logits, starts at zero for the fit to set and passes gradcheck in float64."""

from __future__ import annotations

import h5py
import pytest
import torch

from medattn.models import create_model
from medattn.models.wsi import READOUTS

POOLING = [readout for readout in READOUTS if readout != "cls"]


def _model(readout: str, dtype=torch.float32):
    """A tiny SeqNorm bag model with pooled features whose statistics have seen three training bags and whose head
    and pooled-feature path are random (the path starts at zero)."""
    torch.manual_seed(0)
    model = create_model("vitwsi_tiny", attention="seqnorm", readout=readout, pooled_features=True).to(dtype)
    model.train()
    with torch.no_grad():
        model(torch.randn(3, 40, 16, dtype=dtype) * 2 + 1)
        torch.nn.init.normal_(model.head.weight, std=0.5)
        torch.nn.init.normal_(model.pooled_head.weight, std=0.5)
    return model.eval()


def _slow_summary(features: torch.Tensor) -> torch.Tensor:
    """(n, F) one bag's real tiles, standardised -> (2F,) each feature's mean and maximum, by loops."""
    n, width = features.shape
    means = [sum(float(features[k, f]) for k in range(n)) / n for f in range(width)]
    peaks = [max(float(features[k, f]) for k in range(n)) for f in range(width)]
    return torch.tensor(means + peaks)


@pytest.mark.parametrize("readout", POOLING)
def test_the_head_reads_the_readout_and_the_bags_pooled_features_over_its_real_tiles(readout):
    model = _model(readout)
    bag = torch.randn(2, 25, 16)
    mask = torch.ones(2, 25, dtype=torch.bool)
    mask[1, 18:] = False
    with torch.no_grad():
        logits = model(bag, mask)
        for b, size in enumerate((25, 18)):
            z = model.pool_norm(model.pooled(bag[b:b + 1, :size])[0])[0]
            s = model.features_pool_norm(_slow_summary(model.feature_norm(bag[b, :size])).unsqueeze(0))[0]
            torch.testing.assert_close(logits[b], model.head(z) + model.pooled_head(s), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("readout", POOLING)
def test_a_streamed_bag_read_from_disk_gives_the_whole_bags_logits(readout, tmp_path):
    model = _model(readout)
    bag = torch.randn(61, 16)
    with h5py.File(tmp_path / "bag.h5", "w") as h5:
        h5["features"] = bag.numpy()
    with torch.no_grad(), h5py.File(tmp_path / "bag.h5") as h5:
        torch.testing.assert_close(model.forward_streaming(h5["features"], chunk_size=7), model(bag[None]),
                                   rtol=1e-4, atol=1e-5)


def test_built_outside_a_run_both_heads_start_at_zero_for_the_fit_to_set(monkeypatch):
    """The fit (medattn.train.pooled_path) sets the path and the bias; the head on z starts at zero, so a fitted
    model's first predictions are the pooled model's. Unfitted, the summary does not reach the logits."""
    model = create_model("vitwsi_tiny", attention="seqnorm", readout="attention", pooled_features=True).eval()
    assert not model.pooled_head.weight.any() and not model.head.weight.any()
    assert create_model("vitwsi_tiny", attention="seqnorm", readout="attention").head.weight.any()  # without: random
    bag = torch.randn(1, 30, 16)
    with torch.no_grad():
        before = model(bag)
        monkeypatch.setattr(model, "features_summary", lambda features, mask=None: torch.randn(1, 32) * 100)
        torch.testing.assert_close(model(bag), before)


def test_pooled_features_need_a_pooling_readout():
    with pytest.raises(ValueError, match="pooled_features needs a pooling readout"):
        create_model("vitwsi_tiny", readout="cls", pooled_features=True)


@pytest.mark.parametrize("readout", ["max", "mean"])
def test_gradients_through_both_paths_pass_gradcheck_in_float64(readout):
    model = _model(readout, torch.float64)
    bag = torch.randn(1, 9, 16, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: model(x), (bag,), eps=1e-6, atol=1e-5)

