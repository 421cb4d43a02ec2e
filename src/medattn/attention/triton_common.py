"""What the Triton kernels of :mod:`.triton_seqnorm` and :mod:`.triton_bits` share: block widths, the product rule
and the tile loads of (B, H, N, d) tensors.

Importing this module needs ``triton`` (otherwise a one-line error says to install it).

**Products.** Every ``tl.dot`` goes through :func:`dot`, whose operands hold float32 values; for bf16 inputs
they are first rounded to bf16 (to nearest, :func:`rounded`), as the PyTorch bf16 core rounds its operands. On CUDA
such a product runs as a bf16 tensor-core product accumulated in float32 (``LOW``), which gives the same sums as
float32 products of the rounded values (a product of two bf16 numbers is exact in float32). Triton's interpreter,
which runs the kernels on CPU tensors in the tests, takes the float32 form: its bf16 ``tl.dot`` multiplies the bf16
bit patterns as integers (Triton 3.9). float32 products are IEEE float32 (no TF32), for float32 accuracy.

**Launches** take :data:`LAUNCH` (no FMA contraction): what the GPU computes outside ``tl.dot`` is then rounded step by
step as under the interpreter, whose results the tests check.
"""

from __future__ import annotations

import torch

from medattn.extras import require

from .triton_support import MAX_WIDTH

triton = require("triton", "running the Triton kernels")
tl = require("triton.language", "running the Triton kernels")

#: Options of every launch: a multiply and an add stay two roundings (no FMA), as in Triton's interpreter. Stated,
#: since Triton 3.9 warns where it is left to its default (which 3.10 changes to this).
LAUNCH = {"enable_fp_fusion": False}


def block(width: int) -> int:
    """The tile width for ``width`` channels: the next power of two, at least 16 (``tl.dot``'s smallest);
    channels past ``width`` are masked."""
    if not 0 < width <= MAX_WIDTH:
        raise ValueError(f"the Triton kernels take widths 1 to {MAX_WIDTH}, got {width}")
    return max(16, triton.next_power_of_2(width))


def low_products(x: torch.Tensor) -> bool:
    """Whether the products of x's kernels run as bf16 tensor-core products: x is bf16 on CUDA (module docstring)."""
    return x.dtype == torch.bfloat16 and x.is_cuda


@triton.jit
def dot(a, b, LOW: tl.constexpr):
    """``a @ b`` accumulated in float32; a (M, K), b (K, N) float32 holding bf16-exact values where ``LOW``."""
    if LOW:
        product = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    else:
        product = tl.dot(a, b, input_precision="ieee")
    return product


@triton.jit
def rounded(x, DTYPE: tl.constexpr):
    """x (float32) rounded to the nearest (ties to even) ``DTYPE`` value, held in float32: what a product or a
    store in that dtype sees. Written out on the bits for bf16, since Triton's interpreter truncates in casts
    from float32 to bf16 (the GPU rounds to nearest)."""
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x


@triton.jit
def load_tile(ptr, b, h, rows, cols, N, D, sb, sh, sn, sd):
    """Rows ``rows`` (R,) and channels ``cols`` (C,) of head (b, h) of a (B, H, N, D) tensor with strides
    (sb, sh, sn, sd), in its own dtype; zero outside (N, D)."""
    mask = (rows < N)[:, None] & (cols < D)[None, :]
    return tl.load(ptr + b * sb + h * sh + rows[:, None] * sn + cols[None, :] * sd, mask=mask, other=0.0)


@triton.jit
def store_tile(ptr, value, b, h, rows, cols, N, D, sb, sh, sn, sd):
    """Write ``value`` (R, C) float32 to the rows and channels of head (b, h) of a (B, H, N, D) tensor, inside
    (N, D), rounded to its dtype."""
    mask = (rows < N)[:, None] & (cols < D)[None, :]
    dtype = ptr.dtype.element_ty
    tl.store(ptr + b * sb + h * sh + rows[:, None] * sn + cols[None, :] * sd, rounded(value, dtype).to(dtype),
             mask=mask)


@triton.jit
def token_weights(w_ptr, b, rows, N, HAS_W: tl.constexpr):
    """The 0/1 weights (R,) float32 of ``rows`` of sequence b from a (B, N) tensor (all ones without one); zero
    past N."""
    if HAS_W:
        w = tl.load(w_ptr + b * N + rows, mask=rows < N, other=0.0).to(tl.float32)
    else:
        w = (rows < N).to(tl.float32)
    return w
