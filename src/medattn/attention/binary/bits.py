"""Bit-level kernel of BinaryFormer (Heinrich, MIDL 2025, eq. 2), with a tiled online softmax.

Signs are packed 64 to a ``uint64`` word (bit set where ``x >= 0``; the head dimension ``c`` is
padded to a multiple of 64 with cleared bits on both operands, so padding never counts). The binary
dot product of two packed rows is eq. (2)::

    <a, b> = c - 2 popcount(a xor b)

computed by Numba kernels that LLVM vectorises over keys (``llvm.ctpop``), parallel over query rows.
The integers are exact, so the scores equal the float emulation ``sgn(q) @ sgn(k)^T`` exactly.

:func:`binary_attention` is the whole forward ``softmax(S) V`` with
``S_ij = sum_(a,b) s * wq_a[i] * wk_b[j] * <qa_i, kb_j>`` over the (query term, key term) pairs of a
mechanism, fused in one Numba kernel: each block of 8 query rows walks the key tiles with the online
softmax of Milakov & Gimelshein (2018), so no N x N matrix exists: besides the inputs
(O(B H N (d / 64 + D_v))) each thread holds O(8 (T + D_v)) floats for tile size T.
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


_LOG2E = np.float32(1.4426950408889634)
_LN2 = np.float32(0.6931471805599453)
_ROWS = 8  # query rows per parallel iteration: each loaded key/value row serves all of them
#: Finite stand-in for -inf (fast-math assumes no infinities): below any score, |score| <= c * sum |w|.
_NO_KEY = np.float32(-3.0e38)


@njit(parallel=True, fastmath=True, cache=True)
def _attention_kernel(qb, qw, kbT, kw, keep, v, c, tile, out):  # pragma: no cover - compiled
    """Fused tiled online-softmax attention over packed terms, ``_ROWS`` query rows per parallel step.

    qb (A, G, N, W) uint64, qw (A, G, N) float32 (scale folded in), kbT (Bk, G, W, M) uint64,
    kw (Bk, G, M) float32, keep (G, M) float32 (1 = real key), v (G, M, Dv) float32 -> out (G, N, Dv).
    ``exp`` is computed as ``2^n e^z`` (n = round(x log2 e), |z| <= ln2 / 2, 7th-order Taylor,
    relative error < 1e-8) so that LLVM vectorises it; arguments are clamped at 2^-126.

    The kernel is compiled with fast-math, which lets LLVM assume that no value is infinite or NaN, so
    no infinity may appear: the running maximum starts at the finite ``_NO_KEY`` and masked keys score
    ``_NO_KEY``; a row whose key tiles so far were all padding keeps ``_NO_KEY`` and adds nothing.
    """
    A, G, N, W = qb.shape
    Bk = kbT.shape[0]
    M = kbT.shape[3]
    Dv = v.shape[2]
    blocks = (N + _ROWS - 1) // _ROWS
    for r in prange(G * blocks):
        g = r // blocks
        i0 = (r - g * blocks) * _ROWS
        rows = min(_ROWS, N - i0)
        s = np.empty((rows, tile), np.float32)
        h = np.empty(tile, np.float32)
        p = np.empty((rows, tile), np.float32)
        ex = np.empty(tile, np.int32)
        acc = np.zeros((rows, Dv), np.float32)
        m = np.full(rows, _NO_KEY, np.float32)
        total = np.zeros(rows, np.float32)
        kg = keep[g]
        vg = v[g]
        for k0 in range(0, M, tile):
            tk = min(tile, M - k0)
            for rr in range(rows):
                i = i0 + rr
                sr = s[rr]
                for j in range(tk):
                    sr[j] = 0.0
                for a in range(A):
                    for b in range(Bk):
                        for j in range(tk):
                            h[j] = 0.0
                        for t in range(W):
                            x = qb[a, g, i, t]
                            kt = kbT[b, g, t]
                            for j in range(tk):
                                h[j] += np.float32(_popcount(x ^ kt[k0 + j]))
                        wa = qw[a, g, i]
                        kwb = kw[b, g]
                        for j in range(tk):
                            sr[j] += wa * kwb[k0 + j] * (c - 2 * h[j])
                tile_max = _NO_KEY
                for j in range(tk):  # branch-free so that it vectorises
                    x = sr[j] if kg[k0 + j] > 0 else _NO_KEY
                    tile_max = x if x > tile_max else tile_max
                m_new = max(m[rr], tile_max)
                if m_new == _NO_KEY:  # no real key seen yet: nothing to add
                    p[rr, :tk] = 0.0
                    continue
                # the first real key rescales nothing (acc and total are still zero)
                corr = np.float32(np.exp(m[rr] - m_new)) if m[rr] != _NO_KEY else np.float32(0.0)
                total[rr] *= corr
                for e in range(Dv):
                    acc[rr, e] *= corr
                pr = p[rr]
                bits = pr.view(np.int32)
                for j in range(tk):  # vectorisable exp(s - m_new) = 2^n e^z
                    y = max((sr[j] - m_new) * _LOG2E, np.float32(-126.0))
                    n = np.floor(y + np.float32(0.5))
                    z = (y - n) * _LN2
                    q = np.float32(1.0 / 5040.0)
                    q = q * z + np.float32(1.0 / 720.0)
                    q = q * z + np.float32(1.0 / 120.0)
                    q = q * z + np.float32(1.0 / 24.0)
                    q = q * z + np.float32(1.0 / 6.0)
                    q = q * z + np.float32(0.5)
                    q = q * z + np.float32(1.0)
                    pr[j] = q * z + np.float32(1.0)
                    ex[j] = np.int32(n)
                for j in range(tk):
                    bits[j] += ex[j] << 23
                for j in range(tk):
                    pr[j] *= kg[k0 + j]
                    total[rr] += pr[j]
                m[rr] = m_new
            for j in range(tk):  # P V: each value row is loaded once for all rows of the block
                vj = vg[k0 + j]
                for rr in range(rows):
                    pj = p[rr, j]
                    for e in range(Dv):
                        acc[rr, e] += pj * vj[e]
        for rr in range(rows):
            for e in range(Dv):
                out[g, i0 + rr, e] = acc[rr, e] / total[rr]


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


def binary_attention(
    q_terms: list[Term],
    k_terms: list[Term],
    v: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None = None,
    tile_size: int = 1024,
) -> torch.Tensor:
    """Tiled binary attention ``softmax(S) V`` with ``S = scale * sum_(a,b) (wq_a wk_b^T) * <sq_a, sk_b>``.

    q_terms / k_terms: lists of ``(signs, weights)`` with signs (B, H, N, c) (only ``>= 0`` matters)
    and weights (B, H, N) or None (= 1). v: (B, H, N, D_v). mask: (B, N) bool, True = real key.
    Returns (B, H, N, D_v) in ``v``'s dtype, computed in float32 over key tiles of ``tile_size``.
    """
    if tile_size <= 0:
        raise ValueError(f"tile_size must be positive, got {tile_size}")
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
    vf = v.detach().float().cpu().reshape(G, N, -1).contiguous().numpy()  # (G, N, D_v)
    out = np.empty_like(vf)
    _attention_kernel(qb, qw, kbT, kw, keep.contiguous().numpy(), vf, np.float32(c), min(tile_size, N), out)
    return torch.from_numpy(out).reshape(B, H, N, -1).to(device=v.device, dtype=v.dtype)
