"""Every mechanism inside a real timm ``Block`` and a whole timm ``VisionTransformer`` (timm 1.0 calls attention
with ``attn_mask=`` and ``is_causal=`` and builds it with its own keywords). timm is installed ``--no-deps`` by the
Makefile; torchvision is replaced by a stand-in (tests/stand_ins/torchvision.py) while timm imports."""

from __future__ import annotations

import pytest
import torch

from medattn.attention import available_attentions, get_attention_class
from stand_ins.torchvision import import_timm

vit = import_timm()
pytestmark = pytest.mark.skipif(vit is None, reason="timm is not installed (make installs it with --no-deps)")


@pytest.mark.parametrize("name", available_attentions())
def test_every_mechanism_runs_inside_a_timm_block_and_vit(name):
    torch.manual_seed(0)
    cls = get_attention_class(name)
    block = vit.Block(32, 4, qkv_bias=True, attn_layer=cls)
    assert isinstance(block.attn, cls)
    x = torch.randn(2, 9, 32, requires_grad=True)
    y = block(x)
    y.sum().backward()
    assert y.shape == x.shape and torch.isfinite(y).all() and torch.isfinite(x.grad).all()
    model = vit.VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4, num_classes=3,
                                  attn_layer=cls).eval()
    with torch.no_grad():
        assert torch.isfinite(model(torch.randn(2, 3, 16, 16))).all()


def test_softmax_in_a_timm_block_equals_timms_own_attention():
    """Same weights in timm's ``Attention`` and medattn's softmax mechanism: the same block output."""
    torch.manual_seed(0)
    theirs = vit.Block(32, 4, qkv_bias=True).eval()
    ours = vit.Block(32, 4, qkv_bias=True, attn_layer=get_attention_class("softmax")).eval()
    assert ours.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.randn(2, 9, 32)
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)


def test_what_a_mechanism_cannot_do_is_refused_with_a_reason():
    seqnorm = get_attention_class("seqnorm")
    with pytest.raises(ValueError, match="qk_norm"):
        vit.Block(32, 4, qk_norm=True, attn_layer=seqnorm)
    with pytest.raises(ValueError, match="causal"):
        vit.Block(32, 4, attn_layer=seqnorm).attn(torch.randn(1, 3, 32), is_causal=True)
    without_bias = vit.Block(32, 4, proj_bias=False, attn_layer=seqnorm)
    assert without_bias.attn.proj.bias is None
