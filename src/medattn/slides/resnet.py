"""ResNet-50 (He et al. 2016) with torchvision's module names, without torchvision, as a feature extractor.

Parameter and buffer names match ``torchvision.models.resnet50`` (conv1, bn1, layer1.0.conv1,
layer1.0.downsample.0, ..., fc), so ImageNet checkpoints and RetCCL's (whose ``fc`` is an Identity and
so absent) load strictly. Bottleneck v1.5: the stride sits on the 3x3 convolution. The ``fc`` head is
not built: features are the global average pool of layer4, (B, 2048).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..errors import UserError

LAYERS = (3, 4, 6, 3)  # bottlenecks per stage
WIDTHS = (64, 128, 256, 512)  # bottleneck widths; outputs are 4x
EXPANSION = 4
HEAD_KEYS = ("fc.weight", "fc.bias")  # torchvision's classifier; ignored when a checkpoint holds it


class Bottleneck(nn.Module):
    """1x1 -> 3x3 (stride) -> 1x1 convolutions with batch norm, plus the (projected) identity."""

    def __init__(self, in_chans: int, width: int, stride: int = 1) -> None:
        super().__init__()
        out = width * EXPANSION
        self.conv1 = nn.Conv2d(in_chans, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = (nn.Sequential(nn.Conv2d(in_chans, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))
                           if stride != 1 or in_chans != out else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        return self.relu(self.bn3(self.conv3(y)) + identity)


class ResNet50Features(nn.Module):
    """``forward(x)``: (B, 3, H, W) ImageNet-normalised images -> (B, 2048) pooled features (H, W >= 32)."""

    num_features = WIDTHS[-1] * EXPANSION

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        in_chans = 64
        for stage, (blocks, width) in enumerate(zip(LAYERS, WIDTHS), start=1):
            layer = []
            for b in range(blocks):
                layer.append(Bottleneck(in_chans, width, stride=2 if b == 0 and stage > 1 else 1))
                in_chans = width * EXPANSION
            setattr(self, f"layer{stage}", nn.Sequential(*layer))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))  # (B, 64, H/4, W/4)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))  # (B, 2048, H/32, W/32)
        return x.mean(dim=(2, 3))  # (B, 2048)


def load_resnet50(path: Path) -> ResNet50Features:
    """A ResNet-50 from a local torchvision-layout state dict (ImageNet, RetCCL), loaded strictly (every
    backbone tensor present with its shape, nothing else besides ``fc``); UserError naming ``path``."""
    from ..models.weights import load_strictly, read_state_dict

    path = Path(path)
    try:
        state = read_state_dict(path)
    except UserError as error:  # this loader's words, with the reader's reason
        raise UserError(f"{path}: cannot load a state dict ({str(error).removeprefix(f'{path}: ')})") from None
    model = ResNet50Features()
    load_strictly(model, state, path, "not a torchvision ResNet-50 state dict", drop=HEAD_KEYS)
    return model.eval()


def build(card=None) -> ResNet50Features:
    """A ResNet-50 with fresh weights, in eval mode and channels-last (a CPU's fast layout for convolutions; the
    ``resnet50`` card, :mod:`medattn.slides.encoders`)."""
    return ResNet50Features().eval().to(memory_format=torch.channels_last)


def load(card, path: Path) -> ResNet50Features:
    """A ResNet-50 from ``path`` (:func:`load_resnet50`)."""
    return load_resnet50(path)
