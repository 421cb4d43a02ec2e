"""ViT-S/8 + convolutional decoder (BinaryFormer §3.1, App. A.1): shapes, parameter counts, the decoder's
locality, and initialisation from DINO/timm ViT-S/8 weights with the paper's keep choice.

Every mechanism through both presets (forward, backward, every parameter trained) is in
tests/models/test_contract_models.py, generated from the registries.
"""

from __future__ import annotations

import pytest
import torch
from test_pretrained import timm_state

from medattn.errors import UserError
from medattn.models import create_model
from medattn.models.pretrained import describe, load_pretrained
from medattn.models.segmentation.vit_seg import CellMix, parameter_counts


def test_tiny_twin_maps_images_to_per_pixel_logits_at_any_multiple_of_the_patch():
    torch.manual_seed(0)
    model = create_model("vit_s8_seg_tiny", num_classes=5).eval()
    assert model(torch.randn(2, 1, 64, 64)).shape == (2, 5, 64, 64)
    assert model(torch.randn(1, 1, 48, 80)).shape == (1, 5, 48, 80)  # positions interpolated
    with pytest.raises(ValueError, match="divisible by the patch size"):
        model(torch.randn(1, 1, 60, 64))


def test_a_volume_is_segmented_slice_by_slice_along_its_last_axis():
    torch.manual_seed(0)
    model = create_model("vit_s8_seg_tiny", num_classes=3).eval()
    model.slice_chunk = 4  # 2 volumes x 5 slices in chunks of 4, 4, 2
    volume = torch.randn(2, 1, 16, 24, 5)
    out = model(volume)
    assert out.shape == (2, 3, 16, 24, 5)
    with torch.no_grad():
        for s in (0, 3, 4):
            torch.testing.assert_close(out[..., s], model(volume[..., s]), rtol=1e-5, atol=1e-5)


def test_full_preset_has_the_papers_widths_and_parameter_counts():
    with torch.device("meta"):
        model = create_model("vit_s8_seg")
    D, blocks, mlp, heads, dv, n = 384, 12, 1536, 6, 16, (320 // 8) ** 2
    attention = D * (2 * D + heads * dv) + (2 * D + heads * dv) + heads * dv * D + D  # qkv, proj
    block = 4 * D + attention + D * mlp + mlp + mlp * D + D  # norm1, norm2, attn, fc1, fc2
    encoder = (64 * D + D) + D + (1 + n) * D + blocks * block + 2 * D  # patch, cls, positions, blocks, norm
    decoder = D * 1024 + 1024  # expand
    for c in (1024, 512, 256):  # transposed conv (no bias), BatchNorm, 2x2-cell mix
        decoder += c * (c // 2) * 4 + 2 * (c // 2) + (2 * c) ** 2 + 2 * c
    decoder += 128 * 128 * 9 + 2 * 128 + 128 * 4 * 9 + 4  # two 3x3 convolutions, BatchNorm between
    counts = parameter_counts(model)
    assert counts == {"encoder": encoder, "decoder": decoder}
    assert round(counts["encoder"] / 1e6, 1) == 19.3 and round(counts["decoder"] / 1e6, 1) == 8.8  # paper: 19M, 8M
    assert model.encoder.blocks[0].attn.value_dim == 16 and model.encoder.blocks[0].attn.head_dim == 64
    assert not hasattr(model, "head")  # no classification head is built
    with torch.device("meta"):
        wide_values = create_model("vit_s8_seg", value_dim=None)
    assert parameter_counts(wide_values)["encoder"] - encoder == blocks * heads * (64 - dv) * (2 * D + 1)  # v, proj


def test_cell_mix_only_mixes_pixels_of_one_2x2_cell():
    torch.manual_seed(0)
    mix = CellMix(3).double()
    x = torch.randn(1, 3, 6, 6, dtype=torch.float64, requires_grad=True)
    mix(x)[0, :, 2, 3].sum().backward()  # pixel (2, 3) lies in the cell rows 2-3, columns 2-3
    touched = x.grad[0].abs().sum(0) > 0
    expected = torch.zeros(6, 6, dtype=torch.bool)
    expected[2:4, 2:4] = True
    assert torch.equal(touched, expected)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="power of two"):
        create_model("vit_s8_seg_tiny", patch_size=6)
    with pytest.raises(ValueError, match="value_dim"):
        create_model("vit_s8_seg_tiny", value_dim=8, attention_kwargs={"value_dim": 4})
    with pytest.raises(ValueError, match="pretrained_keep"):
        create_model("vit_s8_seg_tiny", pretrained_keep="some")
    with pytest.raises(ValueError, match="background"):
        create_model("vit_s8_seg_tiny", num_classes=1)


DIM, MLP, DEPTH = 32, 64, 12  # ViT-S/8's names and depth, narrow widths (shapes follow the names' rules)


def small_s8(**kwargs):
    torch.manual_seed(0)
    return create_model("vit_s8_seg_tiny", **{"embed_dim": DIM, "mlp_dim": MLP, "depth": DEPTH, "num_heads": 4,
                                              "value_dim": 4, **kwargs})


def dino_checkpoint(state: dict) -> dict:
    """DINO's training checkpoint: backbone and projection head under ``teacher`` and ``student``."""
    head = {"head.mlp.0.weight": torch.randn(48, DIM), "head.last_layer.weight_g": torch.ones(1, 8)}
    wrapped = {**{f"backbone.{k}": v for k, v in state.items()}, **head}
    return {"teacher": wrapped, "student": wrapped, "epoch": 100}


KEPT = {"patch_embed.weight", "patch_embed.bias", "pos_embed", "cls_token",
        *[f"encoder.blocks.{i}.{part}" for i in range(4) for part in
          ("norm2.weight", "norm2.bias", "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias")]}


@pytest.mark.parametrize("form", ["dino_bare", "dino_checkpoint", "timm"])
def test_vit_s8_weights_keep_patch_embedding_and_early_mlps_only(form):
    # DINO's ViT-S/8 file (dino_deitsmall8_pretrain.pth) has timm's names, 3 channels, a 28 x 28 grid, no head
    state = timm_state(depth=DEPTH, dim=DIM, mlp=MLP, patch=8, grid=28, num_classes=1000 if form == "timm" else 0)
    source = dino_checkpoint(state) if form == "dino_checkpoint" else state
    model = small_s8()
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    report = load_pretrained(model, source)  # the preset's keep choice: "binaryformer"

    own = model.state_dict()
    assert set(report["loaded"]) | set(report["adapted"]) == KEPT
    for i in range(4):
        for part in ("mlp.fc1.weight", "mlp.fc2.bias", "norm2.weight"):
            assert torch.equal(own[f"encoder.blocks.{i}.{part}"], state[f"blocks.{i}.{part}"])
    assert torch.equal(own["patch_embed.weight"], state["patch_embed.proj.weight"].sum(1, keepdim=True))  # grey
    assert own["pos_embed"].shape == (1, 1 + 8 * 8, DIM)  # 28 x 28 grid interpolated to 64 / 8
    new = set(own) - KEPT
    assert set(report["new"]) == new
    assert all(torch.equal(own[k], fresh[k]) for k in new)
    not_kept = set(report["not_kept"])
    assert {k for k in new if ".attn." in k or ".norm1." in k} <= not_kept  # every block's attention
    assert {f"encoder.blocks.{i}.mlp.fc1.weight" for i in range(4, DEPTH)} <= not_kept
    assert not any(k.startswith("decoder.") for k in not_kept)  # the decoder is new, not left out
    dropped = set(report["dropped"])
    assert {f"blocks.{i}.attn.qkv.weight" for i in range(DEPTH)} <= dropped  # value width differs: unused
    assert "blocks.7.mlp.fc1.weight" in dropped and "blocks.2.mlp.fc1.weight" not in dropped
    assert ("head.weight" in dropped) == (form == "timm")
    assert ("head.mlp.0.weight" in dropped) == (form == "dino_checkpoint")  # DINO's projection head
    assert f"{len(report['not_kept'])} left out by the keep choice" in describe(report)


def test_keep_choice_all_or_patterns_and_shape_checks_where_kept():
    state = timm_state(depth=DEPTH, dim=DIM, mlp=MLP, patch=8, grid=28, num_classes=0)
    model = small_s8(value_dim=None, pretrained_keep="all")  # timm's value width: every tensor fits
    report = load_pretrained(model, state)
    assert report["not_kept"] == [] and all(k.startswith("decoder.") for k in report["new"])
    assert torch.equal(model.state_dict()["encoder.blocks.11.attn.qkv.weight"], state["blocks.11.attn.qkv.weight"])

    model = small_s8()
    report = load_pretrained(model, state, keep=["patch_embed.*"])  # an explicit list wins over the preset's
    assert set(report["loaded"]) | set(report["adapted"]) == {"patch_embed.weight", "patch_embed.bias"}
    with pytest.raises(UserError, match="attn.qkv.weight has shape"):  # narrowed values cannot take DINO's qkv
        load_pretrained(small_s8(), state, keep="all")
