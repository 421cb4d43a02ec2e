"""The bag readouts that answer proportion and count questions (mean, proportion, count; issue 48) and the running
standardisation of every pooled vector: each readout equals a slow loop over the tokens, streams as it runs whole,
ignores padding; the standardiser's statistics are the training bags' mean and variance, bag by bag whatever the
batch, frozen in evaluation; checkpoints written before it load as they were."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from medattn.models import create_model
from medattn.models.layers import RunningStandardizer
from medattn.models.wsi import COUNT_UNIT, POOL_NORM_READOUTS, READOUT_QUESTIONS, READOUTS

SUMMED = ("mean", "proportion", "count")


def _trained_model(readout: str):
    """A vitwsi_tiny with ``readout`` whose pooled-vector statistics have seen a few training bags."""
    torch.manual_seed(0)
    model = create_model("vitwsi_tiny", attention="seqnorm", readout=readout, pool_norm=True)
    torch.nn.init.normal_(model.head.weight, std=0.5)
    with torch.no_grad():
        for size in (7, 19, 33):
            model(torch.randn(1, size, 16) * 2 + 1)
    return model.eval()


def test_every_readout_names_the_question_it_answers_and_max_is_standardised_by_default():
    assert set(READOUT_QUESTIONS) == set(READOUTS)
    for readout in READOUTS:
        built = create_model("vitwsi_tiny", readout=readout)
        assert isinstance(built.pool_norm, RunningStandardizer) == (readout in POOL_NORM_READOUTS)


@pytest.mark.parametrize("readout", SUMMED)
def test_summed_readouts_equal_a_loop_over_the_tokens(readout):
    model, bag = _trained_model(readout), torch.randn(1, 25, 16)
    with torch.no_grad():
        x = model.encoder.residual_stream(model.feature_proj(model.feature_norm(bag)))[0]  # (N, D')
        if readout == "mean":
            pooled = model.encoder.norm(sum(x[k] for k in range(25)) / 25)
        else:
            p = [torch.sigmoid(model.pool(model.encoder.norm(x[k]))) for k in range(25)]
            pooled = sum(p) / (25 if readout == "proportion" else COUNT_UNIT)
        standardised = (pooled - model.pool_norm.mean) / torch.sqrt(model.pool_norm.var + model.pool_norm.eps)
        torch.testing.assert_close(model(bag)[0], model.head(standardised), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("readout", [r for r in READOUTS if r != "cls"])
def test_pooling_readouts_stream_as_they_run_whole_and_ignore_padding(readout):
    model, bag = _trained_model(readout), torch.randn(1, 40, 16)
    with torch.no_grad():
        whole = model(bag)
        torch.testing.assert_close(model.forward_streaming(bag[0], chunk_size=7), whole, rtol=1e-4, atol=1e-5)
        padded = torch.cat([bag, torch.full((1, 9, 16), 1e3)], dim=1)
        mask = torch.ones(1, 49, dtype=torch.bool)
        mask[0, 40:] = False
        torch.testing.assert_close(model(padded, mask), whole, rtol=1e-4, atol=1e-5)


def test_a_count_grows_with_the_number_of_positive_tiles_where_a_proportion_does_not():
    """Two bags of the same share of one kind of tile, one twice the size: the proportion readout's z is the same,
    the count readout's doubles (COUNT_UNIT scales it), so each answers its own question."""
    torch.manual_seed(0)
    tiles = torch.randn(2, 16)
    small = tiles.repeat_interleave(torch.tensor([5, 15]), dim=0)[None]  # 25% of the first kind
    large = tiles.repeat_interleave(torch.tensor([10, 30]), dim=0)[None]
    for readout, ratio in (("proportion", 1.0), ("count", 2.0)):
        model = create_model("vitwsi_tiny", attention="softmax", readout=readout).eval()
        with torch.no_grad():
            z_small, z_large = model.pooled(small)[0], model.pooled(large)[0]
        torch.testing.assert_close(z_large, ratio * z_small, rtol=1e-4, atol=1e-6)


def test_the_standardiser_follows_the_training_bags_bag_by_bag_and_freezes_in_evaluation():
    rng = np.random.default_rng(0)
    z = torch.from_numpy(rng.normal(3.0, 2.0, (30, 4))).float()
    one_by_one, batched = RunningStandardizer(4, momentum=0.01), RunningStandardizer(4, momentum=0.01)
    for row in z:
        one_by_one(row[None])
    batched(z[:10])
    batched(z[10:])
    for standardiser in (one_by_one, batched):
        torch.testing.assert_close(standardiser.mean, z.mean(0), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(standardiser.var, z.var(0), rtol=1e-4, atol=1e-5)  # unbiased, as numpy ddof=1
    moving = RunningStandardizer(4, momentum=0.2)
    for row in z:
        moving(row[None])
    assert int(moving.count) == 30 and not torch.allclose(moving.mean, z.mean(0))  # the EMA after 1/momentum bags
    frozen = one_by_one.eval()
    before = frozen.mean.clone()
    out = frozen(z[:3] * 100)
    assert torch.equal(frozen.mean, before) and int(frozen.count) == 30
    torch.testing.assert_close(out, (z[:3] * 100 - before) / torch.sqrt(frozen.var + frozen.eps))


def test_a_checkpoint_from_before_the_pooled_standardisation_loads_as_it_was(tmp_path):
    from medattn.config import load_config
    from medattn.data.base import TaskInfo
    from medattn.runtime import checkpoint
    from medattn.runtime.build import build_model

    old = create_model("vitwsi_small", attention="seqnorm", feature_dim=16, pool_norm=False).eval()  # readout max
    config = load_config(None, ["data.kind=synthetic_wsi", "model.name=vitwsi_small", "model.attention=seqnorm"])
    task = TaskInfo("binary", "bag", 1, (16,), synthetic=True)
    checkpoint.save(tmp_path / "old", old, {"config": config, "task": checkpoint.task_to_dict(task)})
    meta = checkpoint.load_meta(tmp_path / "old")
    assert meta["config"]["model"]["kwargs"]["pool_norm"] is False
    rebuilt = build_model(meta["config"]["model"], task)
    checkpoint.load_model(tmp_path / "old", rebuilt)
    bag = torch.randn(1, 9, 16)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.eval()(bag), old(bag))
