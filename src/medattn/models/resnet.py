"""A small ResNet for 2D images and 3D volumes (He et al., CVPR 2016), the CNN baseline beside the ViTs.

BasicBlock stages as in ResNet-18/34, constructor arguments in timm's vocabulary (``in_chans``,
``num_classes``, ``widths``, ``depths``). Layout follows MONAI, like :class:`~medattn.models.vit.VisionTransformer`:
2D input (B, C, H, W), 3D input (B, C, H, W, D).

``x -> stem conv (stride stem_stride) [-> max-pool] -> stages (the first keeps the resolution, each later
one halves it) -> global average pool -> dropout -> Linear``

The defaults are ResNet-18's (widths 64..512, two blocks per stage, 7x7 stride-2 stem with max-pool);
the CPU presets (``resnet2d_small`` ...) use narrower stages and a 3x3 stem without pooling, which suits
64 px images. Convolutions use Kaiming initialisation; the last BatchNorm of each block starts at one
(timm's ``zero_init_last`` would leave every earlier layer without a gradient at initialisation).
"""

from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    """``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))``; 3x3 convolutions, ``stride`` in the first.

    The shortcut is a strided 1x1 convolution with BatchNorm when the width or resolution changes. ``stride``: one
    int for every axis or one per axis. Shapes: (B, in_chs, *S) -> (B, out_chs, *ceil(S / stride)).
    """

    def __init__(self, in_chs: int, out_chs: int, stride: int | tuple[int, ...], spatial_dims: int) -> None:
        super().__init__()
        conv = nn.Conv2d if spatial_dims == 2 else nn.Conv3d
        norm = nn.BatchNorm2d if spatial_dims == 2 else nn.BatchNorm3d
        self.conv1 = conv(in_chs, out_chs, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm(out_chs)
        self.conv2 = conv(out_chs, out_chs, 3, padding=1, bias=False)
        self.bn2 = norm(out_chs)
        self.act = nn.ReLU(inplace=True)
        if stride not in (1, (1,) * spatial_dims) or in_chs != out_chs:
            self.downsample = nn.Sequential(conv(in_chs, out_chs, 1, stride=stride, bias=False), norm(out_chs))
        else:
            self.downsample = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.act(out + self.downsample(x))


class ResidualStem(nn.Module):
    """A hybrid ViT's stem (Dosovitskiy et al. 2021, section 3.1: the tokens are a CNN's feature map): the small
    ResNet's trunk down to the patch grid, then a 1x1 convolution to the token width.
    (B, C, *spatial) -> (B, embed_dim, *spatial / patch_size).

    ``3x3 conv (stride 1) -> BN -> ReLU -> BasicBlock at full resolution -> k BasicBlocks``, each halving every axis
    whose patch is not yet covered (``k = log2(max(patch_size))``, power-of-two patches), widths doubling to
    ``embed_dim`` (``embed_dim / 2^k`` first, at least 8): for ``vit2d_small`` (64 px, patch 8, width 128) exactly
    ``resnet2d_small``'s stem and stages. Unlike the early convolutions of :class:`~medattn.models.layers.ConvStem`
    (stride 2 from the first layer) it looks at the image at full resolution, where a lesion of a few pixels is.
    """

    def __init__(self, in_chans: int, embed_dim: int, patch_size: tuple[int, ...]) -> None:
        super().__init__()
        if any(p & (p - 1) for p in patch_size):
            raise ValueError(f"the residual stem needs power-of-two patch sizes, got {patch_size} "
                             f"(stem='patch' takes any)")
        dims = len(patch_size)
        conv = nn.Conv2d if dims == 2 else nn.Conv3d
        norm = nn.BatchNorm2d if dims == 2 else nn.BatchNorm3d
        steps = max(p.bit_length() - 1 for p in patch_size)
        width = max(8, embed_dim // 2 ** steps)
        layers = [conv(in_chans, width, 3, padding=1, bias=False), norm(width), nn.ReLU(inplace=True),
                  BasicBlock(width, width, 1, dims)]
        remaining = list(patch_size)
        for i in range(1, steps + 1):
            stride = tuple(2 if r > 1 else 1 for r in remaining)
            remaining = [r // s for r, s in zip(remaining, stride)]
            out = max(8, embed_dim // 2 ** (steps - i))
            layers.append(BasicBlock(width, out, stride, dims))
            width = out
        self.stem = nn.Sequential(*layers)
        self.proj = conv(width, embed_dim, kernel_size=1)
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Conv3d)) and module is not self.proj:
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.stem(x))  # (B, embed_dim, *grid)


class ResNet(nn.Module):
    """ResNet classifier with BasicBlocks, 2D or 3D.

    Args:
        in_chans: input channels C.
        num_classes: logits returned (1 for a binary task).
        spatial_dims: 2 or 3.
        widths: channels of each stage.
        depths: BasicBlocks per stage (same length as ``widths``).
        stem_kernel, stem_stride: the first convolution (width ``widths[0]``).
        stem_pool: a 3x3 stride-2 max-pool after the stem.
        drop_rate: dropout before the classifier.

    ``forward(x)``: (B, C, *spatial) -> (B, num_classes) logits. ``forward_features(x)``: -> (B, widths[-1]).
    """

    def __init__(self, in_chans: int = 3, num_classes: int = 1, spatial_dims: int = 2,
                 widths: tuple[int, ...] = (64, 128, 256, 512), depths: tuple[int, ...] = (2, 2, 2, 2),
                 stem_kernel: int = 7, stem_stride: int = 2, stem_pool: bool = True, drop_rate: float = 0.0) -> None:
        super().__init__()
        if spatial_dims not in (2, 3):
            raise ValueError(f"spatial_dims must be 2 or 3, got {spatial_dims}")
        if in_chans < 1 or num_classes < 1:
            raise ValueError(f"in_chans and num_classes must be at least 1, got {in_chans} and {num_classes}")
        widths, depths = tuple(widths), tuple(depths)
        if not widths or len(widths) != len(depths) or min(widths) < 1 or min(depths) < 1:
            raise ValueError(f"widths and depths must be positive and of equal length, got {widths} and {depths}")
        self.in_chans, self.num_classes, self.spatial_dims = in_chans, num_classes, spatial_dims
        conv = nn.Conv2d if spatial_dims == 2 else nn.Conv3d
        norm = nn.BatchNorm2d if spatial_dims == 2 else nn.BatchNorm3d
        pool = nn.MaxPool2d if spatial_dims == 2 else nn.MaxPool3d
        self.stem = nn.Sequential(
            conv(in_chans, widths[0], stem_kernel, stride=stem_stride, padding=stem_kernel // 2, bias=False),
            norm(widths[0]), nn.ReLU(inplace=True), *([pool(3, stride=2, padding=1)] if stem_pool else []))
        stages, in_chs = [], widths[0]
        for i, (width, depth) in enumerate(zip(widths, depths)):
            blocks = [BasicBlock(in_chs if j == 0 else width, width, 2 if i > 0 and j == 0 else 1, spatial_dims)
                      for j in range(depth)]
            stages.append(nn.Sequential(*blocks))
            in_chs = width
        self.stages = nn.Sequential(*stages)
        self.drop = nn.Dropout(drop_rate) if drop_rate > 0 else nn.Identity()
        self.head = nn.Linear(widths[-1], num_classes)
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Conv3d)):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 2 + self.spatial_dims or x.shape[1] != self.in_chans:
            raise ValueError(
                f"expected input (B, {self.in_chans}, {', '.join('*' * self.spatial_dims)}) with "
                f"{self.spatial_dims} spatial axes, got {tuple(x.shape)}"
            )
        x = self.stages(self.stem(x))  # (B, widths[-1], *S')
        return x.flatten(2).mean(dim=-1)  # (B, widths[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(self.forward_features(x)))
