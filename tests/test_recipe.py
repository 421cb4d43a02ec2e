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
