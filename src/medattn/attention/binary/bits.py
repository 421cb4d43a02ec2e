"""Bit-level kernel of BinaryFormer (Heinrich, MIDL 2025, eq. 2), with a tiled online softmax.

Signs are packed 64 to a ``uint64`` word (bit set where ``x >= 0``; the head dimension ``c`` is
padded to a multiple of 64 with cleared bits on both operands, so padding never counts). The binary
dot product of two packed rows is eq. (2)::

    <a, b> = c - 2 popcount(a xor b)

computed by Numba kernels that LLVM vectorises over keys (``llvm.ctpop``), parallel over query rows.
The integers are exact, so the scores equal the float emulation ``sgn(q) @ sgn(k)^T`` exactly.

:func:`binary_attention` is the whole forward ``softmax(S) V`` with
``S_ij = sum_(a,b) s * wq_a[i] * wk_b[j] * <qa_i, kb_j>`` over the (query term, key term) pairs of a
mechanism, in steps of (query rows x key tile) with the online softmax of Milakov & Gimelshein (2018):
a Numba kernel turns each tile's popcounts into probabilities (running maximum and sum per row), and
``P V`` is one batched GEMM per tile (PyTorch's BLAS), so no N x N matrix exists: besides the inputs
(O(B H N (d / 64 + D_v))) the memory is one probability tile (:data:`TILE_BUDGET` floats).
"""

from __future__ import annotations

import numpy as np
import torch
from llvmlite import ir
from numba import get_num_threads, njit, prange, types
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


_LOG2E = np.float32(1.4426950408889634)
_LN2 = np.float32(0.6931471805599453)
_ROWS = 8  # the fewest query rows per step
#: Finite stand-in for -inf (fast-math assumes no infinities): below any score, |score| <= c * sum |w|.
_NO_KEY = np.float32(-3.0e38)


_TWO = np.float32(2.0)  # float32 constants keep the vector loops in float32 (a Python 2 would promote to float64)


@njit(fastmath=True, cache=True)
def _score_row(qb, qw, kbT, kw, c, g, i, k0, cols, sr, h):  # pragma: no cover - compiled
    """``sr[:cols] = sum_(a,b) qw[a,g,i] kw[b,g,k0+j] (c - 2 popcount(qb[a,g,i] xor kb[b,g,k0+j]))``.

    Key rows are sliced before the loops: indexing ``kt[k0 + j]`` with a run-time ``k0`` makes Numba
    wrap negative indices element by element, which turned the vector loads into gathers (4x slower).
    """
    A, W, Bk = qb.shape[0], qb.shape[3], kbT.shape[0]
    for j in range(cols):
        sr[j] = 0.0
    for a in range(A):
        wa = qw[a, g, i]
        for b in range(Bk):
            kwb = kw[b, g, k0 : k0 + cols]
            kt = kbT[b, g, 0, k0 : k0 + cols]
            x = qb[a, g, i, 0]
            if W == 1:  # d <= 64: one word, no partial sums
                for j in range(cols):
                    sr[j] += wa * kwb[j] * (c - _TWO * np.float32(_popcount(x ^ kt[j])))
                continue
            for j in range(cols):
                h[j] = np.float32(_popcount(x ^ kt[j]))
            for t in range(1, W):  # words outer, keys inner: each pass is one vector loop
                x = qb[a, g, i, t]
                kt = kbT[b, g, t, k0 : k0 + cols]
                for j in range(cols):
                    h[j] += np.float32(_popcount(x ^ kt[j]))
            for j in range(cols):
                sr[j] += wa * kwb[j] * (c - _TWO * h[j])


@njit(fastmath=True, cache=True)
def _exp_row(sr, ex, cols, shift):  # pragma: no cover - compiled
    """``sr[:cols] = exp(sr - shift)`` as ``2^n e^z`` (n = round(x log2 e), |z| <= ln2 / 2, 7th-order
    Taylor, relative error < 1e-7), exponents clamped to [-126, 0] (a masked key may score above ``shift``;
    its exponent must not overflow the float's bits before it is multiplied by zero); branch-free, so LLVM
    vectorises it."""
    bits = sr.view(np.int32)
    for j in range(cols):
        y = min(max((sr[j] - shift) * _LOG2E, np.float32(-126.0)), np.float32(0.0))
        n = np.int32(y + np.float32(126.5)) - np.int32(126)  # round(y): truncation of a positive number
        z = (y - np.float32(n)) * _LN2
        q = np.float32(1.0 / 5040.0)
        q = q * z + np.float32(1.0 / 720.0)
        q = q * z + np.float32(1.0 / 120.0)
        q = q * z + np.float32(1.0 / 24.0)
        q = q * z + np.float32(1.0 / 6.0)
        q = q * z + np.float32(0.5)
        q = q * z + np.float32(1.0)
        sr[j] = q * z + np.float32(1.0)
        ex[j] = n
    for j in range(cols):
        bits[j] += ex[j] << 23


_LANES = 16  # partial maxima: a max over a row is a reduction LLVM does not vectorise by itself


@njit(fastmath=True, cache=True)
def _masked_max(sr, kg, cols, lanes):  # pragma: no cover - compiled
    """max of ``sr[j]`` over the keys with ``kg[j] > 0`` (``_NO_KEY`` if none), in ``_LANES`` partial maxima
    (``lanes``, scratch of that length)."""
    for lane in range(_LANES):
        lanes[lane] = _NO_KEY
    full = cols - cols % _LANES
    for j0 in range(0, full, _LANES):
        for lane in range(_LANES):
            x = sr[j0 + lane] if kg[j0 + lane] > 0 else _NO_KEY
            lanes[lane] = max(lanes[lane], x)
    best = _NO_KEY
    for j in range(full, cols):
        x = sr[j] if kg[j] > 0 else _NO_KEY
        best = max(best, x)
    for lane in range(_LANES):
        best = max(best, lanes[lane])
    return best


@njit(parallel=True, fastmath=True, cache=True)
def _softmax_tile_kernel(qb, qw, kbT, kw, keep, c, i0, rows, k0, cols, p, m, total, corr, chunks):  # pragma: no cover
    """Scores of query rows ``i0 : i0 + rows`` against keys ``k0 : k0 + cols`` and their online-softmax step.

    qb (A, G, N, W) uint64, qw (A, G, N) float32 (scale folded in), kbT (Bk, G, W, M) uint64,
    kw (Bk, G, M) float32, keep (G, M) float32 (1 = real key). Writes, for every group g and row r < rows:
    ``p[g, r, :cols] = exp(S - m_new)`` (0 for masked keys), ``corr[g, r] = exp(m_old - m_new)`` (the
    factor the caller applies to its accumulator), and updates the running maximum ``m`` and the running
    sum ``total`` (G, R) in place. Parallel over ``chunks`` chunks of (group, row) pairs; every loop over
    keys is branch-free, so LLVM vectorises it (``vpopcntq`` where the CPU has AVX-512 VPOPCNTDQ, a nibble
    table on AVX2).

    The kernel is compiled with fast-math, which lets LLVM assume that no value is infinite or NaN, so
    no infinity may appear: the running maximum starts at the finite ``_NO_KEY`` and masked keys score
    ``_NO_KEY``; a row whose key tiles so far were all padding keeps ``_NO_KEY`` and adds nothing.
    """
    steps = qb.shape[1] * rows
    chunks = min(steps, chunks)
    for chunk in prange(chunks):  # scratch is allocated once per chunk of rows, not per row
        h = np.empty(cols, np.float32)
        ex = np.empty(cols, np.int32)
        lanes = np.empty(_LANES, np.float32)
        for r in range(chunk * steps // chunks, (chunk + 1) * steps // chunks):
            g = r // rows
            rr = r - g * rows
            sr = p[g, rr]
            _score_row(qb, qw, kbT, kw, c, g, i0 + rr, k0, cols, sr, h)
            kg = keep[g, k0 : k0 + cols]
            tile_max = _masked_max(sr, kg, cols, lanes)
            m_old = m[g, rr]
            m_new = max(m_old, tile_max)
            # the first real key rescales nothing (the accumulator and total are still zero)
            scale = np.float32(np.exp(m_old - m_new)) if m_old != _NO_KEY else np.float32(0.0)
            corr[g, rr] = scale
            if m_new == _NO_KEY:  # no real key seen yet: nothing to add
                for j in range(cols):
                    sr[j] = 0.0
                continue
            _exp_row(sr, ex, cols, m_new)
            added = np.float32(0.0)
            for j in range(cols):
                sr[j] *= kg[j]
                added += sr[j]
            total[g, rr] = total[g, rr] * scale + added
            m[g, rr] = m_new


def pack_signs(x: torch.Tensor) -> np.ndarray:
    """Pack ``x >= 0`` along the last axis: (..., c) -> (..., ceil(c / 64)) uint64, padding bits cleared."""
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(f"cannot pack signs of a tensor of shape {tuple(x.shape)}")
    c = x.shape[-1]
    width = -(-c // WORD_BITS) * WORD_BITS
    bits = np.zeros((*x.shape[:-1], width), dtype=bool)
    bits[..., :c] = (x.detach() >= 0).cpu().numpy()
    return np.packbits(bits, axis=-1, bitorder="little").view(np.uint64)


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


Term = tuple[torch.Tensor, torch.Tensor | None]


#: Floats in the probability tile of one step (G groups x query rows x key tile): 4 MiB, cache-sized.
TILE_BUDGET = 1 << 20


def binary_attention(
    q_terms: list[Term],
    k_terms: list[Term],
    v: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None = None,
    tile_size: int = 1024,
    block_rows: int | None = None,
) -> torch.Tensor:
    """Tiled binary attention ``softmax(S) V`` with ``S = scale * sum_(a,b) (wq_a wk_b^T) * <sq_a, sk_b>``.

    q_terms / k_terms: lists of ``(signs, weights)`` with signs (B, H, N, c) (only ``>= 0`` matters)
    and weights (B, H, N) or None (= 1). v: (B, H, N, D_v). mask: (B, N) bool, True = real key.
    Returns (B, H, N, D_v) in ``v``'s dtype, computed in float32.

    Work goes in steps of ``block_rows`` query rows (default: as many as keep the probability tile of all
    B H groups within :data:`TILE_BUDGET` floats) times ``tile_size`` keys. Per step the Numba kernel
    :func:`_softmax_tile_kernel` computes the scores by popcount and their online-softmax probabilities
    ``P`` (Milakov & Gimelshein 2018), and the accumulator is updated by one batched GEMM,
    ``acc <- corr * acc + P V_tile`` (``torch.baddbmm``, PyTorch's BLAS). No N x N matrix exists: besides
    the inputs (O(B H N (d / 64 + D_v))) the memory is the tile (at most the budget, at least 8 rows).
    """
    if tile_size <= 0:
        raise ValueError(f"tile_size must be positive, got {tile_size}")
    if block_rows is not None and block_rows <= 0:
        raise ValueError(f"block_rows must be positive, got {block_rows}")
    if not q_terms or not k_terms:
        raise ValueError("binary_attention needs at least one query term and one key term")
    B, H, N, c = q_terms[0][0].shape
    G = B * H

    def stack(terms, weight_scale):
        bits = np.stack([pack_signs(signs.reshape(G, N, c)) for signs, _ in terms])  # (T, G, N, W)
        w = [torch.ones(G, N) if w is None else w.detach().float().cpu().reshape(G, N) for _, w in terms]
        return bits, (weight_scale * torch.stack(w)).contiguous().numpy()  # (T, G, N)

    qb, qw = stack(q_terms, scale)
    kb, kw = stack(k_terms, 1.0)
    kbT = np.ascontiguousarray(kb.transpose(0, 1, 3, 2))  # (Bk, G, W, N)
    keep = torch.ones(G, N) if mask is None else mask.cpu().float().repeat_interleave(H, dim=0)  # (G, N)
    keep = keep.contiguous().numpy()
    vf = v.detach().float().cpu().reshape(G, N, -1).contiguous()  # (G, N, D_v)
    tile = min(tile_size, N)
    rows = min(N, block_rows or max(_ROWS, TILE_BUDGET // (G * tile)))
    p = torch.empty(G, rows, tile)
    m, total, corr = np.empty((G, rows), np.float32), np.empty((G, rows), np.float32), torch.empty(G, rows)
    acc = torch.empty(G, rows, vf.shape[2])
    out = torch.empty_like(vf)
    p_np, corr_np, c32, chunks = p.numpy(), corr.numpy(), np.float32(c), 4 * get_num_threads()
    for i0 in range(0, N, rows):
        r = min(rows, N - i0)
        m[:, :r], total[:, :r] = _NO_KEY, 0.0
        acc.zero_()
        for k0 in range(0, N, tile):
            t = min(tile, N - k0)
            _softmax_tile_kernel(qb, qw, kbT, kw, keep, c32, i0, r, k0, t, p_np, m, total, corr_np, chunks)
            a = acc[:, :r]
            a.mul_(corr[:, :r, None]).baddbmm_(p[:, :r, :t], vf[:, k0 : k0 + t])
        out[:, i0 : i0 + r] = acc[:, :r] / torch.from_numpy(total[:, :r, None])
    return out.reshape(B, H, N, -1).to(device=v.device, dtype=v.dtype)
