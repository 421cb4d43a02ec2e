"""Building blocks shared by the 3D segmentation networks: conv units, the Permutohedral block, and
the channel compensation that gives a network without PAM at least the parameters of its PAM twin."""

from __future__ import annotations

import math

import torch
from torch import nn

from medattn.permutohedral import PAM


def conv_unit(in_channels: int, out_channels: int, dilation: int = 1) -> nn.Sequential:
    """3x3x3 convolution (padding keeps the size), instance norm, leaky ReLU: (B, Ci, ...) -> (B, Co, ...).

    The convolution has no bias: the instance norm subtracts each channel's mean, so a bias there would
    never change the output and would get no gradient (the affine norm's shift plays its role).
    """
    return nn.Sequential(
        nn.Conv3d(in_channels, out_channels, kernel_size=3, padding=dilation, dilation=dilation, bias=False),
        nn.InstanceNorm3d(out_channels, affine=True),
        nn.LeakyReLU(0.01, inplace=True),
    )


class PermutohedralBlock(nn.Module):
    """The dashed block of the paper's Fig. 2: ``[x, PAM(x)]`` on channels, (B, C, ...) -> (B, C + P, ...)."""

    def __init__(self, channels: int, pam_channels: int, feature_dim: int, groups: int,
                 normalize: bool) -> None:
        super().__init__()
        self.pam = PAM(channels, pam_channels, feature_dim=feature_dim, groups=groups, normalize=normalize)
        self.out_channels = channels + pam_channels

    def forward(self, x):
        return torch.cat([x, self.pam(x)], dim=1)


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def matched_stem_extra(cls, kwargs: dict) -> int:
    """Smallest number of extra first-layer channels for which ``cls(use_pam=False)`` has at least as
    many parameters as ``cls(use_pam=True)`` with the same other arguments (the paper's compensation)."""
    target = count_parameters(cls(**kwargs, use_pam=True, stem_extra=0))
    base = count_parameters(cls(**kwargs, use_pam=False, stem_extra=0))
    per_channel = count_parameters(cls(**kwargs, use_pam=False, stem_extra=1)) - base
    return max(0, math.ceil((target - base) / per_channel))
