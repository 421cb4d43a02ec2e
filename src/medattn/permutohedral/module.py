"""Permutohedral Attention Module (Joutard et al., MICCAI 2019, Fig. 2) for 3D feature maps.

For an input x (B, C, H, W, D) with voxel coordinates p (3, H, W, D), the module computes

    f = LeakyReLU(Conv1x1([x, s * p]))        features,    (B, G * d, H, W, D), s learned per axis
    v = Conv1x1(x)                            descriptors, (B, G * c, H, W, D)
    v'^g = Lattice(v^g, f^g)                  for each of the G channel groups, its own lattice
    out = [v'^0, ..., v'^{G-1}]               (B, out_channels, H, W, D)

where ``Lattice`` is :func:`permutohedral_filter`, i.e. ``v'_i = sum_j exp(-|f_i - f_j|^2 / 2) v_j`` over
all voxels of the same volume (normalised by ``sum_j exp(...)`` when ``normalize=True``, the default).
The module returns the filtered descriptors only; the networks concatenate them with their input
(the "Permutohedral block"). Coordinates are voxel indices minus the volume's centre.
"""

from __future__ import annotations

import torch
from torch import nn

from .lattice import permutohedral_filter


class PAM(nn.Module):
    """Permutohedral attention over the voxels of a 3D feature map.

    Args:
        in_channels: C of the input (B, C, H, W, D).
        out_channels: channels of the filtered descriptors; divisible by ``groups``.
        feature_dim: lattice feature dimension per group (d).
        groups: channel groups, each with its own lattice (the paper uses 2).
        normalize: weighted mean (True) or the paper's unnormalised sum (False).
        coord_scale: initial value of the learned per-axis scale of the voxel coordinates.
        negative_slope: slope of the leaky ReLU on the features.
    """

    #: The lattice is built from the data (its size and its hash table depend on the values), which neither ONNX
    #: nor ``torch.export`` can hold: exporting a model with this module is refused with this reason.
    export_refusal = "the permutohedral lattice is built from the data, which ONNX and torch.export cannot express"

    def __init__(self, in_channels: int, out_channels: int, feature_dim: int = 4, groups: int = 2,
                 normalize: bool = True, coord_scale: float = 0.1, negative_slope: float = 0.01) -> None:
        super().__init__()
        for name, value in (("in_channels", in_channels), ("out_channels", out_channels),
                            ("feature_dim", feature_dim), ("groups", groups)):
            if value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
        if out_channels % groups:
            raise ValueError(f"out_channels ({out_channels}) must be divisible by groups ({groups})")
        self.groups = groups
        self.feature_dim = feature_dim
        self.normalize = normalize
        self.coord_scale = nn.Parameter(torch.full((3,), float(coord_scale)))
        self.features = nn.Conv3d(in_channels + 3, groups * feature_dim, kernel_size=1)
        self.act = nn.LeakyReLU(negative_slope)
        self.descriptors = nn.Conv3d(in_channels, out_channels, kernel_size=1)

    @staticmethod
    def _coordinates(x: torch.Tensor) -> torch.Tensor:
        """Centred voxel indices (1, 3, H, W, D)."""
        axes = [torch.arange(n, device=x.device, dtype=x.dtype) - (n - 1) / 2 for n in x.shape[2:]]
        return torch.stack(torch.meshgrid(*axes, indexing="ij")).unsqueeze(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, C, H, W, D) -> filtered descriptors (B, out_channels, H, W, D)."""
        if x.dim() != 5:
            raise ValueError(f"PAM expects a 3D feature map (B, C, H, W, D), got shape {tuple(x.shape)}")
        batch, _, *spatial = x.shape
        coords = self._coordinates(x) * self.coord_scale.view(1, 3, 1, 1, 1)
        f = self.act(self.features(torch.cat([x, coords.expand(batch, -1, -1, -1, -1)], dim=1)))
        v = self.descriptors(x)
        num = f.shape[2] * f.shape[3] * f.shape[4]
        f = f.reshape(batch * self.groups, self.feature_dim, num).transpose(1, 2)  # (B G, N, d)
        v = v.reshape(batch * self.groups, -1, num).transpose(1, 2)  # (B G, N, c)
        out = permutohedral_filter(v, f, normalize=self.normalize)  # (B G, N, c)
        return out.transpose(1, 2).reshape(batch, -1, *spatial)
