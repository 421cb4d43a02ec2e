"""Permutohedral lattice filtering and the Permutohedral Attention Module (Joutard et al., MICCAI 2019)."""

from .lattice import gaussian_scale, permutohedral_filter
from .module import PAM

__all__ = ["PAM", "gaussian_scale", "permutohedral_filter"]
