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
