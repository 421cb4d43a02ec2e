"""Triton kernels of the SeqNorm core: the CUDA implementation of ``medattn::seqnorm_core`` and its backward.

The maths is :mod:`medattn.attention.seqnorm_fused`'s raw-moment path (its module docstring); the small (d x d) steps
between the kernels are :mod:`.seqnorm_maths`'s (:func:`~.seqnorm_maths._output_map` and its backward, imported).
What reads the (B, H, N, d) tensors are two kernels:

* :func:`token_sums` (``_token_sums_kernel``): per (batch, head) and channel, over the real tokens, the sums and
  sums of squares of x and y and the cross product ``x^T W y`` (d x D_v), in float32, each program over a run of
  :data:`TOKENS_PER_PROGRAM` tokens in tiles of :data:`BLOCK_N` (partial sums added up afterwards: no atomics, the
  same result every run);
* :func:`row_map` (``_row_map_kernel``): per token tile, ``out = W (y M + c + x * e)`` with a (D_y x D_o) matrix M
  and vectors c, e per (batch, head).

Forward (:func:`triton_seqnorm_forward`): sums of q; sums of k, v and ``G_kv = K^T W V``; then
``out = W (Q A_q + b)``: three passes over q, k, v, one write. Backward (:func:`triton_seqnorm_backward`):
``Q^T W g`` and ``sum W g``, then ``dq = W (g A_q^T + dS_q + 2 q dSq_q)``, ``dk = W (V dG^T + dS_k + 2 k dSq_k)``,
``dv = W (K dG + dS_v + 2 v dSq_v)``. For bf16 inputs each channel is first shifted by its mean rounded to bf16 and
the operands of the products are rounded to bf16, as in the PyTorch bf16 core (same shifts, same outputs); sums
stay float32 throughout (:mod:`.triton_common`). Where the moments are ill-conditioned, for other dtypes or widths
(:func:`~.triton_support.fits`) and inside :func:`~.triton_support.kernels_off`, the PyTorch core runs instead.

Both functions take and return exactly what the operators do, on any device: CUDA tensors, or CPU tensors under
Triton's interpreter (the tests). On CUDA they are the operators' kernels (the registration is in
:mod:`.seqnorm_fused`).
"""

from __future__ import annotations

import torch

from .seqnorm_fused import _LIBRARY, _core, _core_backward, _count, _ill_conditioned, _shift, keeps_dtype
from .seqnorm_maths import _output_map, _output_map_backward, affine_views
from .triton_common import LAUNCH, block, dot, load_tile, low_products, rounded, store_tile, tl, token_weights, triton
from .triton_support import fits, switched_off

#: Tokens per tile of every kernel.
BLOCK_N = 64
#: Tokens summed by one program of :func:`token_sums` (a multiple of :data:`BLOCK_N`): enough programs to fill a GPU
#: at N = 4,096 with 8 heads, partial sums of (N / 256) x d x D_v floats per head.
TOKENS_PER_PROGRAM = 256


@triton.jit
def _centred(tile, shift_ptr, g, cols, D, w, SHIFT: tl.constexpr):
    """A tile (R, C) as the core computes with it, float32: minus its channels' shift (row g of a (B*H, D) tensor),
    rounded to the tile's dtype, where ``SHIFT``; times the token weights w (R,)."""
    x = tile.to(tl.float32)
    if SHIFT:
        shift = tl.load(shift_ptr + g * D + cols, mask=cols < D, other=0.0).to(tl.float32)
        x = rounded(x - shift[None, :], tile.dtype)
    return x * w[:, None]


@triton.jit
def _token_sums_kernel(x_ptr, y_ptr, w_ptr, shift_x_ptr, shift_y_ptr, stats_x_ptr, stats_y_ptr, cross_ptr,
                       H, N, DX, DY, TOKENS, SPLITS,
                       sxb, sxh, sxn, sxd, syb, syh, syn, syd,
                       HAS_W: tl.constexpr, SHIFT_X: tl.constexpr, SHIFT_Y: tl.constexpr, Y_MOMENTS: tl.constexpr,
                       CROSS: tl.constexpr, LOW: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_X: tl.constexpr, BLOCK_Y: tl.constexpr):
    """Program (g, split): over tokens ``split * TOKENS`` up to the next run (or N) of head g = b * H + h, the
    partial ``sum w x``, ``sum w x^2`` (-> stats_x[g, split, 0:2]), ``sum w y`` and, with ``Y_MOMENTS = 2``,
    ``sum w y^2`` (-> stats_y[g, split]), and with ``CROSS`` ``x^T W y`` (-> cross[g, split], DX x DY)."""
    g, split = tl.program_id(0), tl.program_id(1)
    b, h = g // H, g % H
    cx, cy = tl.arange(0, BLOCK_X), tl.arange(0, BLOCK_Y)
    sum_x, sq_x = tl.zeros([BLOCK_X], tl.float32), tl.zeros([BLOCK_X], tl.float32)
    sum_y, sq_y = tl.zeros([BLOCK_Y], tl.float32), tl.zeros([BLOCK_Y], tl.float32)
    cross = tl.zeros([BLOCK_X, BLOCK_Y], tl.float32)
    for start in range(split * TOKENS, tl.minimum(split * TOKENS + TOKENS, N), BLOCK_N):
        rows = start + tl.arange(0, BLOCK_N)
        w = token_weights(w_ptr, b, rows, N, HAS_W)
        x = _centred(load_tile(x_ptr, b, h, rows, cx, N, DX, sxb, sxh, sxn, sxd), shift_x_ptr, g, cx, DX, w, SHIFT_X)
        sum_x += tl.sum(x, axis=0)
        sq_x += tl.sum(x * x, axis=0)
        if Y_MOMENTS > 0 or CROSS:
            y = _centred(load_tile(y_ptr, b, h, rows, cy, N, DY, syb, syh, syn, syd), shift_y_ptr, g, cy, DY, w,
                         SHIFT_Y)
            sum_y += tl.sum(y, axis=0)
            sq_y += tl.sum(y * y, axis=0)
            if CROSS:
                cross += dot(tl.trans(x), y, LOW)
    slot = g * SPLITS + split
    tl.store(stats_x_ptr + (2 * slot) * DX + cx, sum_x, mask=cx < DX)
    tl.store(stats_x_ptr + (2 * slot + 1) * DX + cx, sq_x, mask=cx < DX)
    if Y_MOMENTS > 0:
        tl.store(stats_y_ptr + (Y_MOMENTS * slot) * DY + cy, sum_y, mask=cy < DY)
    if Y_MOMENTS > 1:
        tl.store(stats_y_ptr + (Y_MOMENTS * slot + 1) * DY + cy, sq_y, mask=cy < DY)
    if CROSS:
        tl.store(cross_ptr + slot * DX * DY + cx[:, None] * DY + cy[None, :], cross,
                 mask=(cx < DX)[:, None] & (cy < DY)[None, :])


@triton.jit
def _row_map_kernel(y_ptr, m_ptr, c_ptr, x_ptr, e_ptr, w_ptr, shift_y_ptr, shift_x_ptr, out_ptr,
                    H, N, DY, DO,
                    syb, syh, syn, syd, sxb, sxh, sxn, sxd, sob, soh, son, sod,
                    HAS_W: tl.constexpr, SHIFT_Y: tl.constexpr, SHIFT_X: tl.constexpr, HAS_X: tl.constexpr,
                    LOW: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_Y: tl.constexpr, BLOCK_O: tl.constexpr):
    """Program (tile, g): ``out = w (y M + c + x * e)`` for a tile of tokens of head g; M (DY x DO), c and e (DO,)
    of head g (float32; M rounded to y's dtype for the product), y and x centred as in :func:`_centred`."""
    tile, g = tl.program_id(0), tl.program_id(1)
    b, h = g // H, g % H
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    cy, co = tl.arange(0, BLOCK_Y), tl.arange(0, BLOCK_O)
    w = token_weights(w_ptr, b, rows, N, HAS_W)
    y_tile = load_tile(y_ptr, b, h, rows, cy, N, DY, syb, syh, syn, syd)
    m = tl.load(m_ptr + g * DY * DO + cy[:, None] * DO + co[None, :],
                mask=(cy < DY)[:, None] & (co < DO)[None, :], other=0.0)
    out = dot(_centred(y_tile, shift_y_ptr, g, cy, DY, w, SHIFT_Y), rounded(m, y_tile.dtype), LOW)
    out += tl.load(c_ptr + g * DO + co, mask=co < DO, other=0.0)[None, :]
    if HAS_X:
        x = _centred(load_tile(x_ptr, b, h, rows, co, N, DO, sxb, sxh, sxn, sxd), shift_x_ptr, g, co, DO, w, SHIFT_X)
        out += x * tl.load(e_ptr + g * DO + co, mask=co < DO, other=0.0)[None, :]
    store_tile(out_ptr, out * w[:, None], b, h, rows, co, N, DO, sob, soh, son, sod)


def _per_head(t: torch.Tensor, B: int, H: int) -> torch.Tensor:
    """A small per-head tensor (B or 1, H, ...) as a contiguous float32 (B * H, ...) for the kernels."""
    return t.float().expand(B, H, *t.shape[2:]).reshape(B * H, *t.shape[2:]).contiguous()


def _flat_weights(weights: torch.Tensor | None) -> torch.Tensor | None:
    """The operator's 0/1 weights (B, 1, N, 1) as a contiguous float32 (B, N), or None."""
    return None if weights is None else weights.reshape(weights.shape[0], -1).float().contiguous()


def token_sums(x, shift_x, weights, y=None, shift_y=None, y_moments=0, cross=False):
    """Sums over the real tokens, float32, each (B, H, 1, width) or (B, H, D_x, D_y):
    ``(sum w x, sum w x^2, sum w y or None, sum w y^2 or None, x^T W y or None)``.

    x (B, H, N, D_x), y (B, H, N, D_y) (any strides), ``weights`` 0/1 (B, N) float32 or None, ``shift_x`` /
    ``shift_y`` (B, H, 1, width) in the tensor's dtype or None: subtracted first (rounded to that dtype).
    ``y_moments``: 0, 1 (sums) or 2 (sums and squares) of y; ``cross``: the cross product too.
    """
    B, H, N, DX = x.shape
    other = x if y is None else y
    DY, G, splits = other.shape[-1], B * H, triton.cdiv(N, TOKENS_PER_PROGRAM)
    stats_x = torch.empty(G, splits, 2, DX, dtype=torch.float32, device=x.device)
    stats_y = torch.empty(G, splits, y_moments, DY, dtype=torch.float32, device=x.device) if y_moments else stats_x
    products = torch.empty(G, splits, DX, DY, dtype=torch.float32, device=x.device) if cross else stats_x
    _token_sums_kernel[(G, splits)](
        x, other, x if weights is None else weights, x if shift_x is None else shift_x.contiguous(),
        x if shift_y is None else shift_y.contiguous(), stats_x, stats_y, products,
        H, N, DX, DY, TOKENS_PER_PROGRAM, splits, *x.stride(), *other.stride(),
        HAS_W=weights is not None, SHIFT_X=shift_x is not None, SHIFT_Y=shift_y is not None, Y_MOMENTS=y_moments,
        CROSS=cross, LOW=low_products(x), BLOCK_N=BLOCK_N, BLOCK_X=block(DX), BLOCK_Y=block(DY), **LAUNCH)
    sums_x = stats_x.sum(dim=1).view(B, H, 2, DX)
    sums_y = stats_y.sum(dim=1).view(B, H, y_moments, DY) if y_moments else None
    out = [sums_x[:, :, i:i + 1].contiguous() for i in range(2)]
    out += [sums_y[:, :, i:i + 1].contiguous() if i < y_moments else None for i in range(2)]
    return (*out, products.sum(dim=1).view(B, H, DX, DY) if cross else None)


def row_map(y, shift_y, m, c, weights, x=None, shift_x=None, e=None):
    """``out = W ((y - shift_y) M + c + (x - shift_x) * e)`` -> (B, H, N, D_o) in x's dtype (y's without x).

    y (B, H, N, D_y), x (B, H, N, D_o) (any strides), M (B or 1, H, D_y, D_o), c and e (B or 1, H, 1, D_o) (float32,
    any layout), ``weights`` 0/1 (B, N) float32 or None, shifts as in :func:`token_sums`.
    """
    B, H, N, DY = y.shape
    DO = m.shape[-1]
    like = y if x is None else x
    out = torch.empty(B, H, N, DO, dtype=like.dtype, device=y.device)
    _row_map_kernel[(triton.cdiv(N, BLOCK_N), B * H)](
        y, _per_head(m, B, H), _per_head(c, B, H), like, c if e is None else _per_head(e, B, H),
        y if weights is None else weights, y if shift_y is None else shift_y.contiguous(),
        y if shift_x is None else shift_x.contiguous(), out, H, N, DY, DO, *y.stride(), *like.stride(), *out.stride(),
        HAS_W=weights is not None, SHIFT_Y=shift_y is not None, SHIFT_X=shift_x is not None, HAS_X=x is not None,
        LOW=low_products(y), BLOCK_N=BLOCK_N, BLOCK_Y=block(DY), BLOCK_O=block(DO), **LAUNCH)
    return out


def _takes(*tensors: torch.Tensor) -> bool:
    """Whether the kernels serve these tensors (one dtype they take, widths that fit, not switched off)."""
    return not switched_off() and fits(*tensors) and len({t.dtype for t in tensors}) == 1


def triton_seqnorm_forward(q, k, v, gq, bq, gk, bk, gv, bv, weights, eps):
    """``medattn::seqnorm_core`` by the kernels: q, k (B, H, N, d), v (B, H, N, D_v) float32 or bf16, the six
    affines (H * d_t,), ``weights`` (B, 1, N, 1) 0/1 or None, ``eps`` (3 floats) -> the operator's tuple
    ``(out, S_q, Sq_q, S_k, Sq_k, S_v, Sq_v, G_kv, centred, shift_q, shift_k, shift_v)``: out = W Q' (K'^T V') / n
    (B, H, N, D_v) in q's dtype, the raw moments (of the shifted tensors for bf16) in float32, the path flag and
    the shifts (zero for float32). Ill-conditioned moments, other dtypes and widths: the PyTorch core."""
    if not _takes(q, k, v):
        return _core(q, k, v, gq, bq, gk, bk, gv, bv, weights, eps)
    count, w = _count(q, weights), _flat_weights(weights)
    shifts = tuple(_shift(x, weights, count) for x in (q, k, v))
    shift_q, shift_k, shift_v = shifts if keeps_dtype(q) else (None, None, None)
    s_q, sq_q, *_ = token_sums(q, shift_q, w)
    s_k, sq_k, s_v, sq_v, g_kv = token_sums(k, shift_k, w, v, shift_v, y_moments=2, cross=True)
    moments = (s_q, sq_q, s_k, sq_k, s_v, sq_v, g_kv)
    if _ill_conditioned(moments, count):
        return _core(q, k, v, gq, bq, gk, bk, gv, bv, weights, eps)
    a_q, b = _output_map(moments, count, affine_views((gq, bq, gk, bk, gv, bv), s_q), eps)
    out = row_map(q, shift_q, a_q, b, w)
    return (out, *moments, q.new_zeros((), dtype=torch.bool), *shifts)


def triton_seqnorm_backward(grad_out, q, k, v, gq, bq, gk, bk, gv, bv, weights, eps, s_q, sq_q, s_k, sq_k, s_v,
                            sq_v, g_kv, centred, shift_q, shift_k, shift_v):
    """``medattn::seqnorm_core_backward`` by the kernels: from the forward's inputs and saved outputs and the
    output's gradient -> gradients of q, k, v (their dtype) and of the six affines (H * d_t,). The centred path,
    other dtypes and widths: the PyTorch backward."""
    params, moments = (gq, bq, gk, bk, gv, bv), (s_q, sq_q, s_k, sq_k, s_v, sq_v, g_kv)
    if bool(centred) or not _takes(grad_out, q, k, v):
        return _core_backward(grad_out, q, k, v, *params, weights, eps, *moments, centred, shift_q, shift_k, shift_v)
    count, affines, w = _count(q, weights), affine_views(params, s_q), _flat_weights(weights)
    if not keeps_dtype(q):
        shift_q = shift_k = shift_v = None
    _, _, total, _, cross = token_sums(q, shift_q, w, grad_out, y_moments=1, cross=True)  # Q^T W g, sum W g
    a_q, _ = _output_map(moments, count, affines, eps)
    (d_s_q, d_sq_q, d_s_k, d_sq_k, d_s_v, d_sq_v, d_gkv), d_affines = _output_map_backward(
        moments, count, affines, eps, cross, total)
    grad_q = row_map(grad_out, None, a_q.transpose(-2, -1), d_s_q, w, q, shift_q, 2 * d_sq_q)
    grad_k = row_map(v, shift_v, d_gkv.transpose(-2, -1), d_s_k, w, k, shift_k, 2 * d_sq_k)
    grad_v = row_map(k, shift_k, d_gkv, d_s_v, w, v, shift_v, 2 * d_sq_v)
    return (grad_q, grad_k, grad_v, *(d.sum(dim=0).reshape(p.shape).to(p.dtype) for d, p in zip(d_affines, params)))


#: The operators and the kernels that implement them (looked up by name at each call, so a test may wrap them).
OPERATORS = {"seqnorm_core": "triton_seqnorm_forward", "seqnorm_core_backward": "triton_seqnorm_backward"}


def register(device_type: str = "CUDA", library: torch.library.Library = _LIBRARY) -> None:
    """Make the kernels the implementation of ``medattn::seqnorm_core`` and its backward on ``device_type``:
    on CUDA when :mod:`medattn.attention.seqnorm` is imported where :func:`.triton_support.available` holds; the
    tests register them for the CPU, under Triton's interpreter, in a scoped ``library``."""
    for operator, kernel in OPERATORS.items():
        library.impl(operator, lambda *args, kernel=kernel: globals()[kernel](*args), device_type)
