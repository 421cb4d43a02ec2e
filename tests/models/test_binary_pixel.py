"""Pixel-wise transformer of BinaryFormer's Appendix B: tokens, shapes, mechanisms, errors."""

from __future__ import annotations

import pytest
import torch

from medattn.models.pixel import PixelTransformer, pixel_tokens


def test_pixel_tokens_hold_intensities_and_coordinates():
    x = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).view(2, 3, 4, 5)
    tokens = pixel_tokens(x)
    assert tokens.shape == (2, 20, 5)
    torch.testing.assert_close(tokens[:, :, :3], x.flatten(2).transpose(1, 2))
    assert tokens[0, 0, 3:].tolist() == [-1.0, -1.0]  # top-left pixel
    assert tokens[1, -1, 3:].tolist() == [1.0, 1.0]  # bottom-right pixel
    assert tokens[0, 5, 3:].tolist() == [pytest.approx(-1 / 3), -1.0]  # second row, first column


@pytest.mark.parametrize("attention, kwargs", [("softmax", {}), ("binary-ste", {"value_dim": 4}),
                                                ("binary-sg", {}), ("binary-hamming", {"value_dim": 4}),
                                                ("binary-bernoulli", {})])
def test_forward_backward_and_eval(attention, kwargs):
    torch.manual_seed(0)
    model = PixelTransformer(in_chans=1, num_classes=3, embed_dim=16, depth=1, num_heads=2, mlp_dim=32,
                             attention=attention, attention_kwargs=kwargs)
    x = torch.randn(2, 1, 6, 6)
    logits = model(x)
    assert logits.shape == (2, 3)
    logits.sum().backward()
    assert model.embed.weight.grad.abs().sum() > 0
    with torch.no_grad():
        assert torch.isfinite(model.eval()(x)).all()


def test_bad_input():
    model = PixelTransformer(in_chans=3, num_classes=2, embed_dim=8, depth=1, num_heads=2, mlp_dim=16)
    with pytest.raises(ValueError, match="expected images"):
        model(torch.randn(2, 1, 4, 4))
    with pytest.raises(ValueError):
        PixelTransformer(in_chans=0)
