"""CTransPath in medattn's own module against timm's Swin-T with CTransPath's convolutional stem (random weights,
timm installed --no-deps, torchvision replaced by a stand-in): the checkpoint written in the published layout
(timm 0.5.4's: patch merging at the end of stages 1-3, the relative position index and shift masks saved, under
"model") loads strictly, and the embedding is timm's."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from medattn.errors import UserError
from medattn.slides.ctranspath import CTransPath, load_ctranspath
from medattn.slides.extractors import build_extractor
from stand_ins.torchvision import import_timm

import_timm()


class TransPathConvStem(nn.Module):
    """CTransPath's ConvStem as the TransPath repository defines it (its parameter names), called as timm 1.x calls
    a patch embedding (NHWC output)."""

    def __init__(self, img_size=224, patch_size=4, in_chans=3, embed_dim=96, norm_layer=None, **_):
        super().__init__()
        side = img_size if isinstance(img_size, int) else img_size[0]
        self.grid_size = (side // patch_size, side // patch_size)
        stem, channels_in, channels_out = [], in_chans, embed_dim // 8
        for _ in range(2):
            stem += [nn.Conv2d(channels_in, channels_out, 3, 2, 1, bias=False), nn.BatchNorm2d(channels_out),
                     nn.ReLU(inplace=True)]
            channels_in, channels_out = channels_out, channels_out * 2
        stem.append(nn.Conv2d(channels_in, embed_dim, 1))
        self.proj = nn.Sequential(*stem)
        self.norm = norm_layer(embed_dim) if norm_layer else nn.Identity()

    def forward(self, x):
        return self.norm(self.proj(x).permute(0, 2, 3, 1))


@pytest.fixture(scope="module")
def timm_ctranspath():
    import timm

    torch.manual_seed(0)
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, num_classes=0,
                              embed_layer=TransPathConvStem)
    with torch.no_grad():  # biases, tables and BatchNorm statistics away from their initial values
        for tensor in [*model.parameters(), *(b for n, b in model.named_buffers() if "running" in n)]:
            tensor.add_(0.02 * torch.randn_like(tensor))
    return model.eval()


def published_layout(model) -> dict:
    """timm 1.x's state dict as ctranspath.pth holds it: downsample at the end of the previous stage, with the
    buffers old timm saved."""
    state = {re.sub(r"layers\.(\d+)\.downsample", lambda m: f"layers.{int(m.group(1)) - 1}.downsample", k): v
             for k, v in model.state_dict().items()}
    for name, buffer in model.named_buffers():
        if name.endswith(("relative_position_index", "attn_mask")) and buffer is not None:
            state[name] = buffer
    return {"model": state}


def test_the_published_layout_loads_strictly_and_embeds_as_timm(timm_ctranspath, tmp_path):
    path = tmp_path / "ctranspath.pth"
    checkpoint = published_layout(timm_ctranspath)
    assert "layers.0.downsample.reduction.weight" in checkpoint["model"]
    assert any(k.endswith("attn_mask") for k in checkpoint["model"])
    torch.save(checkpoint, path)
    model = load_ctranspath(path)
    images = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        expected = timm_ctranspath.forward_features(images).mean(dim=(1, 2))  # (2, 768) after the final norm
        got = model(images)
    assert got.shape == (2, 768)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    extractor = build_extractor(f"ctranspath:{path}")
    assert extractor.name == "ctranspath:ctranspath.pth" and extractor.input_px == 224
    record = extractor.record()
    assert record["extractor_input_px"] == 224 and record["extractor_mpp"] == pytest.approx(256 / 224)
    tiles = torch.randint(0, 256, (2, 256, 256, 3), dtype=torch.uint8)  # resized to 224 before the encoder
    assert extractor(tiles).shape == (2, 768)


def test_other_layouts_and_wrong_buffers_are_refused(timm_ctranspath, tmp_path):
    state = published_layout(timm_ctranspath)["model"]
    broken = dict(state)
    broken["layers.0.blocks.1.attn_mask"] = torch.zeros_like(broken["layers.0.blocks.1.attn_mask"])
    torch.save(broken, tmp_path / "mask.pth")
    with pytest.raises(UserError, match="attn_mask is not the Swin-T buffer"):
        load_ctranspath(tmp_path / "mask.pth")
    timm_layout = timm_ctranspath.state_dict()  # timm 1.x's own order of stages: merging at the start
    torch.save(timm_layout, tmp_path / "timm.pth")
    with pytest.raises(UserError, match="not CTransPath's layout"):
        load_ctranspath(tmp_path / "timm.pth")
    with pytest.raises(ValueError, match="224 px"):
        CTransPath()(torch.zeros(1, 3, 256, 256))
