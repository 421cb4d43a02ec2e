"""BinaryFormer: 1-bit Hamming self-attention (Heinrich, MIDL 2025) with a packed-bit CPU kernel.

Registry names: ``binary-ste``, ``binary-sg``, ``binary-hamming``, ``binary-bernoulli``.
"""

from .bits import binary_attention, binary_dot, pack_signs
from .core import BinaryAttention
from .mechanisms import (
    BinaryBernoulliAttention,
    BinaryHammingAttention,
    BinarySGAttention,
    BinarySTEAttention,
)

__all__ = [
    "BinaryAttention",
    "BinaryBernoulliAttention",
    "BinaryHammingAttention",
    "BinarySGAttention",
    "BinarySTEAttention",
    "binary_attention",
    "binary_dot",
    "pack_signs",
]
