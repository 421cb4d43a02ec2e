"""Model presets, resolution changes, masks and mechanism conversion."""

from __future__ import annotations

import pytest
import torch

from medattn.attention import available_attentions, build_attention, get_attention_class
from medattn.models import VisionTransformer, available_models, convert_attention, create_model

ATTENTIONS = available_attentions()


def convert_attention_module(old, name):
    """Our mechanism with timm's qkv/proj weights copied in (timm uses the same names and layout)."""
    new = build_attention(name, dim=old.qkv.in_features, num_heads=old.num_heads, qkv_bias=old.qkv.bias is not None)
    missing, _ = new.load_state_dict(old.state_dict(), strict=False)
    assert not [k for k in missing if k.startswith(("qkv", "proj"))]
    return new


def block_shapes(model):
    return {name: tuple(p.shape) for name, p in model.named_parameters() if name.startswith("encoder.blocks.0.")}


@pytest.mark.parametrize("attention", ["softmax", "seqnorm"])
def test_vit2d_matches_table1(attention):
    model = create_model("vit2d", attention=attention, num_classes=1)
    assert len(model.encoder.blocks) == 8
    assert model.patch_embed.weight.shape == (1024, 3, 16, 16)
    assert model.pos_embed.shape == (1, 1 + 14 * 14, 1024)
    shapes = block_shapes(model)
    assert shapes["encoder.blocks.0.attn.qkv.weight"] == (3 * 512, 1024)
    assert shapes["encoder.blocks.0.attn.proj.weight"] == (1024, 512)
    assert shapes["encoder.blocks.0.mlp.fc1.weight"] == (1024, 1024)
    assert shapes["encoder.blocks.0.mlp.fc2.weight"] == (1024, 1024)
    assert model.encoder.blocks[0].attn.num_heads == 8
    assert model.head.weight.shape == (1, 1024)


def test_vit3d_matches_table1():
    model = create_model("vit3d", attention="seqnorm")
    assert model.patch_embed.weight.shape == (1024, 1, 16, 16, 4)  # H x W x D patches, 1 channel
    assert len(model.encoder.blocks) == 8
    assert block_shapes(model)["encoder.blocks.0.attn.qkv.weight"] == (1536, 1024)
    assert block_shapes(model)["encoder.blocks.0.mlp.fc1.weight"] == (1024, 1024)


def test_vitwsi_matches_table1():
    model = create_model("vitwsi", attention="seqnorm")
    assert model.feature_proj.weight.shape == (512, 2048)
    assert len(model.encoder.blocks) == 2
    shapes = block_shapes(model)
    assert shapes["encoder.blocks.0.attn.qkv.weight"] == (1536, 512)
    assert shapes["encoder.blocks.0.mlp.fc1.weight"] == (512, 512)
    assert create_model("vitwsi", feature_dim=1024).feature_proj.weight.shape == (512, 1024)


def test_vit2d_built_at_224_runs_at_448_with_interpolated_positions():
    model = create_model("vit2d", attention="seqnorm", depth=1).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 448, 448)).shape == (1, 1)
        pos = model.position_embedding((28, 28))
    assert pos.shape == (1, 1 + 28 * 28, 1024)
    torch.testing.assert_close(pos[:, 0], model.pos_embed[:, 0])
    # Interpolating to the training grid reproduces the stored embedding.
    assert model.position_embedding(model.grid_size) is model.pos_embed


def test_3d_position_interpolation():
    model = create_model("vit3d_tiny")
    with torch.no_grad():
        assert model(torch.randn(1, 1, 32, 16, 8)).shape == (1, 1)


def test_vit_rejects_bad_input():
    model = create_model("vit2d_tiny")
    with pytest.raises(ValueError, match="divisible"):
        model(torch.randn(1, 1, 30, 32))
    with pytest.raises(ValueError, match="expected input"):
        model(torch.randn(1, 3, 32, 32))
    with pytest.raises(ValueError, match="spatial_dims"):
        VisionTransformer(spatial_dims=4)
    with pytest.raises(ValueError, match="unknown model"):
        create_model("vit9d")


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("readout", ["cls", "attention", "max"])
def test_wsi_padded_bags_equal_each_bag_alone(attention, readout):
    model = create_model("vitwsi_tiny", attention=attention, readout=readout).eval()
    torch.nn.init.normal_(model.head.weight, std=0.5)  # the max readout's head starts at zero
    bags = [torch.randn(1, n, 16) for n in (9, 4)]
    batch = torch.zeros(2, 9, 16)
    batch[0], batch[1, :4] = bags[0][0], bags[1][0]
    mask = torch.tensor([[True] * 9, [True] * 4 + [False] * 5])
    with torch.no_grad():
        out = model(batch, mask)
        for i, bag in enumerate(bags):
            torch.testing.assert_close(out[i], model(bag)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("readout", ["cls", "attention", "max"])
def test_wsi_without_positions_is_permutation_invariant(readout):
    model = create_model("vitwsi_tiny", attention="seqnorm", readout=readout).eval()
    torch.nn.init.normal_(model.head.weight, std=0.5)  # the max readout's head starts at zero
    bag = torch.randn(1, 20, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(bag[:, torch.randperm(20)]), model(bag), rtol=1e-5, atol=1e-5)


def test_wsi_sincos_positions_use_coordinates():
    model = create_model("vitwsi_tiny", attention="seqnorm", pos_encoding="sincos", coord_scale=256.0).eval()
    bag = torch.randn(1, 6, 16)
    coords = torch.randint(0, 10_000, (1, 6, 2)).float()
    with torch.no_grad():
        assert not torch.allclose(model(bag, coords=coords), model(bag, coords=coords.flip(1)))
    with pytest.raises(ValueError, match="coords"):
        model(bag)


@pytest.mark.parametrize("target", [n for n in ATTENTIONS if n != "softmax"])
def test_convert_attention_keeps_shared_weights_bit_identical(target):
    model = create_model("vit2d_tiny", attention="softmax")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fresh = convert_attention(model, target)
    after = model.state_dict()
    for key, tensor in before.items():
        assert torch.equal(after[key], tensor), key
    assert set(fresh) == set(after) - set(before)
    assert all(isinstance(b.attn, get_attention_class(target)) for b in model.encoder.blocks)


def test_convert_softmax_to_seqnorm_reports_the_norms():
    model = create_model("vit2d_tiny", attention="softmax")
    fresh = convert_attention(model, "seqnorm")
    assert len(fresh) == 2 * 3 * 2  # 2 blocks x (q, k, v)_norm x (weight, bias)
    assert model(torch.randn(1, 1, 32, 32)).shape == (1, 1)


def test_convert_needs_an_attention_module():
    with pytest.raises(ValueError, match="no medattn attention"):
        convert_attention(torch.nn.Linear(2, 2), "seqnorm")


def test_available_models_lists_table1_presets():
    assert {"vit2d", "vit3d", "vitwsi"} <= set(available_models())


def test_timm_vit_accepts_our_attention():
    timm = pytest.importorskip("timm")
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=2)
    for block in model.blocks:
        old = block.attn
        block.attn = convert_attention_module(old, "seqnorm")
    assert model(torch.randn(1, 3, 224, 224)).shape == (1, 2)


def test_monai_vit_accepts_our_attention():
    nets = pytest.importorskip("monai.networks.nets")
    model = nets.ViT(in_channels=1, img_size=(32, 32), patch_size=(8, 8), hidden_size=64, mlp_dim=128,
                     num_layers=2, num_heads=4, spatial_dims=2, classification=True, num_classes=2)
    for block in model.blocks:
        block.attn = build_attention("seqnorm", dim=64, num_heads=4)
    logits, _ = model(torch.randn(2, 1, 32, 32))
    assert logits.shape == (2, 2) and torch.isfinite(logits).all()
