"""Baselines (issue 10): the small ResNet and gated attention-MIL, alone and through the training loop."""

from __future__ import annotations

import csv

import pytest
import torch

from engine_data import bag_bundle, image_bundle, tiny_config
from medattn.data.base import TaskInfo
from medattn.errors import UserError
from medattn.models import AttentionMIL, ResNet, create_model, input_contract
from medattn.runtime.build import build_model
from medattn.train import fit


def test_gated_attention_follows_ilse_et_al():
    """a_k = softmax_k(w^T (tanh(V h_k) * sigmoid(U h_k))), h_k = ReLU(W x_k + b), logits = head(sum a_k h_k)."""
    torch.manual_seed(0)
    model = AttentionMIL(feature_dim=6, embed_dim=5, attn_dim=4).double()
    x = torch.randn(1, 7, 6, dtype=torch.float64)
    h = torch.relu(x[0] @ model.embed.weight.T + model.embed.bias)  # (7, 5)
    v = torch.tanh(h @ model.attention_v.weight.T + model.attention_v.bias)
    u = torch.sigmoid(h @ model.attention_u.weight.T + model.attention_u.bias)
    a = torch.softmax((v * u) @ model.attention_w.weight[0], dim=0)  # (7,)
    expected = (a @ h) @ model.head.weight.T + model.head.bias
    torch.testing.assert_close(model(x)[0], expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(model.attention_weights(x)[0], a, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("padding", [0.0, 1e6, float("nan")])
def test_a_padded_bag_equals_the_bag_alone(padding):
    """Padding (whatever it holds) changes neither the logits, the attention nor the gradients."""
    torch.manual_seed(0)
    model = AttentionMIL(feature_dim=8, embed_dim=16, attn_dim=8).double()
    bag = torch.randn(1, 5, 8, dtype=torch.float64)
    padded = torch.cat([bag, torch.full((1, 3, 8), padding, dtype=torch.float64)], dim=1)
    mask = torch.tensor([[True] * 5 + [False] * 3])

    alone = model(bag)
    grads_alone = torch.autograd.grad(alone.sum(), list(model.parameters()))
    with_padding = model(padded, mask=mask)
    grads_padded = torch.autograd.grad(with_padding.sum(), list(model.parameters()))
    torch.testing.assert_close(with_padding, alone, rtol=1e-13, atol=1e-13)
    for g_pad, g_alone in zip(grads_padded, grads_alone, strict=True):
        torch.testing.assert_close(g_pad, g_alone, rtol=1e-12, atol=1e-13)
    a = model.attention_weights(padded, mask)
    assert (a[0, 5:] == 0).all() and torch.isclose(a.sum(), torch.tensor(1.0, dtype=torch.float64))


def test_a_batch_of_bags_equals_each_bag_alone_and_order_does_not_matter():
    torch.manual_seed(1)
    model = AttentionMIL(feature_dim=8, embed_dim=16, attn_dim=8).double().eval()
    bags = [torch.randn(n, 8, dtype=torch.float64) for n in (3, 6)]
    batch = torch.zeros(2, 6, 8, dtype=torch.float64)
    mask = torch.zeros(2, 6, dtype=torch.bool)
    for i, bag in enumerate(bags):
        batch[i, : len(bag)], mask[i, : len(bag)] = bag, True
    out = model(batch, mask=mask, coords=torch.zeros(2, 6, 2))
    for i, bag in enumerate(bags):
        torch.testing.assert_close(out[i], model(bag[None])[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(model(bag.flip(0)[None]), model(bag[None]), rtol=1e-12, atol=1e-12)


def test_mil_rejects_bad_bags():
    model = AttentionMIL(feature_dim=8)
    with pytest.raises(ValueError, match="expected features"):
        model(torch.randn(2, 5, 9))
    with pytest.raises(ValueError, match="mask shape"):
        model(torch.randn(2, 5, 8), mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="at least one real instance"):
        model(torch.randn(2, 5, 8), mask=torch.tensor([[True] * 5, [False] * 5]))


@pytest.mark.parametrize("name, shape, features", [
    ("resnet2d_tiny", (2, 1, 32, 32), (2, 32)),
    ("resnet3d_tiny", (2, 1, 16, 16, 8), (2, 32)),
    ("resnet2d", (1, 3, 64, 64), (1, 512)),
])
def test_resnet_shapes(name, shape, features):
    model = create_model(name, num_classes=3).eval()
    x = torch.randn(*shape)
    assert model.forward_features(x).shape == features and model(x).shape == (shape[0], 3)


def test_resnet_stages_halve_the_resolution():
    model = ResNet(in_chans=1, widths=(4, 8, 16), depths=(1, 2, 1), stem_kernel=3, stem_stride=1, stem_pool=False)
    sizes = []
    x = model.stem(torch.randn(1, 1, 32, 32))
    for stage in model.stages:
        x = stage(x)
        sizes.append(tuple(x.shape[1:]))
    assert sizes == [(4, 32, 32), (8, 16, 16), (16, 8, 8)]
    assert len(model.stages[1]) == 2


def test_the_hybrid_vits_residual_stem_is_the_small_resnets_trunk():
    """stem="residual" on vit2d_small (64 px, patch 8, width 128): resnet2d_small's stem and four stages, tensor for
    tensor in shape, then a 1x1 projection; on an anisotropic 3D patch it halves only the axes still to cover."""
    vit = create_model("vit2d_small", stem="residual")
    resnet = create_model("resnet2d_small")
    trunk = [p.shape for p in [*resnet.stem.parameters(), *resnet.stages.parameters()]]
    assert [p.shape for p in vit.patch_embed.stem.parameters()] == trunk
    assert vit.patch_embed(torch.randn(2, 1, 64, 64)).shape == (2, 128, 8, 8)
    vit3d = create_model("vit3d_small", stem="residual")
    assert vit3d.patch_embed(torch.randn(1, 1, 32, 32, 16)).shape == (1, 128, 4, 4, 4)
    with pytest.raises(ValueError, match="power-of-two"):
        create_model("vit2d_small", stem="residual", patch_size=6, img_size=60)


def test_resnet_rejects_bad_arguments_and_inputs():
    with pytest.raises(ValueError, match="widths and depths"):
        ResNet(widths=(8, 16), depths=(1,))
    with pytest.raises(ValueError, match="spatial_dims"):
        ResNet(spatial_dims=4)
    with pytest.raises(ValueError, match=r"expected input \(B, 1, \*, \*, \*\)"):
        create_model("resnet3d_tiny")(torch.randn(1, 1, 16, 16))


def test_models_declare_their_input_contract():
    assert input_contract("abmil") == input_contract("vitwsi") == "bag"
    assert input_contract("resnet2d") == input_contract("vit2d") == input_contract("unet3d") == "image"
    with pytest.raises(ValueError, match="unknown model"):
        input_contract("nope")


def test_training_builds_baselines_from_the_task():
    bag = build_model({"name": "abmil_tiny", "attention": None}, TaskInfo("binary", "bag", 1, (24,)))
    assert isinstance(bag, AttentionMIL) and bag.feature_dim == 24
    image = build_model({"name": "resnet2d_tiny", "attention": None}, TaskInfo("multiclass", "image2d", 4, (3, 32, 32)))
    assert image.in_chans == 3 and image.num_classes == 4
    with pytest.raises(UserError, match="model 'abmil_tiny' takes feature bags but the data gives image2d"):
        build_model({"name": "abmil_tiny", "attention": None}, TaskInfo("binary", "image2d", 1, (1, 32, 32)))
    with pytest.raises(UserError, match="^model.attention: model 'resnet2d_tiny' has no attention mechanism"):
        build_model({"name": "resnet2d_tiny", "attention": "softmax"}, TaskInfo("binary", "image2d", 1, (1, 32, 32)))


@pytest.mark.parametrize("name, bundle", [("resnet2d_tiny", image_bundle(48)), ("abmil_tiny", bag_bundle(32))])
def test_baselines_learn_through_the_training_loop(tmp_path, name, bundle):
    """Each baseline trains (loss falls) and is evaluated by the same fit() as the ViTs."""
    config = tiny_config(f"model.name={name}", "model.attention=null", "train.epochs=3", "train.lr=3e-3")
    results = fit(config, bundle, tmp_path / name, progress=False, log=lambda m: None)
    losses = [float(r["train_loss"]) for r in csv.DictReader(open(tmp_path / name / "metrics.csv"))]
    assert losses[-1] < losses[0]
    assert results["val_auroc"] > 0.7 and results["test"]["auroc"] is not None


@pytest.mark.parametrize("padding", [0.0, 1e6, float("nan")])
def test_transmil_padded_bag_equals_the_bag_alone(padding):
    """TransMIL-style: a bag padded into a batch gives its own logits and gradients (bag by bag)."""
    torch.manual_seed(0)
    model = create_model("transmil_tiny", feature_dim=8).double()
    bags = [torch.randn(1, n, 8, dtype=torch.float64) for n in (5, 7)]
    batch = torch.cat([torch.cat([bags[0], torch.full((1, 2, 8), padding, dtype=torch.float64)], 1), bags[1]])
    mask = torch.tensor([[True] * 5 + [False] * 2, [True] * 7])
    alone = torch.cat([model(b) for b in bags])
    grads_alone = torch.autograd.grad(alone.sum(), list(model.parameters()))
    together = model(batch, mask=mask)
    grads_together = torch.autograd.grad(together.sum(), list(model.parameters()))
    torch.testing.assert_close(together, alone, rtol=1e-12, atol=1e-12)
    for g_together, g_alone in zip(grads_together, grads_alone, strict=True):
        torch.testing.assert_close(g_together, g_alone, rtol=1e-11, atol=1e-12)


def test_transmil_squares_the_bag_with_its_first_instances():
    """5 instances fill a 3 x 3 grid with instances 0-3 repeated: the logits equal those of the 9-instance bag
    written out by hand (TransMIL's padding), and an equal-size batch runs as one."""
    torch.manual_seed(1)
    model = create_model("transmil_tiny", feature_dim=8).double().eval()
    bag = torch.randn(1, 5, 8, dtype=torch.float64)
    written_out = torch.cat([bag, bag[:, :4]], dim=1)  # 9 = 3^2 instances: nothing more is added
    torch.testing.assert_close(model(bag), model(written_out), rtol=1e-12, atol=1e-12)
    two = torch.randn(2, 6, 8, dtype=torch.float64)
    torch.testing.assert_close(model(two), torch.cat([model(two[:1]), model(two[1:])]), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name, shape", [("swin2d_tiny", (2, 1, 32, 32)), ("swin3d_tiny", (2, 1, 32, 32, 16))])
def test_swin_head_reads_monais_encoder_and_builds_on_the_meta_device(name, shape):
    """The Swin baseline is MONAI's SwinTransformer followed by mean pooling, LayerNorm and a linear head."""
    torch.manual_seed(0)
    model = create_model(name).eval()
    x = torch.randn(shape)
    with torch.no_grad():
        last = model.encoder(x)[-1]
        expected = model.head(model.norm(last.flatten(2).mean(-1)))
        torch.testing.assert_close(model(x), expected)
    with torch.device("meta"):  # how checkpoints are checked before loading (runtime.trained)
        shapes = {k: v.shape for k, v in create_model(name).state_dict().items()}
    assert shapes == {k: v.shape for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="expected input"):
        model(torch.randn(2, 3, *shape[2:]))
    with pytest.raises(ValueError, match="one entry for each"):
        create_model(name, depths=(1, 1))


@pytest.mark.parametrize("name, shape", [("swin2d_small", (2, 1, 64, 64)), ("swin3d_small", (2, 1, 32, 32, 16))])
def test_small_swin_is_a_hybrid_of_the_resnet_trunk_and_shifted_window_blocks(name, shape):
    """swin*_small: the small ResNet's trunk makes the tokens, one stage of MONAI's Swin blocks (windows, every
    other block shifted, no merging) attends over them, the head reads their mean (issue 40)."""
    from monai.networks.nets.swin_unetr import BasicLayer

    from medattn.models.resnet import ResidualStem

    torch.manual_seed(0)
    model = create_model(name).eval()
    assert isinstance(model.patch_embed, ResidualStem) and isinstance(model.blocks, BasicLayer)
    assert len(model.blocks.blocks) == 4 and not hasattr(model, "encoder")
    grid = (8, 8) if len(shape) == 4 else (4, 4, 4)
    assert model.blocks.window_size == ((4, 4) if len(shape) == 4 else (2, 2, 2))
    assert [blk.shift_size for blk in model.blocks.blocks][:2] == [(0,) * len(grid), tuple(w // 2 for w in
                                                                                         model.blocks.window_size)]
    x = torch.randn(shape)
    with torch.no_grad():
        tokens = model.patch_embed(x)
        assert tokens.shape == (2, 128, *grid)
        expected = model.head(model.norm(model.blocks(tokens).flatten(2).mean(-1)))
        torch.testing.assert_close(model(x), expected)
        # windows are smaller than the grid: the first (unshifted) block keeps far windows apart
        first = model.blocks.blocks[0]
        channels_last = tokens.movedim(1, -1)
        moved = channels_last.clone()
        moved[(0,) * (1 + len(grid))] += 1.0  # the first token of the first window
        far = (0, *(slice(w, None) for w in model.blocks.window_size))
        changed = (first(moved, None) - first(channels_last, None)).abs()
        assert changed[far].max() == 0 and changed[(0,) * (1 + len(grid))].max() > 0
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in create_model(name).state_dict().items()}
    assert shapes == {k: v.shape for k, v in model.state_dict().items()}
    assert all(blk.attn.proj[1].gamma.eq(1e-5).all() and blk.mlp[1].gamma.eq(1e-5).all()
               for blk in model.blocks.blocks)  # LayerScale, as vit*_small
    with pytest.raises(ValueError, match="one entry for each"):
        create_model(name, depths=(2, 2, 2, 2), num_heads=(4, 4, 4, 4))
    with pytest.raises(ValueError, match="stem must be"):
        create_model(name, stem="conv")


def test_small_swin_with_its_branches_at_zero_is_its_resnet_trunk_and_the_factors_learn():
    """LayerScale on the Swin hybrid scales each block's attention and MLP branch: with the factors at 0 the model is
    exactly stem -> mean -> norm -> head, and the factors still get gradients; at 1 the blocks run unscaled."""
    torch.manual_seed(0)
    model = create_model("swin2d_small", init_values=0.0).double()
    x = torch.randn(2, 1, 64, 64, dtype=torch.float64)
    trunk_only = model.head(model.norm(model.patch_embed(x).flatten(2).mean(-1)))
    out = model(x)
    torch.testing.assert_close(out, trunk_only, rtol=1e-12, atol=1e-12)
    out.sum().backward()
    assert all(blk.attn.proj[1].gamma.grad.abs().sum() > 0 and blk.mlp[1].gamma.grad.abs().sum() > 0
               for blk in model.blocks.blocks)
    torch.manual_seed(0)
    unscaled = create_model("swin2d_small", init_values=None).double()
    scaled_at_one = create_model("swin2d_small", init_values=1.0).double()
    state = {k.replace("proj.0.", "proj.").replace("mlp.0.", "mlp."): v for k, v in scaled_at_one.state_dict().items()
             if not k.endswith("gamma")}
    unscaled.load_state_dict(state)
    torch.testing.assert_close(unscaled(x), scaled_at_one(x), rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="stem='residual' only"):
        create_model("swin2d_tiny", init_values=1e-5)
