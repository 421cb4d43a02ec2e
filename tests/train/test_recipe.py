"""The small-data recipe (issue 10): each option acts as documented."""

from __future__ import annotations

import pytest
import torch

from medattn.models import create_model
from medattn.models.layers import ConvStem


def test_conv_stem_keeps_the_token_grid_and_learns():
    """Early convolutions: 3 stride-2 3x3 convs for patch 8 (2D), strides per axis for a 3D (8, 8, 4) patch."""
    model = create_model("vit2d_tiny", attention="seqnorm", stem="conv")
    assert isinstance(model.patch_embed, ConvStem)
    strides = [m.stride for m in model.patch_embed.stem if isinstance(m, torch.nn.Conv2d)]
    assert strides == [(2, 2)] * 3
    x = torch.randn(2, 1, 32, 32)
    assert model.forward_features(x).shape == (2, 1 + 16, 32)
    model(x).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.patch_embed.parameters())
    model3d = create_model("vit3d_tiny", attention="softmax", stem="conv")
    strides = [m.stride for m in model3d.patch_embed.stem if isinstance(m, torch.nn.Conv3d)]
    assert strides == [(2, 2, 2), (2, 2, 2), (2, 2, 1)]
    assert model3d.forward_features(torch.randn(2, 1, 16, 16, 8)).shape == (2, 1 + 8, 32)


def test_conv_stem_off_builds_nothing_and_bad_patch_raises():
    plain = create_model("vit2d_tiny", attention="softmax")
    assert isinstance(plain.patch_embed, torch.nn.Conv2d)
    assert not any("stem" in k for k in plain.state_dict())
    with pytest.raises(ValueError, match="power-of-two"):
        create_model("vit2d_tiny", attention="softmax", stem="conv", patch_size=6, img_size=36)
    with pytest.raises(ValueError, match="stem"):
        create_model("vit2d_tiny", attention="softmax", stem="convolution")


def test_random_resized_crop_zooms_into_the_drawn_box():
    """A ramp along W cropped to a quarter of the area with ratio 1 spans half the ramp; scale 1 is the identity."""
    from medattn.data.transforms import RandomResizedCrop

    ramp = torch.linspace(0, 1, 64).expand(1, 64, 64).clone()  # (C, H, W), value = column / 63
    torch.manual_seed(0)
    same = RandomResizedCrop(scale=(1.0, 1.0), ratio=(1.0, 1.0))(ramp)
    torch.testing.assert_close(same, ramp, atol=1e-5, rtol=0)
    for _ in range(5):
        out = RandomResizedCrop(scale=(0.25, 0.25), ratio=(1.0, 1.0))(ramp)
        span = float(out[0, 0, -1] - out[0, 0, 0])
        assert span == pytest.approx(0.5, abs=0.01)
    volume = torch.linspace(0, 1, 8).expand(1, 16, 16, 8).clone()  # ramp along D
    out = RandomResizedCrop(scale=(0.125, 0.125), ratio=(1.0, 1.0))(volume)
    assert out.shape == volume.shape
    assert float(out[0, 0, 0, -1] - out[0, 0, 0, 0]) == pytest.approx(0.5, abs=0.01)


def test_elastic_and_intensity_act_with_their_probabilities():
    from medattn.data.transforms import RandomElastic, RandomIntensity

    image = torch.rand(1, 32, 32)
    torch.testing.assert_close(RandomElastic(p=1.0, magnitude=0.0)(image), image, atol=1e-5, rtol=0)
    assert RandomElastic(p=0.0)(image) is image
    torch.manual_seed(1)
    moved = RandomElastic(p=1.0, magnitude=0.05)(torch.rand(2, 16, 16, 8))
    assert moved.shape == (2, 16, 16, 8) and torch.isfinite(moved).all()
    torch.manual_seed(0)
    volume = torch.randn(1, 8, 8, 4)
    unchanged = sum(bool(torch.equal(RandomIntensity()(volume), volume)) for _ in range(400)) / 400
    assert unchanged == pytest.approx(0.85 * 0.85 * 0.7 * 0.9, abs=0.07)  # every transform skipped


def test_augment_strong_and_bad_values():
    from medattn.data import build_datasets
    from medattn.data.transforms import Compose, build_augmentation
    from medattn.errors import UserError

    assert isinstance(build_augmentation("strong", 3), Compose) and build_augmentation(False, 2) is None
    with pytest.raises(UserError, match="data.augment"):
        build_augmentation("wild", 2)
    bundle = build_datasets({"kind": "synthetic_cxr", "augment": "strong", "num_samples": [4, 2, 2]})
    torch.manual_seed(0)
    first, second = bundle.train[0]["input"], bundle.train[0]["input"]
    assert first.shape == (1, 64, 64) and not torch.equal(first, second)
    assert torch.equal(bundle.val[0]["input"], bundle.val[0]["input"])  # evaluation is never augmented


def test_image_kinds_default_to_the_papers_and_volume_kinds_to_strong_augmentation(tmp_path):
    """``data.augment`` left out: 2D image kinds draw the paper's rotation and flip (strong augmentation hurt the
    ResNet on the realistic brain slices), volume kinds the strong recipe (a Compose of the paper's transforms,
    crop, elastic and intensity); the bundle records the value the default chose."""
    import numpy as np

    from medattn.data import build_datasets
    from medattn.data.transforms import DEFAULT_AUGMENT, Compose, RandomFlip3d, RandomRotateFlip2d
    from writers import write_csv, write_nifti, write_pillow

    assert DEFAULT_AUGMENT == {2: True, 3: "strong"}
    rows = [[f"i{k}.png", k % 2] for k in range(8)]
    for k, (name, _) in enumerate(rows):
        write_pillow(tmp_path / name, np.full((16, 16), 10 * k, dtype=np.uint8))
    images = {"kind": "image_table", "csv": str(write_csv(tmp_path / "i.csv", ["path", "label"], rows)),
              "label_columns": "label", "image_size": 16}
    bundle = build_datasets(images)
    assert isinstance(bundle.train.load.augment, RandomRotateFlip2d) and bundle.defaults == {"data.augment": True}
    for k in range(8):
        affine = np.eye(4)
        affine[:3, 3] = k
        write_nifti(tmp_path / f"v{k}.nii.gz", np.random.default_rng(k).random((8, 8, 4), dtype=np.float32),
                    affine=affine)
    volumes = {"kind": "volume_table", "csv": str(write_csv(tmp_path / "v.csv", ["path", "label"],
                                                            [[f"v{k}.nii.gz", k % 2] for k in range(8)])),
               "label_columns": "label", "target_size": [8, 8, 4]}
    bundle = build_datasets(volumes)
    assert isinstance(bundle.train.load.augment, Compose) and bundle.defaults == {"data.augment": "strong"}
    assert isinstance(build_datasets({**volumes, "augment": True}).train.load.augment, RandomFlip3d)
    breast = build_datasets({"kind": "synthetic_breast_mri", "volume_size": [16, 16, 8], "num_samples": [4, 2, 2]})
    torch.manual_seed(0)
    draws = [breast.train[0]["input"] for _ in range(8)]
    plain = build_datasets({"kind": "synthetic_breast_mri", "volume_size": [16, 16, 8], "num_samples": [4, 2, 2],
                            "augment": False}).train[0]["input"]
    # flips only permute voxels; the strong recipe's crop and intensity transforms change their values
    assert any(not torch.equal(d.flatten().sort().values, plain.flatten().sort().values) for d in draws)


@pytest.mark.parametrize("older", [{"stem": "patch"}, {"stem": "conv"}, {"stem": "conv", "global_pool": "avg"}])
def test_small_vit_designs_and_older_checkpoints_keep_theirs(tmp_path, older):
    """vit2d_small and vit3d_small start with the residual stem, read the mean of the patch tokens and scale their
    residual branches (LayerScale from 1e-5) (issue 40); a checkpoint of either written before (no ``model_defaults``
    in its metadata, no ``stem`` in its config, no LayerScale tensors) builds what its weights show, with the class
    token as readout unless its config says otherwise."""
    from engine_data import tiny_config
    from medattn.data.base import TaskInfo
    from medattn.models.resnet import ResidualStem
    from medattn.runtime import checkpoint
    from medattn.runtime.build import build_model
    from medattn.runtime.trained import load_checkpoint

    hybrid, volumes = create_model("vit2d_small", attention="seqnorm"), create_model("vit3d_small", attention="seqnorm")
    for model in (hybrid, volumes):
        assert isinstance(model.patch_embed, ResidualStem) and model.global_pool == "avg"
        assert model.encoder.blocks[0].ls1.gamma.eq(1e-5).all()
    task = TaskInfo("binary", "volume3d", 1, (1, 32, 32, 16), ["lesion"])
    meta = {"config": tiny_config("model.name=vit3d_small", "model.attention=seqnorm"),
            "task": checkpoint.task_to_dict(task)}
    torch.manual_seed(0)
    written = build_model({**meta["config"]["model"], "kwargs": {"global_pool": "token", "init_values": None, **older}},
                          task)  # as then
    kept = {k: v for k, v in older.items() if k != "stem"}  # the stem was the preset's then: not in the config
    stored = {**meta, "config": {**meta["config"], "model": {**meta["config"]["model"], "kwargs": kept}}}
    checkpoint.save(tmp_path / "old", written, stored)
    assert checkpoint.load_meta(tmp_path / "old")["config"]["model"]["kwargs"] == {"global_pool": "token", **older,
                                                                                   "init_values": None}
    x = torch.randn(2, 1, 32, 32, 16)
    torch.testing.assert_close(load_checkpoint(tmp_path / "old").model(x), written.eval()(x))


@pytest.mark.parametrize("name, shape", [("swin2d_small", (1, 64, 64)), ("swin3d_small", (1, 32, 32, 16))])
def test_a_small_swin_checkpoint_of_the_patch_design_loads_as_it_was(tmp_path, name, shape):
    """A swin*_small run of the days before the hybrid (its ``model_defaults`` hold no ``stem``: the class took
    none) builds MONAI's SwinTransformer with the preset's values of then and gives the same outputs; today's hybrid
    with its LayerScale factors loads as itself."""
    from engine_data import tiny_config
    from medattn.data.base import TaskInfo
    from medattn.runtime import checkpoint
    from medattn.runtime.build import build_model
    from medattn.runtime.checkpoint_compat import PATCH_SWIN_SMALL
    from medattn.runtime.trained import load_checkpoint

    task = TaskInfo("binary", "image2d" if len(shape) == 3 else "volume3d", 1, shape, ["lesion"])
    config = tiny_config(f"model.name={name}", "model.attention=null")
    torch.manual_seed(2)
    written = build_model({**config["model"], "kwargs": PATCH_SWIN_SMALL}, task)
    checkpoint.save(tmp_path / "run", written, {"config": config, "task": checkpoint.task_to_dict(task),
                                                "model_defaults": {}})
    trained = load_checkpoint(tmp_path / "run")
    assert trained.model.stem == "patch" and hasattr(trained.model, "encoder")
    x = torch.randn(2, *shape)
    torch.testing.assert_close(trained.model(x), written.eval()(x))
    today = build_model(config["model"], task)
    checkpoint.save(tmp_path / "today", today, {"config": config, "task": checkpoint.task_to_dict(task),
                                                "model_defaults": {}})  # as if written before designs were recorded
    assert load_checkpoint(tmp_path / "today").model.stem == "residual"


def test_a_checkpoint_builds_the_design_it_was_trained_with_after_the_preset_changes(tmp_path):
    """``model_defaults`` (the preset's values the config left to it, written by training) are applied on load: a
    run of the conv-stem, class-token vit2d_small of a few days ago keeps its design under today's preset."""
    from engine_data import tiny_config
    from medattn.data.base import TaskInfo
    from medattn.runtime import checkpoint
    from medattn.runtime.build import build_model
    from medattn.runtime.trained import load_checkpoint

    task = TaskInfo("binary", "image2d", 1, (1, 64, 64), ["lesion"])
    config = tiny_config("model.name=vit2d_small", "model.attention=softmax")
    design = {"stem": "conv", "global_pool": "token"}
    torch.manual_seed(1)
    written = build_model({**config["model"], "kwargs": design}, task)
    checkpoint.save(tmp_path / "run", written, {"config": config, "task": checkpoint.task_to_dict(task),
                                                "model_defaults": design})
    assert checkpoint.load_meta(tmp_path / "run")["config"]["model"]["kwargs"] == {}  # the config as written
    trained = load_checkpoint(tmp_path / "run")
    assert isinstance(trained.model.patch_embed, ConvStem) and trained.model.global_pool == "token"
    x = torch.randn(2, 1, 64, 64)
    torch.testing.assert_close(trained.model(x), written.eval()(x))
    bad = {"config": config, "task": checkpoint.task_to_dict(task), "model_defaults": {"stem": ["conv"]}}
    with pytest.raises(Exception, match="model_defaults"):
        checkpoint.check_meta(bad, "checkpoint.json")


# ---- training options -------------------------------------------------------------------------------


def test_layer_decay_param_group_lrs_follow_decay_power_depth():
    from medattn.train.optim import param_groups

    model = create_model("vit2d_tiny", attention="softmax")  # depth 2: layers 0 (embeddings) .. 3 (norm, head)
    groups = param_groups(model, 0.05, 0.5)
    scale = {id(p): g["lr_scale"] for g in groups for p in g["params"]}
    expected = {"pos_embed": 0.5**3, "patch_embed.weight": 0.5**3, "encoder.blocks.0.attn.qkv.weight": 0.5**2,
                "encoder.blocks.1.mlp.fc2.bias": 0.5, "encoder.norm.weight": 1.0, "head.weight": 1.0}
    params = dict(model.named_parameters())
    assert {name: scale[id(params[name])] for name in expected} == expected
    decay = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    assert decay[id(params["head.weight"])] == 0.05 and decay[id(params["head.bias"])] == 0.0
    assert decay[id(params["pos_embed"])] == 0.0
    assert [g["lr_scale"] for g in param_groups(model, 0.05, None)] == [1.0, 1.0]  # off: the two usual groups


def test_ema_is_the_hand_computed_average_with_warm_up():
    from medattn.train.optim import EMA

    model = torch.nn.Sequential(torch.nn.Linear(2, 1), torch.nn.BatchNorm1d(1))
    ema = EMA(model, decay=0.5)
    start = model[0].weight.detach().clone()
    expected, steps = start.clone(), []
    for t in range(1, 5):
        with torch.no_grad():
            model[0].weight.fill_(float(t))
            model[1].num_batches_tracked.fill_(t)
        ema.update(model)
        d = min(0.5, (1 + t) / (10 + t))
        expected = d * expected + (1 - d) * float(t)
        steps.append(d)
    assert steps == [2 / 11, 3 / 12, 4 / 13, 5 / 14] and ema.updates == 4
    torch.testing.assert_close(ema.module[0].weight, expected)
    assert int(ema.module[1].num_batches_tracked) == 4  # integer buffers copied
    assert not any(p.requires_grad for p in ema.module.parameters())


def test_ema_run_scores_the_average_and_resume_keeps_it(tmp_path):
    import json

    from safetensors.torch import load_file

    from engine_data import image_bundle, tiny_config
    from medattn.train import fit

    class Killed(Exception):
        pass

    def kill_after_1(epoch, row):
        if epoch == 1:
            raise Killed

    config = tiny_config("train.epochs=2", "train.ema=0.9")
    quiet = dict(progress=False, log=lambda m: None)
    full = fit(config, image_bundle(), tmp_path / "full", **quiet)
    with pytest.raises(Killed):
        fit(config, image_bundle(), tmp_path / "resumed", on_epoch_end=kill_after_1, **quiet)
    fit(config, image_bundle(), tmp_path / "resumed", resume=True, **quiet)
    states = [load_file(tmp_path / run / "checkpoints/last/training_state.safetensors") for run in ("full", "resumed")]
    counts = [json.loads((tmp_path / run / "checkpoints/last/training_state.json").read_text())["ema_updates"]
              for run in ("full", "resumed")]
    assert counts == [12, 12]  # 24 images, batch 4, 2 epochs: the count goes on after the resume
    last = load_file(tmp_path / "full/checkpoints/last/model.safetensors")
    ema_keys = [k for k in states[0] if k.startswith("ema.")]
    assert len(ema_keys) == len(last)
    # Resumed runs differ from uninterrupted ones in the last bits already (about 2e-4 in the raw weights, with
    # or without EMA), so the averages are compared with a tolerance; the reload itself is tested exactly below.
    assert max(float((states[0][k] - states[1][k]).abs().max()) for k in ema_keys) < 1e-3
    if full["best_epoch"] == 2:  # the best checkpoint holds the averaged weights
        best = load_file(tmp_path / "full/checkpoints/best/model.safetensors")
        torch.testing.assert_close(best["head.weight"], states[0]["ema.head.weight"])


def test_class_balanced_sampler_draws_rare_positives_half_the_time():
    from medattn.train.sampling import ClassBalancedSampler

    labels = torch.zeros(1000, 1)
    labels[:20] = 1.0  # 2% positive, as ISIC
    sampler = ClassBalancedSampler(labels, seed=3)
    sampler.set_epoch(1)
    drawn = list(sampler)
    assert len(drawn) == 1000 and abs(float(labels[drawn].mean()) - 0.5) < 0.05
    assert list(sampler) == drawn  # fixed by (seed, epoch)
    sampler.set_epoch(2)
    assert list(sampler) != drawn
    ranks = [ClassBalancedSampler(labels, seed=3, num_replicas=2, rank=r) for r in (0, 1)]
    for s in ranks:
        s.set_epoch(1)
    shares = [list(s) for s in ranks]
    assert len(shares[0]) == len(shares[1]) == 500
    assert float(labels[shares[0] + shares[1]].mean()) == pytest.approx(0.5, abs=0.05)


def test_positive_weight_and_label_smoothing_losses():
    import torch.nn.functional as F

    from medattn.data.base import TaskInfo
    from medattn.errors import UserError
    from medattn.train.objectives import objective_for
    from medattn.train.sampling import positive_weight

    labels = torch.tensor([[1.0], [0.0], [0.0], [0.0]])
    weight = positive_weight(labels, "binary", "balanced")
    torch.testing.assert_close(weight, torch.tensor([3.0]))
    logits = torch.tensor([[0.3], [-1.0], [2.0], [0.1]])
    task = TaskInfo("binary", "image2d", 1, (1, 8, 8))
    loss = objective_for(task, label_smoothing=0.2, pos_weight=weight).loss(logits, labels)
    targets = labels * 0.8 + 0.1
    p = logits.sigmoid()
    by_hand = -(3.0 * targets * p.log() + (1 - targets) * (1 - p).log()).mean()
    torch.testing.assert_close(loss, by_hand)
    plain = objective_for(task).loss(logits, labels)
    torch.testing.assert_close(plain, F.binary_cross_entropy_with_logits(logits, labels))
    multiclass = TaskInfo("multiclass", "image2d", 3, (1, 8, 8))
    logits3, classes = torch.randn(5, 3), torch.tensor([0, 1, 2, 1, 0])
    smoothed = objective_for(multiclass, label_smoothing=0.1).loss(logits3, classes)
    target = F.one_hot(classes, 3) * 0.9 + 0.1 / 3
    torch.testing.assert_close(smoothed, -(target * logits3.log_softmax(-1)).sum(-1).mean())
    with pytest.raises(UserError, match="train.pos_weight"):
        positive_weight(classes, "multiclass", "balanced")
    with pytest.raises(UserError, match="no positive"):
        positive_weight(torch.zeros(4, 1), "binary", "balanced")


def test_instance_dropout_keeps_the_stated_fraction_of_real_instances():
    from medattn.train.sampling import drop_instances

    features = torch.arange(2 * 10 * 3, dtype=torch.float32).reshape(2, 10, 3)
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[0], mask[1, :4] = True, True  # bags of 10 and 4 real instances
    coords = features[..., :2].clone()
    batch = {"input": features, "mask": mask, "coords": coords, "id": ["a", "b"]}
    torch.manual_seed(0)
    out = drop_instances(batch, 0.25)
    assert out["mask"].sum(1).tolist() == [round(0.75 * 10), round(0.75 * 4)]  # 8 and 3
    assert out["input"].shape == (2, 8, 3)
    for b in range(2):
        kept = out["input"][b, out["mask"][b]]
        rows = [int(r[0]) // 3 - 10 * b for r in kept]
        assert rows == sorted(rows) and all(mask[b, r] for r in rows)  # real instances, in order
        torch.testing.assert_close(out["coords"][b, out["mask"][b]], kept[:, :2])
    assert drop_instances(batch, 0.0) is batch
    single = drop_instances({"input": torch.randn(1, 1, 3), "mask": None, "coords": None, "id": ["c"]}, 0.9)
    assert single["mask"].sum() == 1  # at least one instance stays


# ---- learned-nothing: one trivial statistic ----------------------------------------------------------


def test_predictions_that_follow_a_trivial_statistic_are_flagged():
    import numpy as np

    from medattn.train.report import TRIVIAL_RHO, trivial_statistic_warnings

    rng = np.random.default_rng(0)
    brightness = rng.normal(size=200)
    follows = 1 / (1 + np.exp(brightness))[:, None]  # monotone decreasing in the image mean: rho = -1
    warned = trivial_statistic_warnings(follows, brightness, "image mean intensity")
    assert len(warned) == 1 and "rho -1.00" in warned[0] and "image mean intensity" in warned[0]
    independent = rng.uniform(size=(200, 1))
    assert trivial_statistic_warnings(independent, brightness, "image mean intensity") == []
    partly = (brightness + rng.normal(scale=1.0, size=200))[:, None]  # rho about 0.7: below the threshold
    assert trivial_statistic_warnings(partly, brightness, "bag size") == [] and TRIVIAL_RHO == 0.9
    assert trivial_statistic_warnings(follows, np.full(200, 5.0), "bag size") == []  # constant statistic
    two = np.stack([independent[:, 0], follows[:, 0]], 1)
    assert "test output 1" in trivial_statistic_warnings(two, brightness, "image mean intensity")[0]


def test_ema_checkpoint_round_trip_is_exact(tmp_path):
    from medattn.data.base import TaskInfo
    from medattn.runtime import checkpoint
    from medattn.train.optim import EMA

    model = create_model("vit2d_tiny", attention="softmax")
    ema = EMA(model, 0.99)
    for _ in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        ema.update(model)
    optimizer = torch.optim.AdamW(model.parameters())
    meta = {"config": {}, "task": checkpoint.task_to_dict(TaskInfo("binary", "image2d", 1, (1, 32, 32)))}
    checkpoint.save(tmp_path / "last", model, meta, optimizer, {"ema_updates": ema.updates}, ema.state_dict())
    fresh = EMA(create_model("vit2d_tiny", attention="softmax"), 0.99)
    fresh.load_state_dict(checkpoint.load_extra_tensors(tmp_path / "last", "ema."), 3)
    assert fresh.updates == 3
    for (name, a), b in zip(ema.module.state_dict().items(), fresh.module.state_dict().values()):
        assert torch.equal(a, b), name


# ---- fine-tuning from a timm-format ViT ---------------------------------------------------------------


def timm_state_dict(**kwargs) -> dict[str, torch.Tensor]:
    """Random weights of a ViT under timm's names (vit_*_patch*: ``blocks.{i}.*``, ``norm.*``,
    ``patch_embed.proj.*``, an ImageNet head): what a user brings as vit_....safetensors."""
    model = create_model("vit2d_tiny", attention="softmax", **kwargs)
    names = {"patch_embed.weight": "patch_embed.proj.weight", "patch_embed.bias": "patch_embed.proj.bias"}
    return {names.get(k, k.removeprefix("encoder.")): v.clone() for k, v in model.state_dict().items()}


def test_fine_tune_from_a_timm_state_dict_into_seqnorm_with_layer_decay(tmp_path):
    """medattn train --init-from a timm-named file (RGB, 48 px grid, 1000 classes) into a 1-channel 32 px SeqNorm
    ViT: the run lists loaded, adapted, new and dropped tensors and trains with decayed per-layer rates."""
    import json

    from safetensors.torch import save_file

    from medattn.cli import main

    weights = timm_state_dict(in_chans=3, img_size=48, num_classes=1000)
    assert "blocks.1.attn.qkv.weight" in weights and "patch_embed.proj.weight" in weights
    save_file(weights, tmp_path / "vit_tiny_timm.safetensors")
    run_dir = tmp_path / "run"
    argv = ["train", "synthetic_cxr", "model.name=vit2d_tiny", "model.attention=seqnorm", "data.image_size=32",
            "data.num_samples=[16,8,8]", "train.epochs=1", "train.batch_size=8", "train.layer_decay=0.75",
            "eval.bootstrap=0", "train.threads=1", "--init-from", str(tmp_path / "vit_tiny_timm.safetensors"),
            "--out", str(run_dir), "--no-progress"]
    assert main(argv) == 0
    report = json.loads((run_dir / "results.json").read_text())["init_from"]
    assert report["family"] == "timm"
    assert {"patch_embed.weight", "pos_embed"} <= set(report["adapted"])  # RGB -> 1 channel; 6x6 -> 4x4 grid
    assert "encoder.blocks.1.attn.qkv.weight" in report["loaded"]
    assert "head.weight" in report["new"] and any("attn" in name for name in report["new"])  # SeqNorm's own
    assert {"head.weight", "head.bias"} <= set(report["dropped"])  # ImageNet's 1000-class head
    state = json.loads((run_dir / "checkpoints/last/training_state.json").read_text())
    groups = state["optimizer"]["param_groups"]
    top = max(g["lr"] for g in groups)
    assert sorted({round(g["lr_scale"], 6) for g in groups}) == [round(0.75**k, 6) for k in (3, 2, 1, 0)]
    assert all(g["lr"] == pytest.approx(top * g["lr_scale"]) for g in groups)
