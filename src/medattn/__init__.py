"""medattn: compute-efficient transformers for medical imaging.

Attention mechanisms live in :mod:`medattn.attention` (chosen by name), models in
:mod:`medattn.models`.
"""

__version__ = "0.1.0"
