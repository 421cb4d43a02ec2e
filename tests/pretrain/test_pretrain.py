"""Masked-autoencoder pretraining (medattn.pretrain): the loss reaches only masked patches, the encoder sees no masked
pixel, the checkpoint initialises every ViT preset and mechanism, the run resumes exactly and reads an unlabelled
pool with the training split's reader."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from engine_data import image_bundle
from medattn.catalogue import ATTENTIONS
from medattn.config import load_config
from medattn.data import build_datasets
from medattn.errors import UserError
from medattn.models import create_model
from medattn.models.presets import PRESETS
from medattn.models.vit import VisionTransformer
from medattn.pretrain import MaskedAutoencoder, masked_patch_loss, patchify, pretrain
from medattn.pretrain.mae import unpatchify_mask
from medattn.runtime import checkpoint

VIT_PRESETS = sorted(name for name, (cls, _) in PRESETS.items() if cls is VisionTransformer)


def _input(vit: VisionTransformer, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, vit.in_chans, *vit.img_size)


def test_the_loss_reaches_only_masked_patches():
    pred = torch.randn(2, 10, 6, requires_grad=True)
    target = torch.randn(2, 10, 6)
    masked = torch.zeros(2, 10, dtype=torch.bool)
    masked[0, [1, 4]] = True
    masked[1, [0, 9]] = True
    loss = masked_patch_loss(pred, target, masked)
    loss.backward()
    assert torch.equal(pred.grad.abs().sum(-1) > 0, masked)
    expected = torch.stack([(pred[b, k] - target[b, k]).square().mean() for b, k in masked.nonzero()]).mean()
    torch.testing.assert_close(loss, expected)


@pytest.mark.parametrize("name", ["vit2d_tiny", "vit3d_tiny"])
def test_the_chance_level_is_the_loss_of_predicting_each_patchs_mean(name):
    vit = create_model(name, attention="seqnorm", num_classes=2)
    mae = MaskedAutoencoder(vit)
    torch.nn.init.zeros_(mae.decoder_pred.weight)
    torch.nn.init.zeros_(mae.decoder_pred.bias)  # predicts 0, each standardised patch's mean
    loss = mae(_input(vit, 3), generator=torch.Generator().manual_seed(0))[0]
    assert loss.item() == pytest.approx(mae.chance_loss(3), rel=1e-3)
    assert MaskedAutoencoder(vit, norm_pix_loss=False).chance_loss(3) is None  # the pixels' variance: data's


@pytest.mark.parametrize("name, stem", [("vit2d_tiny", "patch"), ("vit2d_small", "conv"), ("vit2d_small", "residual"),
                                        ("vit3d_tiny", "patch"), ("vit3d_small", "conv"), ("vit3d_small", "residual")])
def test_the_encoder_sees_only_the_kept_patches(name, stem):
    """Changing every masked patch's pixels leaves the encoder's tokens unchanged (the conv stem included); the
    model's own loss has no gradient on the predictions of kept patches."""
    torch.manual_seed(0)
    mae = MaskedAutoencoder(create_model(name, attention="seqnorm", stem=stem)).eval()
    x = _input(mae.encoder)
    keep = mae.random_keep(2, torch.Generator().manual_seed(1))
    patches = torch.ones(2, math.prod(mae.encoder.grid_size), dtype=torch.bool).scatter_(1, keep, False)  # masked
    noise = torch.randn_like(x) * 5 * unpatchify_mask(patches, mae.encoder.grid_size, mae.encoder.patch_size)
    with torch.no_grad():
        torch.testing.assert_close(mae.encode(x, keep), mae.encode(x + noise, keep))
        assert not torch.allclose(mae.encode(x, keep), mae.encode(x + noise.roll(1, dims=-1), keep))
    pred = mae.decode(mae.encode(x, keep), keep).detach().requires_grad_(True)
    masked_patch_loss(pred, mae.target(x), patches).backward()
    assert torch.equal(pred.grad.abs().sum(-1) > 0, patches)


@pytest.mark.parametrize("name", ["vit2d_tiny", "vit3d_tiny"])
def test_patchify_follows_the_token_order_of_the_patch_embedding(name):
    vit = create_model(name, attention="softmax", stem="patch")
    x = _input(vit, 1)
    weight = vit.patch_embed.weight.reshape(vit.embed_dim, -1)
    tokens = vit.patch_embed(x).flatten(2).transpose(1, 2)
    torch.testing.assert_close(patchify(x, vit.patch_size) @ weight.T + vit.patch_embed.bias, tokens)


def test_masking_keeps_the_same_share_of_every_sample_and_refuses_bad_ratios():
    mae = MaskedAutoencoder(create_model("vit2d_tiny", attention="softmax"), mask_ratio=0.75)
    keep = mae.random_keep(5)
    assert keep.shape == (5, 4) and all(len(set(row.tolist())) == 4 for row in keep)
    for ratio in (0.0, 1.0, 0.99):
        with pytest.raises(ValueError):
            MaskedAutoencoder(create_model("vit2d_tiny", attention="softmax"), mask_ratio=ratio)
    with pytest.raises(TypeError):
        MaskedAutoencoder(create_model("resnet2d_tiny"))


@pytest.mark.parametrize("name", VIT_PRESETS)
def test_the_checkpoint_initialises_every_vit_preset(tmp_path, name):
    """The encoder saved as pretraining saves it loads into a fresh model of the preset through --init-from's
    path: every encoder tensor is loaded and the first forward changes to the pretrained model's."""
    torch.manual_seed(0)
    mae = MaskedAutoencoder(create_model(name, attention="seqnorm"))
    with torch.no_grad():  # stands for training: every tensor moves
        for p in mae.encoder.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    config = load_config(None, ["data.kind=synthetic_cxr", f"model.name={name}", "model.attention=seqnorm"])
    task = {"task_type": "binary", "input_kind": "image2d" if mae.encoder.spatial_dims == 2 else "volume3d",
            "num_outputs": 1, "input_shape": [mae.encoder.in_chans, *mae.encoder.img_size], "class_names": [],
            "synthetic": True}
    checkpoint.save(tmp_path / "best", mae.encoder, {"config": config, "task": task})
    fresh = create_model(name, attention="seqnorm").eval()
    x = _input(fresh, 1)
    with torch.no_grad():
        before = fresh(x)
        new, unused = checkpoint.init_from(fresh, tmp_path / "best")
        after = fresh(x)
        expected = mae.encoder.eval()(x)
    assert new == [] and unused == []
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, expected)


@pytest.mark.parametrize("mechanism", sorted(ATTENTIONS))
def test_every_mechanism_pretrains_and_starts_any_other(tmp_path, mechanism):
    torch.manual_seed(0)
    mae = MaskedAutoencoder(create_model("vit2d_tiny", attention=mechanism))
    loss = mae(_input(mae.encoder))[0]
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in mae.encoder.parameters()
                                        if p.grad is not None)
    assert mae.encoder.patch_embed.weight.grad.abs().sum() > 0
    config = load_config(None, ["data.kind=synthetic_cxr", "model.name=vit2d_tiny", f"model.attention={mechanism}"])
    task = {"task_type": "binary", "input_kind": "image2d", "num_outputs": 1, "input_shape": [1, 32, 32]}
    checkpoint.save(tmp_path / "best", mae.encoder, {"config": config, "task": task})
    other = create_model("vit2d_tiny", attention="softmax" if mechanism != "softmax" else "seqnorm")
    checkpoint.init_from(other, tmp_path / "best")
    torch.testing.assert_close(other.encoder.blocks[0].attn.qkv.weight, mae.encoder.encoder.blocks[0].attn.qkv.weight)


def _config(tmp_path, *overrides):
    return load_config(None, ["data.kind=synthetic_cxr", "model.name=vit2d_tiny", "model.attention=seqnorm",
                              "pretrain.epochs=3", "pretrain.batch_size=8", "pretrain.warmup_epochs=1",
                              "train.threads=1", *overrides])


def test_pretraining_lowers_the_loss_resumes_exactly_and_records_what_it_read(tmp_path):
    bundle = image_bundle(24)
    config = _config(tmp_path)
    whole = pretrain(config, bundle, tmp_path / "whole", progress=False, log=lambda m: None)

    class Stop(Exception):
        pass

    def stop_after_first(epoch, row):
        if epoch == 1:
            raise Stop

    with pytest.raises(Stop):
        pretrain(config, bundle, tmp_path / "cut", progress=False, log=lambda m: None, on_epoch_end=stop_after_first)
    resumed = pretrain(config, bundle, tmp_path / "cut", resume=True, progress=False, log=lambda m: None)
    a = checkpoint.load_weights(tmp_path / "whole" / "checkpoints" / "last")
    b = checkpoint.load_weights(tmp_path / "cut" / "checkpoints" / "last")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["final_loss"] == whole["final_loss"]
    rows = list(csv.DictReader((tmp_path / "cut" / "metrics.csv").open()))
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3]
    assert float(rows[-1]["loss"]) < float(rows[0]["loss"])
    recorded = json.loads((tmp_path / "whole" / "pretrain.json").read_text())
    assert recorded["train_cases"] == 24 and recorded["pool_cases"] == 0 and recorded["steps"] == 9
    meta = checkpoint.load_meta(tmp_path / "whole" / "checkpoints" / "best")
    assert meta["pretrained"]["objective"] == "masked autoencoding"
    assert not any(k.startswith("decoder") for k in checkpoint.header_shapes(tmp_path / "whole" / "checkpoints" /
                                                                              "best"))
    with pytest.raises(UserError, match="already holds a run"):
        pretrain(config, bundle, tmp_path / "whole", progress=False, log=lambda m: None)


def test_training_starts_from_the_pretraining_run_and_records_it(tmp_path):
    from medattn.train import fit

    bundle = image_bundle(16)
    config = _config(tmp_path, "pretrain.epochs=1", "train.epochs=1", "train.batch_size=8", "eval.bootstrap=0",
                     "eval.heatmaps=0")
    pretrain(config, bundle, tmp_path / "pre", progress=False, log=lambda m: None)
    lines = []
    results = fit(config, bundle, tmp_path / "run", init_from=tmp_path / "pre", progress=False, log=lines.append)
    assert results["init_from"]["new_tensors"] == [] and results["init_from"]["unused_tensors"] == []
    assert results["init_from"]["pretrained"] == {"objective": "masked autoencoding", "train_cases": 16,
                                                  "pool": None, "pool_cases": 0}
    assert any("pretrained by masked autoencoding" in line for line in lines)


def _image_table(folder, rows: int, labelled: bool) -> str:
    rng = np.random.default_rng(rows)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    names = []
    for i in range(rows):
        name = f"images/{'l' if labelled else 'u'}{i}.png"
        Image.fromarray(rng.integers(0, 255, (40, 40), dtype=np.uint8)).save(folder / name)
        names.append(name)
    table = folder / ("cases.csv" if labelled else "pool.csv")
    with table.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "label", "split"] if labelled else ["path"])
        for i, name in enumerate(names):
            writer.writerow([name, i % 2, ("train", "train", "val", "test")[i % 4]] if labelled else [name])
    return str(table)


def test_an_unlabelled_pool_is_read_with_the_training_reader(tmp_path):
    """A CSV of paths alone joins the training split's images, resized and normalised as training reads them."""
    cases = _image_table(tmp_path / "labelled", 16, True)
    pool = _image_table(tmp_path / "unlabelled", 10, False)
    config = load_config(None, ["data.kind=image_table", f"data.csv={cases}", "data.label_columns=label",
                                "data.split_column=split", "data.image_size=32", "data.in_chans=1",
                                "model.name=vit2d_tiny", "model.attention=seqnorm", "pretrain.epochs=1",
                                "pretrain.batch_size=4", f"pretrain.pool={pool}", "train.threads=1"])
    bundle = build_datasets(config["data"], seed=0)
    summary = pretrain(config, bundle, tmp_path / "run", progress=False, log=lambda m: None)
    assert summary["train_cases"] == 8 and summary["pool_cases"] == 10 and summary["steps"] == 4
    from medattn.pretrain.data import pretraining_set

    dataset, _ = pretraining_set(bundle, config["data"], pool)
    assert dataset[len(dataset) - 1]["input"].shape == bundle.train[0]["input"].shape == (1, 32, 32)
    bad = tmp_path / "bad.csv"
    bad.write_text("file\nx.png\n")
    with pytest.raises(UserError, match="missing column"):
        pretraining_set(bundle, config["data"], bad)


def test_pretraining_refuses_what_it_cannot_pretrain(tmp_path):
    with pytest.raises(UserError, match="no objective pretrains model 'resnet2d_tiny' \\(ResNet"):
        pretrain(_config(tmp_path, "model.name=resnet2d_tiny", "model.attention=null"), image_bundle(8),
                 tmp_path / "cnn", progress=False, log=lambda m: None)


def test_the_command_pretrains_resumes_and_says_how_to_go_on(tmp_path, capsys):
    from medattn.cli import main

    argv = ["pretrain", "synthetic_cxr", "data.image_size=32", "data.num_samples={train: 16, val: 8, test: 8}",
            "model.name=vit2d_tiny", "pretrain.epochs=1", "pretrain.batch_size=8", "train.threads=1",
            "--out", str(tmp_path / "run"), "--no-progress"]
    assert main(argv) == 0
    assert f"--init-from {tmp_path / 'run'}" in capsys.readouterr().out
    assert main(argv) == 2 and "already holds a run" in capsys.readouterr().err  # refused, nothing replaced
    assert main([*argv, "--resume"]) == 0  # finished: nothing left to run
