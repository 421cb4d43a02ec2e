"""Starting a ViT from timm, DINO, MAE or MONAI weights (issue 10), offline.

State dicts are written here with each family's exact names and shapes (timm
``timm/models/vision_transformer.py``, DINO/DINOv2 ``vision_transformer.py``, MAE ``models_mae.py``; MONAI's
are taken from an instantiated ``monai.networks.nets.ViT``) and random values.
"""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from medattn.errors import UserError
from medattn.models import convert_attention, create_model
from medattn.models.pretrained import load_pretrained
from medattn.models.vit import resample_position_embedding

DIM, MLP, DEPTH = 32, 64, 2  # vit2d_tiny's widths


def timm_state(depth=DEPTH, dim=DIM, mlp=MLP, patch=8, grid=4, in_chans=3, num_classes=1000,
               class_position=True, layer_scale=False, seed=0) -> dict[str, torch.Tensor]:
    """A timm ``VisionTransformer`` state dict (names and shapes of timm's vision_transformer.py)."""
    gen = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=gen)

    state = {"cls_token": r(1, 1, dim), "pos_embed": r(1, grid * grid + class_position, dim),
             "patch_embed.proj.weight": r(dim, in_chans, patch, patch), "patch_embed.proj.bias": r(dim)}
    for i in range(depth):
        b = f"blocks.{i}."
        state.update({b + "norm1.weight": r(dim), b + "norm1.bias": r(dim),
                      b + "attn.qkv.weight": r(3 * dim, dim), b + "attn.qkv.bias": r(3 * dim),
                      b + "attn.proj.weight": r(dim, dim), b + "attn.proj.bias": r(dim),
                      b + "norm2.weight": r(dim), b + "norm2.bias": r(dim),
                      b + "mlp.fc1.weight": r(mlp, dim), b + "mlp.fc1.bias": r(mlp),
                      b + "mlp.fc2.weight": r(dim, mlp), b + "mlp.fc2.bias": r(dim)})
        if layer_scale:
            state.update({b + "ls1.gamma": r(dim), b + "ls2.gamma": r(dim)})
    state.update({"norm.weight": r(dim), "norm.bias": r(dim)})
    if num_classes:
        state.update({"head.weight": r(num_classes, dim), "head.bias": r(num_classes)})
    return state


def ours(key: str) -> str:
    """timm name -> our name."""
    if key.startswith(("blocks.", "norm.")):
        return "encoder." + key
    return key.replace("patch_embed.proj.", "patch_embed.")


def tiny(**kwargs):
    torch.manual_seed(0)
    return create_model("vit2d_tiny", **{"in_chans": 3, **kwargs})


@pytest.mark.parametrize("form", ["safetensors", "pth", "dict"])
def test_timm_weights_land_bit_identically(tmp_path, form):
    state = timm_state()
    source = state
    if form == "safetensors":
        save_file(state, tmp_path / "vit.safetensors")
        source = tmp_path / "vit.safetensors"
    elif form == "pth":
        torch.save({"state_dict": state, "epoch": 3}, tmp_path / "vit.pth")  # a timm training checkpoint
        source = tmp_path / "vit.pth"
    model = tiny()
    fresh_head = model.head.weight.detach().clone()
    report = load_pretrained(model, source)

    own = model.state_dict()
    body = [k for k in state if not k.startswith("head.")]
    for key in body:
        assert torch.equal(own[ours(key)], state[key]), key
    assert report["family"] == "timm"
    assert sorted(report["loaded"]) == sorted(ours(k) for k in body) and report["adapted"] == []
    assert report["new"] == ["head.weight", "head.bias"] and sorted(report["dropped"]) == ["head.bias", "head.weight"]
    assert torch.equal(model.head.weight, fresh_head)  # 1000 ImageNet classes do not fit one logit


def test_a_head_of_the_same_shape_loads():
    state = timm_state(num_classes=1)
    report = load_pretrained(tiny(), state)
    assert "head.weight" in report["loaded"] and report["new"] == [] and report["dropped"] == []


def test_grey_images_with_another_patch_size_and_grid():
    """3 -> 1 channel (kernels summed), patch 8 -> 4 (kernel resized), grid 4x4 -> 8x8 (positions interpolated)."""
    state = timm_state(patch=8, grid=4)
    model = tiny(in_chans=1, patch_size=4)  # 32 px: grid 8 x 8
    report = load_pretrained(model, state)
    assert sorted(report["adapted"]) == ["patch_embed.weight", "pos_embed"]
    assert "kernels summed" in report["how"]["patch_embed.weight"]
    assert "interpolated" in report["how"]["pos_embed"]

    summed = state["patch_embed.proj.weight"].sum(dim=1, keepdim=True)
    expected = F.interpolate(summed, size=(4, 4), mode="bilinear", align_corners=False) * (64 / 16)
    torch.testing.assert_close(model.patch_embed.weight.detach(), expected, rtol=0, atol=0)
    pos = model.pos_embed.detach()
    assert torch.equal(pos[:, 0], state["pos_embed"][:, 0])  # the class token's position is kept
    torch.testing.assert_close(pos, resample_position_embedding(state["pos_embed"], (4, 4), (8, 8)), rtol=0, atol=0)


def test_summed_kernels_see_a_grey_image_as_the_rgb_model_saw_it_repeated():
    state = timm_state(patch=8, grid=4)
    model = tiny(in_chans=1)
    load_pretrained(model, state)
    grey = torch.randn(2, 1, 32, 32)
    rgb = F.conv2d(grey.repeat(1, 3, 1, 1), state["patch_embed.proj.weight"], state["patch_embed.proj.bias"], stride=8)
    torch.testing.assert_close(model.patch_embed(grey), rgb, rtol=1e-5, atol=1e-5)


def test_a_resized_kernel_keeps_the_embedding_of_a_constant_patch():
    state = timm_state(patch=8, grid=4)
    state["patch_embed.proj.weight"] = torch.randn(DIM, 3, 1, 1).expand(DIM, 3, 8, 8).contiguous()  # constant kernels
    model = tiny(patch_size=4)
    load_pretrained(model, state)
    flat = torch.full((1, 3, 8, 8), 0.7)
    original = F.conv2d(flat, state["patch_embed.proj.weight"], state["patch_embed.proj.bias"])[:, :, 0, 0]
    # values ~100: float32 rounding of 192-term sums
    torch.testing.assert_close(model.patch_embed(flat).mean(dim=(2, 3)), original, rtol=1e-5, atol=1e-3)


def test_dino_checkpoint_backbone_only(tmp_path):
    """DINO's training checkpoint: {'teacher': {'backbone.*', 'head.*' (projection head)}, ...}; no classifier."""
    backbone = {f"backbone.{k}": v for k, v in timm_state(num_classes=0).items()}
    projection = {"head.mlp.0.weight": torch.randn(64, DIM), "head.last_layer.weight_g": torch.randn(256, 1)}
    torch.save({"teacher": {**backbone, **projection}, "epoch": 100}, tmp_path / "dino.pth")
    model = tiny()
    report = load_pretrained(model, tmp_path / "dino.pth")
    assert report["family"] == "dino"
    assert report["dropped"] == list(projection) and report["new"] == ["head.weight", "head.bias"]
    assert torch.equal(model.encoder.blocks[1].mlp.fc2.weight, backbone["backbone.blocks.1.mlp.fc2.weight"])


def test_dinov2_layer_scale_is_folded_and_mask_token_dropped():
    state = {**timm_state(num_classes=0, layer_scale=True), "mask_token": torch.randn(1, DIM)}
    model = tiny()
    report = load_pretrained(model, state)
    assert report["family"] == "dino" and report["dropped"] == ["mask_token"]
    gamma1, gamma2 = state["blocks.0.ls1.gamma"], state["blocks.0.ls2.gamma"]
    block = model.encoder.blocks[0]
    torch.testing.assert_close(block.attn.proj.weight, gamma1[:, None] * state["blocks.0.attn.proj.weight"])
    torch.testing.assert_close(block.attn.proj.bias, gamma1 * state["blocks.0.attn.proj.bias"])
    torch.testing.assert_close(block.mlp.fc2.weight, gamma2[:, None] * state["blocks.0.mlp.fc2.weight"])
    assert {"encoder.blocks.0.attn.proj.weight", "encoder.blocks.1.mlp.fc2.bias"} <= set(report["adapted"])
    assert "layer scale" in report["how"]["encoder.blocks.0.attn.proj.weight"]


def test_mae_decoder_is_dropped(tmp_path):
    """MAE's checkpoint {'model': ...}: encoder in timm's names, decoder_* and mask_token (1, 1, D_dec)."""
    dec = 16
    decoder = {"mask_token": torch.randn(1, 1, dec), "decoder_embed.weight": torch.randn(dec, DIM),
               "decoder_embed.bias": torch.randn(dec), "decoder_pos_embed": torch.randn(1, 17, dec),
               "decoder_blocks.0.attn.qkv.weight": torch.randn(3 * dec, dec), "decoder_norm.weight": torch.randn(dec),
               "decoder_pred.weight": torch.randn(8 * 8 * 3, dec)}
    torch.save({"model": {**timm_state(num_classes=0), **decoder}}, tmp_path / "mae.pth")
    report = load_pretrained(tiny(), tmp_path / "mae.pth")
    assert report["family"] == "mae" and sorted(report["dropped"]) == sorted(decoder)


@pytest.mark.parametrize("qkv_bias", [True, False])
def test_monai_vit_gives_the_same_logits(qkv_bias):
    """MONAI's ViT, its state dict loaded into ours: the same function (no class position -> zero)."""
    nets = pytest.importorskip("monai.networks.nets")
    torch.manual_seed(0)
    monai_vit = nets.ViT(in_channels=1, img_size=(32, 32), patch_size=(8, 8), hidden_size=DIM, mlp_dim=MLP,
                         num_layers=DEPTH, num_heads=2, spatial_dims=2, classification=True, num_classes=2,
                         post_activation=None, qkv_bias=qkv_bias).eval()
    model = tiny(in_chans=1, num_classes=2).eval()
    report = load_pretrained(model, monai_vit.state_dict())
    assert report["family"] == "monai"
    assert report["dropped"] == [f"blocks.{i}.norm_cross_attn.{k}" for i in range(DEPTH) for k in ("weight", "bias")]
    assert report["how"]["pos_embed"].startswith("class-token position set to zero")
    zero_bias = [k for k in report["adapted"] if k.endswith("qkv.bias")]
    assert len(zero_bias) == (0 if qkv_bias else DEPTH) and report["new"] == []
    x = torch.randn(3, 1, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), monai_vit(x)[0], rtol=1e-5, atol=1e-5)


def test_monai_3d_needs_its_grid_when_not_a_cube():
    nets = pytest.importorskip("monai.networks.nets")
    monai_vit = nets.ViT(in_channels=1, img_size=(32, 32, 16), patch_size=(8, 8, 8), hidden_size=DIM, mlp_dim=MLP,
                         num_layers=DEPTH, num_heads=2, spatial_dims=3)  # grid 4 x 4 x 2
    model = create_model("vit3d_tiny", img_size=(32, 32, 16))  # patch (8, 8, 4): grid 4 x 4 x 4
    with pytest.raises(UserError, match="holds 32 patch positions, not a cube; give source_grid"):
        load_pretrained(model, monai_vit.state_dict())
    report = load_pretrained(model, monai_vit.state_dict(), source_grid=(4, 4, 2))
    assert {"pos_embed", "patch_embed.weight"} <= set(report["adapted"])
    assert "cls_token" in report["new"]  # classification=False: MONAI's ViT has no class token
    assert model.patch_embed.weight.shape == (DIM, 1, 8, 8, 4)


def test_loads_into_any_mechanism_like_convert_attention():
    """A SeqNorm model gets the shared tensors bit for bit; its norms are new, as convert_attention leaves them."""
    state = timm_state()
    seqnorm = tiny(attention="seqnorm")
    report = load_pretrained(seqnorm, state)
    softmax = tiny()
    load_pretrained(softmax, state)
    fresh = convert_attention(softmax, "seqnorm")
    assert sorted(report["new"]) == sorted(fresh + ["head.weight", "head.bias"])
    converted = softmax.state_dict()
    for key, tensor in seqnorm.state_dict().items():
        if key not in report["new"]:
            assert torch.equal(tensor, converted[key]), key


@pytest.mark.parametrize("change, message", [
    (dict(depth=3), r"tensor blocks\.2\.\S+ has no place in the model \(the weights have 3 blocks, the "
                    r"model 2; set model.kwargs.depth to match\)"),
    (dict(depth=1), r"has no tensor for the model's encoder\.blocks\.1\.norm1\.weight \(the weights have 1 blocks"),
    (dict(dim=48), r"tensor cls_token has shape \[1, 1, 48\], the model's cls_token expects \[1, 1, 32\]"),
    (dict(mlp=128), r"tensor blocks\.0\.mlp\.fc1\.weight has shape \[128, 32\], the model's "
                    r"encoder\.blocks\.0\.mlp\.fc1\.weight expects \[64, 32\]"),
])
def test_mismatched_architecture_is_one_line_naming_the_tensor(tmp_path, change, message):
    save_file(timm_state(**change), tmp_path / "vit.safetensors")
    model = tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(UserError, match=message) as error:
        load_pretrained(model, tmp_path / "vit.safetensors")
    assert "\n" not in str(error.value) and str(tmp_path / "vit.safetensors") in str(error.value)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # nothing written


@pytest.mark.parametrize("stem", ["conv", "residual"])
def test_a_patch_embedding_into_the_conv_stem_is_one_line_naming_the_fix(tmp_path, stem):
    save_file(timm_state(), tmp_path / "vit.safetensors")
    with pytest.raises(UserError, match=r"vit.safetensors: holds a patch embedding, but the model starts with a "
                                        r"convolutional stem .* set model.kwargs.stem=patch"):
        load_pretrained(tiny(stem=stem), tmp_path / "vit.safetensors")


def test_files_that_are_not_plain_weights_are_refused(tmp_path):
    torch.save({"model": argparse.Namespace(lr=1)}, tmp_path / "pickled.pth")  # needs a global: code could run
    with pytest.raises(UserError, match=r"pickled.pth: not a plain weights file \(torch.load with weights_only=True"):
        load_pretrained(tiny(), tmp_path / "pickled.pth")
    torch.save({"epoch": 3, "lr": 0.1}, tmp_path / "nostate.pth")
    with pytest.raises(UserError, match="nostate.pth: holds no state dict"):
        load_pretrained(tiny(), tmp_path / "nostate.pth")
    (tmp_path / "junk.pth").write_bytes(b"not a torch file")
    with pytest.raises(UserError, match="junk.pth: unreadable PyTorch weights file"):
        load_pretrained(tiny(), tmp_path / "junk.pth")
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(UserError, match="junk.safetensors: unreadable safetensors file"):
        load_pretrained(tiny(), tmp_path / "junk.safetensors")
    with pytest.raises(UserError, match="no such weights file"):
        load_pretrained(tiny(), tmp_path / "missing.pth")
    with pytest.raises(UserError, match="not recognised as timm, DINO, MAE or MONAI ViT weights"):
        load_pretrained(tiny(), {"fc.weight": torch.zeros(2, 2)})
    with pytest.raises(UserError, match="family: unknown 'clip'"):
        load_pretrained(tiny(), timm_state(), family="clip")
    with pytest.raises(UserError, match="family 'monai' does not match"):
        load_pretrained(tiny(), timm_state(), family="monai")
    with pytest.raises(UserError, match="into a VisionTransformer, not a ResNet"):
        load_pretrained(create_model("resnet2d_tiny"), timm_state())


def test_without_a_class_position_the_grid_is_the_square_root():
    """timm's no_embed_class: pos_embed (1, N, D); the class token gets position zero."""
    state = timm_state(class_position=False)
    model = tiny()
    report = load_pretrained(model, state)
    assert torch.equal(model.pos_embed[0, 0], torch.zeros(DIM))
    assert torch.equal(model.pos_embed[:, 1:], state["pos_embed"]) and "pos_embed" in report["adapted"]
    assert math.isqrt(state["pos_embed"].shape[1]) ** 2 == state["pos_embed"].shape[1]


def test_train_init_from_a_timm_weights_file(tmp_path, capsys):
    """`medattn train --init-from vit.safetensors`: the run prints the report, results.json keeps it."""
    from medattn.cli import main

    save_file(timm_state(), tmp_path / "vit.safetensors")  # RGB, patch 8, grid 4: the tiny preset's grey 32 px
    argv = ["train", "synthetic_cxr", "data.image_size=32", "data.num_samples=[16, 8, 8]", "model.name=vit2d_tiny",
            "model.attention=seqnorm", "train.epochs=1", "train.batch_size=8", "eval.bootstrap=20", "train.threads=1",
            "--no-progress", "--out", str(tmp_path / "run"), "--init-from", str(tmp_path / "vit.safetensors")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "initialised from" in out and "timm weights:" in out and "patch_embed.weight: input channels 3 -> 1" in out
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    report = results["init_from"]
    assert report["family"] == "timm" and "encoder.blocks.0.attn.q_norm.weight" in report["new"]

    torch.save({"model": argparse.Namespace(lr=1)}, tmp_path / "pickled.pth")
    argv[argv.index("--out") + 1] = str(tmp_path / "run2")
    argv[-1] = str(tmp_path / "pickled.pth")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a plain weights file" in err[0]
