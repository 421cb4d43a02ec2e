"""Signs packed 64 to a ``uint64`` word and the binary dot product of BinaryFormer (Heinrich, MIDL 2025, eq. 2).

A bit is set where ``x >= 0``; the head dimension ``c`` is padded to a multiple of 64 with cleared bits on both
operands, so padding never counts. The binary dot product of two packed rows is eq. (2)::

    <a, b> = c - 2 popcount(a xor b)

:func:`pack_signs` packs (reading a tensor where it lies, :func:`storage_rows`), :func:`binary_dot` computes every
product of two packed sets of rows (a Numba kernel that LLVM vectorises over keys with ``llvm.ctpop``). The
whole attention forward on packed signs is :func:`medattn.attention.binary.bits.binary_attention`.
"""

from __future__ import annotations

import numpy as np
import torch
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

WORD_BITS = 64


@intrinsic
def _popcount(typingctx, x):
    """``llvm.ctpop.i64`` on a uint64, returned as int64 (a count fits easily)."""
    signature = types.int64(types.uint64)

    def codegen(context, builder, sig, args):
        fn = builder.module.declare_intrinsic("llvm.ctpop", [ir.IntType(64)])
        return builder.call(fn, args)

    return signature, codegen


@njit(parallel=True, fastmath=True, cache=True)
def _dot_kernel(a, bT, c, out):  # pragma: no cover - compiled
    """a (G, N, W) uint64, bT (G, W, M) uint64 -> out (G, N, M) integer: c - 2 popcount(a xor b)."""
    G, N, W = a.shape
    M = bT.shape[2]
    for r in prange(G * N):
        g = r // N
        i = r - g * N
        row = out[g, i]
        x = a[g, i, 0]
        b0 = bT[g, 0]
        if W == 1:
            for j in range(M):
                row[j] = c - 2 * _popcount(x ^ b0[j])
            continue
        for j in range(M):
            row[j] = _popcount(x ^ b0[j])
        for t in range(1, W):
            x = a[g, i, t]
            bt = bT[g, t]
            for j in range(M):
                row[j] += _popcount(x ^ bt[j])
        for j in range(M):
            row[j] = c - 2 * row[j]


def storage_rows(x: torch.Tensor) -> tuple[torch.Tensor, np.ndarray, np.ndarray, list[int]]:
    """Rows of ``x`` (..., c) as slices of one flat array, in the order they lie in memory.

    Returns ``(rows, flat, starts, order)``: ``rows`` is ``x`` with its leading axes permuted by ``order``
    (largest stride first), so that its row-major order is the memory order; row ``r`` of ``rows`` (flattened
    over the leading axes) is ``flat[starts[r] : starts[r] + c]``. ``flat`` is a 1-d NumPy view of ``x``'s
    storage (no copy unless the last axis is strided). Numba kernels index ``flat`` with C-contiguous slices,
    which vectorise; reading in memory order keeps a permuted view of a QKV projection (rows 6 KiB apart
    in head order) a forward stream: 1.1 ms instead of 2.7 to pack the (8, 4,096, 64) queries.
    """
    x = x if x.stride(-1) == 1 else x.contiguous()
    lead, strides = x.shape[:-1], x.stride()[:-1]
    order = sorted(range(len(lead)), key=lambda axis: -strides[axis])
    rows = x.permute(*order, x.ndim - 1)
    starts = torch.zeros(rows.shape[:-1], dtype=torch.int64)
    for axis, (size, stride) in enumerate(zip(rows.shape[:-1], rows.stride()[:-1])):
        starts += (torch.arange(size) * stride).view([size if a == axis else 1 for a in range(rows.ndim - 1)])
    starts = starts.reshape(-1)
    length = int(starts.max()) + x.shape[-1] if starts.numel() else 0
    flat = x.as_strided((length,), (1,))
    return rows, flat.numpy(), starts.numpy(), order


@njit(parallel=True, cache=True)
def _pack_kernel(flat, starts, c, out):  # pragma: no cover - compiled
    """Row ``r`` = ``flat[starts[r] : starts[r] + c]`` -> out[r] (W uint32): bit ``b`` of word ``w`` set where
    ``row[32 w + b] >= 0``; bits past ``c`` cleared. Parallel over rows."""
    W = out.shape[1]
    for r in prange(starts.size):
        row = flat[starts[r] : starts[r] + c]
        for w in range(W):
            word = np.uint32(0)
            for bit in range(min(32, max(0, c - 32 * w))):
                if row[32 * w + bit] >= 0:
                    word |= np.uint32(1) << np.uint32(bit)
            out[r, w] = word


def pack_signs(x: torch.Tensor) -> np.ndarray:
    """Pack ``x >= 0`` along the last axis: (..., c) -> (..., ceil(c / 64)) uint64, padding bits cleared.

    One pass over ``x`` where it lies, in memory order (:func:`storage_rows`): a permuted view of a QKV
    projection is read without a copy."""
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(f"cannot pack signs of a tensor of shape {tuple(x.shape)}")
    c = x.shape[-1]
    x = x.detach().cpu()
    if x.dtype not in (torch.float32, torch.float64):
        x = x.float()
    rows, flat, starts, order = storage_rows(x)
    out = np.empty((starts.size, 2 * -(-c // WORD_BITS)), np.uint32)
    _pack_kernel(flat, starts, c, out)
    packed = out.view(np.uint64).reshape(*rows.shape[:-1], out.shape[1] // 2)  # leading axes in memory order
    return np.ascontiguousarray(packed.transpose(*np.argsort(order), len(order)))


def smallest_exact_int(c: int) -> type:
    """The smallest NumPy integer type holding every binary dot product of ``c`` bits (|<a, b>| <= c)."""
    for dtype in (np.int8, np.int16, np.int32):
        if c <= np.iinfo(dtype).max:
            return dtype
    raise ValueError(f"head dimension {c} is too large for the bit kernel")


def binary_dot(a: np.ndarray, b: np.ndarray, c: int, out: np.ndarray | None = None) -> np.ndarray:
    """All binary dot products ``c - 2 popcount(a_i xor b_j)`` of packed rows.

    a: (G, N, W) uint64, b: (G, M, W) uint64 (as from :func:`pack_signs`), c: the unpadded bit count.
    Returns (G, N, M) in :func:`smallest_exact_int` of ``c`` (or ``out``, which must hold that range).
    """
    _check_packed(a, b, c)
    bT = np.ascontiguousarray(b.transpose(0, 2, 1))  # (G, W, M)
    if out is None:
        out = np.empty((a.shape[0], a.shape[1], b.shape[1]), dtype=smallest_exact_int(c))
    _dot_kernel(np.ascontiguousarray(a), bT, c, out)
    return out


def _check_packed(a: np.ndarray, b: np.ndarray, c: int) -> None:
    if a.dtype != np.uint64 or b.dtype != np.uint64 or a.ndim != 3 or b.ndim != 3:
        raise ValueError("packed operands must be (G, N, W) uint64 arrays from pack_signs")
    if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[2]:
        raise ValueError(f"packed shapes {a.shape} and {b.shape} do not match in G or W")
    if not 0 < c <= a.shape[2] * WORD_BITS:
        raise ValueError(f"bit count c={c} does not fit {a.shape[2]} words")
