"""LayerScale on the transformer blocks (issue 40): what it scales, where it starts, how checkpoints without it load."""

from __future__ import annotations

import pytest
import torch

from medattn.attention import available_attentions
from medattn.models import create_model
from medattn.models.layers import Block, LayerScale


def test_layer_scale_multiplies_each_channel_by_its_learned_factor():
    scale = LayerScale(4, init_values=0.5)
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(scale(x), x * 0.5)
    scale.gamma.data = torch.tensor([1.0, 2.0, 3.0, 4.0])
    torch.testing.assert_close(scale(x), x * torch.tensor([1.0, 2.0, 3.0, 4.0]))


def test_without_init_values_a_block_has_no_scale_and_its_old_tensor_names():
    block = Block(16, 2, 16, 32, "softmax")
    assert isinstance(block.ls1, torch.nn.Identity) and isinstance(block.ls2, torch.nn.Identity)
    assert not any(name.startswith(("ls1", "ls2")) for name in block.state_dict())
    scaled = Block(16, 2, 16, 32, "softmax", init_values=0.1)
    assert set(scaled.state_dict()) - set(block.state_dict()) == {"ls1.gamma", "ls2.gamma"}


@pytest.mark.parametrize("attention", ["softmax", "seqnorm", "sima"])
def test_a_block_is_the_branches_added_through_their_scales(attention):
    """``x + ls1 * attn(norm1(x))``, then ``+ ls2 * mlp(norm2(.))``, each factor per channel, float64."""
    torch.manual_seed(0)
    block = Block(16, 2, 16, 32, attention, init_values=0.3).double()
    block.ls1.gamma.data.uniform_(0.5, 2.0)
    block.ls2.gamma.data.uniform_(-1.0, 1.0)
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    middle = x + block.ls1.gamma * block.attn(block.norm1(x))
    torch.testing.assert_close(block(x), middle + block.ls2.gamma * block.mlp(block.norm2(middle)))


@pytest.mark.parametrize("attention", sorted(available_attentions()))
def test_at_zero_every_block_is_the_identity_and_the_head_reads_the_stem(attention):
    """With the factors at 0 the hybrid ViT is its stem, the mean of the normalised tokens and the head (a CNN with
    a global average pool), whatever the mechanism; the attention still gets a gradient through the factors."""
    torch.manual_seed(0)
    model = create_model("vit2d_tiny", attention=attention, stem="residual", global_pool="avg", init_values=0.0)
    x = torch.randn(2, 1, 32, 32)
    tokens = model.patch_embed(x).flatten(2).transpose(1, 2)
    tokens = torch.cat([model.cls_token.expand(2, -1, -1), tokens], dim=1) + model.pos_embed
    expected = model.head(model.encoder.norm(tokens)[:, 1:].mean(dim=1))
    torch.testing.assert_close(model(x), expected)
    model(x).sum().backward()
    assert model.encoder.blocks[0].ls1.gamma.grad.abs().sum() > 0


def test_small_presets_start_with_small_factors_and_record_them(tmp_path):
    """The CPU ViT presets start their branches at 1e-5; a run records it as a preset value (model_defaults)."""
    from medattn.train.model_setup import preset_design

    for preset in ("vit2d_small", "vit3d_small"):
        model = create_model(preset, attention="seqnorm")
        gammas = [module.gamma for module in model.modules() if isinstance(module, LayerScale)]
        assert len(gammas) == 2 * len(model.encoder.blocks) and all(g.eq(1e-5).all() for g in gammas)
        assert preset_design({"name": preset, "kwargs": {}})["init_values"] == 1e-5
    assert "init_values" not in preset_design({"name": "vit2d_tiny", "kwargs": {}})  # None: not recorded
    assert "init_values" not in preset_design({"name": "vit2d_small", "kwargs": {"init_values": 0.1}})  # the config's


def test_a_checkpoint_written_without_layer_scale_loads_as_it_was(tmp_path):
    """A vit2d_small run of the day before LayerScale (its model_defaults: stem and readout only; no ``ls1.gamma``
    tensors) builds without LayerScale and gives the outputs it gave; ``model_defaults`` also takes numbers."""
    from engine_data import tiny_config
    from medattn.data.base import TaskInfo
    from medattn.runtime import checkpoint
    from medattn.runtime.build import build_model
    from medattn.runtime.trained import load_checkpoint

    task = TaskInfo("binary", "image2d", 1, (1, 64, 64), ["lesion"])
    config = tiny_config("model.name=vit2d_small", "model.attention=seqnorm")
    torch.manual_seed(3)
    written = build_model({**config["model"], "kwargs": {"init_values": None}}, task)
    meta = {"config": config, "task": checkpoint.task_to_dict(task),
            "model_defaults": {"stem": "residual", "global_pool": "avg"}}
    checkpoint.save(tmp_path / "run", written, meta)
    trained = load_checkpoint(tmp_path / "run")
    assert isinstance(trained.model.encoder.blocks[0].ls1, torch.nn.Identity)
    x = torch.randn(2, 1, 64, 64)
    torch.testing.assert_close(trained.model(x), written.eval()(x))
    checkpoint.check_meta({**meta, "model_defaults": {"init_values": 1e-5}}, "checkpoint.json")
    with pytest.raises(Exception, match="model_defaults"):
        checkpoint.check_meta({**meta, "model_defaults": {"init_values": float("nan")}}, "checkpoint.json")
