"""A weight-free patch descriptor: colour, stain and texture statistics (a baseline that needs no download).

For RGB patches x in [0, 1], (B, 3, P, P), the 32 features are
  * RGB mean and standard deviation (6);
  * stain concentrations by colour deconvolution (Ruifrok & Johnston 2001): optical density
    OD = -log10(max(x, 1/255)), concentrations C = OD M^-1 with M the haematoxylin, eosin and DAB
    OD vectors (rows, unit length); mean and standard deviation of H, E and D (6);
  * histograms (8 bins, fractions of pixels) of the grey gradient magnitude |Sobel| and of |Laplacian|
    over fixed log-spaced edges (16);
  * mean and standard deviation of the HSV saturation (2); the fraction of white pixels (all channels
    >= 220/255) and of dark pixels (grey < 0.5), nuclei-rich tissue being dark (2).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

RGB_FROM_HED = torch.tensor([[0.65, 0.70, 0.29], [0.07, 0.99, 0.11], [0.27, 0.57, 0.78]])  # Ruifrok & Johnston
GRADIENT_EDGES = torch.tensor([0.0, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, float("inf")])
LAPLACIAN_EDGES = torch.tensor([0.0, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, float("inf")])
LUMA = (0.299, 0.587, 0.114)


def histogram(values: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """(B, N) values -> (B, len(edges) - 1) fractions of each row in [edges[i], edges[i + 1])."""
    index = torch.bucketize(values, edges.to(values.device), right=True) - 1  # (B, N) bin per value
    counts = torch.zeros(values.shape[0], len(edges) - 1, device=values.device)
    counts.scatter_add_(1, index.clamp(0, len(edges) - 2), torch.ones_like(values))
    return counts / values.shape[1]


class StainTextureDescriptor(nn.Module):
    """``forward(x)``: (B, 3, P, P) RGB in [0, 1] -> (B, 32) features (module docstring). No parameters."""

    num_features = 32

    def __init__(self) -> None:
        super().__init__()
        stains = F.normalize(RGB_FROM_HED, dim=1)
        self.register_buffer("hed_from_rgb", torch.linalg.inv(stains), persistent=False)
        sobel = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]]) / 8
        laplace = torch.tensor([[0.0, 1.0, 0.0], [1.0, -4.0, 1.0], [0.0, 1.0, 0.0]])
        self.register_buffer("kernels", torch.stack([sobel, sobel.t(), laplace])[:, None], persistent=False)
        self.register_buffer("luma", torch.tensor(LUMA).view(1, 3, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        flat = x.flatten(2)  # (B, 3, P*P)
        od = -torch.log10(flat.clamp(min=1 / 255))
        hed = torch.einsum("bcn,cs->bsn", od, self.hed_from_rgb)  # (B, 3 stains, P*P)
        grey = (x * self.luma).sum(1, keepdim=True)  # (B, 1, P, P)
        filtered = F.conv2d(F.pad(grey, (1, 1, 1, 1), mode="replicate"), self.kernels)  # (B, 3, P, P)
        gradient = filtered[:, :2].pow(2).sum(1).sqrt().flatten(1)  # (B, P*P)
        laplacian = filtered[:, 2].abs().flatten(1)
        high, low = flat.max(1).values, flat.min(1).values
        sat = (high - low) / high.clamp(min=1e-6)  # (B, P*P)
        white = (low >= 220 / 255).float().mean(1, keepdim=True)
        dark = (grey.flatten(1) < 0.5).float().mean(1, keepdim=True)
        parts = [flat.mean(2), flat.std(2), hed.mean(2), hed.std(2), histogram(gradient, GRADIENT_EDGES),
                 histogram(laplacian, LAPLACIAN_EDGES), sat.mean(1, keepdim=True), sat.std(1, keepdim=True),
                 white, dark]
        return torch.cat(parts, dim=1)  # (B, 32)
