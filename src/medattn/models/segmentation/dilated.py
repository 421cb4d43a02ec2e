"""Shallow dilated fully convolutional network, with or without PAM (Joutard et al., MICCAI 2019, Fig. 2).

A 3x3x3 convolution to ``width`` channels, ``num_blocks`` dilated blocks (parallel 3x3x3 convolutions
with dilations ``dilations``, ``width / len(dilations)`` channels each, concatenated), optionally the
Permutohedral block ``[h, PAM(h)]``, and a 1x1x1 prediction convolution. ``dilations=(1,)`` gives the
paper's plain FCN. Without the PAM, ``stem_extra`` extra first-layer channels (automatic when None)
match the parameter count of the PAM twin.
"""

from __future__ import annotations

import torch
from torch import nn

from .blocks import PermutohedralBlock, conv_unit, matched_stem_extra


class DilatedBlock(nn.Module):
    """Parallel dilated 3x3x3 convolutions, concatenated: (B, Ci, ...) -> (B, len(dilations) branch, ...)."""

    def __init__(self, in_channels: int, branch_channels: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.branches = nn.ModuleList([conv_unit(in_channels, branch_channels, d) for d in dilations])

    def forward(self, x):
        return torch.cat([branch(x) for branch in self.branches], dim=1)


class DilatedFCN3D(nn.Module):
    """Dil.FCN (+PAM). Shapes: (B, in_chans, H, W, D) -> (B, num_classes, H, W, D).

    Args:
        in_chans, num_classes: input channels, output logits.
        width: channels after each layer (paper: 18); divisible by ``len(dilations)``.
        num_blocks: dilated blocks (paper: 4). dilations: of the parallel branches (paper: 1, 2, 4).
        use_pam, pam_channels (default ``width``), pam_feature_dim, pam_groups, pam_normalize: the PAM.
        stem_extra: extra channels of the first convolution; None = 0 with PAM, matched without.
    """

    def __init__(self, in_chans: int = 1, num_classes: int = 2, width: int = 18, num_blocks: int = 4,
                 dilations: tuple[int, ...] = (1, 2, 4), use_pam: bool = False,
                 pam_channels: int | None = None,
                 pam_feature_dim: int = 4, pam_groups: int = 2, pam_normalize: bool = True,
                 stem_extra: int | None = None) -> None:
        super().__init__()
        dilations = tuple(dilations)
        if not dilations or width % len(dilations):
            raise ValueError(f"width ({width}) must be divisible by the number of dilations {dilations}")
        if num_blocks < 1 or in_chans < 1 or num_classes < 1:
            raise ValueError("in_chans, num_classes and num_blocks must be positive")
        pam_args = dict(in_chans=in_chans, num_classes=num_classes, width=width, num_blocks=num_blocks,
                        dilations=dilations, pam_channels=pam_channels, pam_feature_dim=pam_feature_dim,
                        pam_groups=pam_groups, pam_normalize=pam_normalize)
        if stem_extra is None:
            stem_extra = 0 if use_pam else matched_stem_extra(DilatedFCN3D, pam_args)
        self.stem_extra = stem_extra
        self.stem = conv_unit(in_chans, width + stem_extra)
        branch = width // len(dilations)
        self.blocks = nn.Sequential(*[DilatedBlock(width + (stem_extra if i == 0 else 0), branch, dilations)
                                      for i in range(num_blocks)])
        self.pam = PermutohedralBlock(width, pam_channels or width, pam_feature_dim, pam_groups,
                                      pam_normalize) if use_pam else None
        self.head = nn.Conv3d(self.pam.out_channels if use_pam else width, num_classes, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, in_chans, H, W, D) -> logits (B, num_classes, H, W, D)."""
        if x.dim() != 5:
            raise ValueError(f"expected (B, C, H, W, D), got {tuple(x.shape)}")
        x = self.blocks(self.stem(x))
        if self.pam is not None:
            x = self.pam(x)
        return self.head(x)
