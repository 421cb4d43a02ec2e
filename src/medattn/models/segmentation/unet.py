"""3D U-Net (Cicek et al., MICCAI 2016) and U-PAM-Net (Joutard et al., MICCAI 2019, Fig. 3).

U-PAM-Net places the Permutohedral block (``[h, PAM(h)]``, then a 1x1x1 convolution back to the level's
width) on the half-resolution (level-1) features just before the last up-sampling, so attention runs over
2x2x2 voxel regions: for ``depth=1`` these are the bottleneck output, for ``depth>=2`` the level-1 decoder
output. The PAM therefore runs for every depth >= 1. Without the
PAM, ``stem_extra`` extra channels in the first convolution (chosen automatically when None) give the
network at least as many parameters as its PAM twin, as in the paper.
"""

from __future__ import annotations

import torch
from torch import nn

from .blocks import PermutohedralBlock, conv_unit, matched_stem_extra


class UNet3D(nn.Module):
    """3D U-Net, optionally with the PAM at half resolution (U-PAM-Net).

    Args:
        in_chans: input channels. num_classes: output channels (logits).
        base_channels: width at full resolution, doubled at each of the ``depth`` down-samplings.
        depth: number of 2x down-samplings (spatial sizes must be divisible by 2**depth).
        use_pam: add the Permutohedral block at half resolution (level 1: the bottleneck output when
            ``depth=1``, the level-1 decoder output otherwise), just before the last up-sampling.
        pam_channels, pam_feature_dim, pam_groups, pam_normalize: see :class:`medattn.permutohedral.PAM`
            (``pam_channels`` defaults to the half-resolution width).
        stem_extra: extra channels of the first convolution; None = 0 with PAM, matched without.
    Shapes: (B, in_chans, H, W, D) -> (B, num_classes, H, W, D).
    """

    def __init__(self, in_chans: int = 1, num_classes: int = 2, base_channels: int = 8, depth: int = 3,
                 use_pam: bool = False, pam_channels: int | None = None, pam_feature_dim: int = 4,
                 pam_groups: int = 2, pam_normalize: bool = True, stem_extra: int | None = None) -> None:
        super().__init__()
        if depth < 1 or base_channels < 1 or in_chans < 1 or num_classes < 1:
            raise ValueError("in_chans, num_classes, base_channels and depth must be positive")
        pam_args = dict(in_chans=in_chans, num_classes=num_classes, base_channels=base_channels, depth=depth,
                        pam_channels=pam_channels, pam_feature_dim=pam_feature_dim, pam_groups=pam_groups,
                        pam_normalize=pam_normalize)
        if stem_extra is None:
            stem_extra = 0 if use_pam else matched_stem_extra(UNet3D, pam_args)
        self.depth = depth
        self.stem_extra = stem_extra
        widths = [base_channels * 2**level for level in range(depth + 1)]
        self.encoders = nn.ModuleList([nn.Sequential(conv_unit(in_chans, widths[0] + stem_extra),
                                                     conv_unit(widths[0] + stem_extra, widths[0]))])
        for level in range(1, depth + 1):
            self.encoders.append(nn.Sequential(conv_unit(widths[level - 1], widths[level]),
                                               conv_unit(widths[level], widths[level])))
        self.pool = nn.MaxPool3d(2)
        self.ups = nn.ModuleList([nn.ConvTranspose3d(widths[level + 1], widths[level], 2, stride=2)
                                  for level in range(depth)])
        self.decoders = nn.ModuleList([nn.Sequential(conv_unit(2 * widths[level], widths[level]),
                                                     conv_unit(widths[level], widths[level]))
                                       for level in range(depth)])
        if use_pam:
            block = PermutohedralBlock(widths[1], pam_channels or widths[1], pam_feature_dim, pam_groups,
                                       pam_normalize)
            self.pam = nn.Sequential(block, nn.Conv3d(block.out_channels, widths[1], kernel_size=1))
        else:
            self.pam = None
        self.head = nn.Conv3d(widths[0], num_classes, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, in_chans, H, W, D) -> logits (B, num_classes, H, W, D)."""
        if x.dim() != 5 or any(n % 2**self.depth for n in x.shape[2:]):
            raise ValueError(f"expected (B, C, H, W, D) with H, W, D divisible by {2**self.depth}, "
                             f"got {tuple(x.shape)}")
        skips = []
        for level, encoder in enumerate(self.encoders):
            x = encoder(x if level == 0 else self.pool(x))
            skips.append(x)
        x = skips.pop()  # bottleneck (B, widths[depth], ...) at level depth
        for level in reversed(range(self.depth)):
            if level == 0 and self.pam is not None:
                x = self.pam(x)  # (B, widths[1], H/2, W/2, D/2): level-1 features, before the last up-sampling
            x = self.decoders[level](torch.cat([self.ups[level](x), skips[level]], dim=1))
        return self.head(x)
