"""BinaryFormer: 1-bit Hamming self-attention (Heinrich, MIDL 2025) with a packed-bit CPU kernel.

Registry names: ``binary-ste``, ``binary-sg``, ``binary-hamming``, ``binary-bernoulli``.
"""

from .bits import binary_attention
from .core import BinaryAttention
from .mechanisms import (
    BinaryBernoulliAttention,
    BinaryHammingAttention,
    BinarySGAttention,
    BinarySTEAttention,
)
from .packing import binary_dot, pack_signs

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
