"""Bit-level kernel of BinaryFormer (Heinrich, MIDL 2025, eq. 2) and the whole attention forward on it.

Signs are packed 64 to a ``uint64`` word (:mod:`medattn.attention.binary.packing`: bit set where ``x >= 0``,
padding bits cleared); the binary dot product of two packed rows is eq. (2), ``<a, b> = c - 2 popcount(a xor b)``,
computed by Numba kernels that LLVM vectorises over keys (``llvm.ctpop``), parallel over query rows.
The integers are exact, so the scores equal the float emulation ``sgn(q) @ sgn(k)^T`` exactly.

:func:`binary_attention` is the whole forward ``softmax(S) V`` with
``S_ij = sum_(a,b) s * wq_a[i] * wk_b[j] * <qa_i, kb_j>`` over the (query term, key term) pairs of a
mechanism, in steps of (query rows x key tile). Binary scores are bounded before any is computed, so each
row's softmax shift is known before its keys are seen (the bound, or where it would leave too wide a
spread the row's exact maximum from a first pass): a Numba kernel turns each tile's popcounts into
probabilities and ``P V`` is one batched GEMM per tile (PyTorch's BLAS) added to the accumulator as it is.
The kernel reads the packed signs as bytes, the keys' as byte planes (byte t of every key together), and counts
the ones in uint8 lanes (32 keys per AVX2 vector), then turns the counts into probabilities eight floats wide.
No N x N matrix exists: besides the inputs (O(B H N (d / 8 + D_v))) the memory is one probability tile
(:data:`TILE_BUDGET` floats).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from llvmlite import ir
from numba import get_num_threads, njit, prange, types
from numba.extending import intrinsic

from .packing import pack_signs

_LOG2E = np.float32(1.4426950408889634)
#: ``e^(z ln 2) = sum_k (ln 2)^k z^k / k!`` up to k = 6, highest first (|z| <= 1/2: relative error of
#: :func:`_exp2` below 3e-7, measured over [-130, 10] in tests).
_EXP2_TAYLOR = tuple(np.float32(math.log(2) ** k / math.factorial(k)) for k in range(6, -1, -1))
_ROWS = 8  # the fewest query rows per step
#: Largest spread (natural-log units) between a row's score bound and its lowest possible score for which the
#: bound serves as the softmax shift: every ``e^(S - bound)`` is then at least ``e^-40`` (about 4e-18), far
#: from float32's subnormals even after the ``P V`` product. Rows with a wider spread take their exact maximum.
SPREAD_LIMIT = 40.0
#: Finite stand-in for -inf (fast-math assumes no infinities): the maximum of a row without real keys.
_NO_KEY = np.float32(-3.0e38)
_TWO = np.float32(2.0)  # float32 constants keep the vector loops in float32 (a Python 2 would promote to float64)


@intrinsic
def _add_bit_count(typingctx, acc, x, k):
    """``acc + popcount(x xor k)`` of uint8s, in uint8 (``llvm.ctpop.i8``; the caller keeps the sum below 256).

    Byte lanes make the key loop 32 keys wide on AVX2 (a ``vpshufb`` nibble lookup per byte, no widening);
    with 32-bit words the counts were reduced to each lane (``vpsadbw``) and the loop was 8 keys wide. A layer's
    probability kernels (N = 4,096, d = 64, 8 heads, all tiles) took 57 ms instead of 80."""
    signature = types.uint8(types.uint8, types.uint8, types.uint8)

    def codegen(context, builder, sig, args):
        fn = builder.module.declare_intrinsic("llvm.ctpop", [ir.IntType(8)])
        return builder.add(args[0], builder.call(fn, [builder.xor(args[1], args[2])]))

    return signature, codegen


def _to_float32(source, instruction: str, doc: str):
    """An intrinsic taking one ``source`` scalar to float32 by the LLVM ``instruction`` (an IR builder method)."""

    def to_float32(typingctx, x):
        def codegen(context, builder, sig, args):
            return getattr(builder, instruction)(args[0], ir.FloatType())

        return types.float32(source), codegen

    to_float32.__doc__ = doc
    return intrinsic(to_float32)


_byte_to_float = _to_float32(types.uint8, "uitofp", "A uint8 as float32 (Numba would widen it to int64 first, which "
                                                    "AVX2 cannot convert in vector lanes).")
_float_from_bits = _to_float32(types.int32, "bitcast", "Reinterpret an int32's bits as a float32 (no conversion).")


@njit(fastmath=True, inline="always")
def _exp2(y):  # pragma: no cover - compiled
    """``2^y`` for ``y`` clamped to [-126, 0], as ``2^n e^(z ln 2)`` with n = round(y), |z| <= 1/2.

    Float operations only (Numba promotes int32 arithmetic to int64, which AVX2 cannot convert to float in
    vector lanes): ``2^n`` is built from its exponent bits, ``(n + 127) * 2^23`` (an exact float), so the key
    loop vectorises. A masked key may score above the shift; the clamp keeps its term finite before it is
    multiplied by zero.
    """
    y = min(max(y, np.float32(-126.0)), np.float32(0.0))
    # round(y): y - 1/2 < 0 truncates towards zero. No constant is added to y and taken off again, which
    # fast-math could reassociate into y + 126 (losing 1e-5 of z to float32's spacing near 126).
    n = np.float32(np.int32(y - np.float32(0.5)))
    z = y - n
    c6, c5, c4, c3, c2, c1, c0 = _EXP2_TAYLOR
    q = ((((((c6 * z + c5) * z + c4) * z + c3) * z + c2) * z + c1) * z) + c0
    return q * _float_from_bits(np.int32((n + np.float32(127.0)) * np.float32(8388608.0)))


#: Bytes counted in uint8 lanes before the counts are added up in float32: 16 bytes = at most 128 ones.
_BYTES_PER_COUNT = 16


@njit(fastmath=True, inline="always")
def _count_ones(qb, kb, a, b, g, i, k0, cols, t0, t1, cnt):  # pragma: no cover - compiled
    """``cnt[j] = popcount(qb[a, g, i, t0:t1] xor kb[b, g, t0:t1, k0 + j])`` for j < cols (uint8, t1 - t0 <= 16).

    Bytes outer, keys inner: each pass is one vector loop over the byte plane of the keys. Key rows are sliced
    before the loops: indexing ``kt[k0 + j]`` with a run-time ``k0`` makes Numba wrap negative indices element by
    element, which turned the vector loads into gathers (4x slower)."""
    for j in range(cols):
        cnt[j] = 0
    for t in range(t0, t1):
        x = qb[a, g, i, t]
        kt = kb[b, g, t, k0 : k0 + cols]
        for j in range(cols):
            cnt[j] = _add_bit_count(cnt[j], x, kt[j])


@njit(fastmath=True, cache=True)
def _score_row(qb, qw, kb, kw, c, g, i, k0, cols, sr, h, cnt):  # pragma: no cover - compiled
    """``sr[:cols] = sum_(a,b) qw[a,g,i] kw[b,g,k0+j] (c - 2 popcount(qb[a,g,i] xor kb[b,g,:,k0+j]))``.

    ``h`` (float32) and ``cnt`` (uint8) are scratch of at least ``cols``; the ones are counted in uint8 over
    :data:`_BYTES_PER_COUNT` bytes at a time and summed in ``h``.
    """
    A, nbytes, Bk = qb.shape[0], qb.shape[3], kb.shape[0]
    for j in range(cols):
        sr[j] = 0.0
    for a in range(A):
        wa = qw[a, g, i]
        for b in range(Bk):
            kwb = kw[b, g, k0 : k0 + cols]
            for j in range(cols):
                h[j] = 0.0
            for t0 in range(0, nbytes, _BYTES_PER_COUNT):
                _count_ones(qb, kb, a, b, g, i, k0, cols, t0, min(t0 + _BYTES_PER_COUNT, nbytes), cnt)
                for j in range(cols):
                    h[j] += _byte_to_float(cnt[j])
            for j in range(cols):
                sr[j] += wa * kwb[j] * (c - _TWO * h[j])


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
def _shift_kernel(qb, qw, kb, kw, keep, c, i0, rows, bound, tile, shift, chunks):  # pragma: no cover
    """Softmax shifts of query rows ``i0 : i0 + rows``: ``shift[g, r]`` (log2 units, as the scores).

    ``bound`` (G, N) is an upper bound of each row's scores; where the spread it allows, ``2 bound``, is at
    most :data:`SPREAD_LIMIT` (in log2 units) the bound is the shift, else the row's exact maximum over its
    real keys, from a pass over the keys in tiles of ``tile`` (``_NO_KEY`` for a row without real keys).
    """
    steps = qb.shape[1] * rows
    chunks = min(steps, chunks)
    limit = np.float32(SPREAD_LIMIT) * _LOG2E
    for chunk in prange(chunks):
        sr, h, cnt = np.empty(tile, np.float32), np.empty(tile, np.float32), np.empty(tile, np.uint8)
        lanes = np.empty(_LANES, np.float32)
        for r in range(chunk * steps // chunks, (chunk + 1) * steps // chunks):
            g = r // rows
            rr = r - g * rows
            u = bound[g, i0 + rr]
            if _TWO * u <= limit:
                shift[g, rr] = u
                continue
            best = _NO_KEY
            for k0 in range(0, kb.shape[3], tile):
                cols = min(tile, kb.shape[3] - k0)
                _score_row(qb, qw, kb, kw, c, g, i0 + rr, k0, cols, sr, h, cnt)
                best = max(best, _masked_max(sr, keep[g, k0 : k0 + cols], cols, lanes))
            shift[g, rr] = best


@njit(parallel=True, fastmath=True, cache=True)
def _probability_kernel(qb, qw, kb, kw, keep, c, i0, rows, k0, cols, shift, p, total, chunks):  # pragma: no cover
    """Probabilities of query rows ``i0 : i0 + rows`` against keys ``k0 : k0 + cols``.

    qb (A, G, N, nbytes) uint8, qw (A, G, N) float32 (scale and log2 e folded in), kb (Bk, G, nbytes, M) uint8
    (byte planes), kw (Bk, G, M) float32, keep (G, M) float32 (1 = real key), shift (G, R) from
    :func:`_shift_kernel`. Writes ``p[g, r, :cols] = 2^(S - shift) * keep`` and adds each row's sum to
    ``total[g, r]``. Parallel over ``chunks`` chunks of (group, row) pairs (scratch allocated once per chunk);
    every loop over keys is branch-free, so LLVM vectorises it. Fast-math lets LLVM assume no infinities: none
    can arise, since the exponent is clamped. One term each and at most 16 bytes (d <= 128, every mechanism in
    inference): the uint8 counts go straight into the exponent.
    """
    steps = qb.shape[1] * rows
    chunks = min(steps, chunks)
    single = qb.shape[0] == 1 and kb.shape[0] == 1 and qb.shape[3] <= _BYTES_PER_COUNT
    for chunk in prange(chunks):
        h, cnt = np.empty(cols, np.float32), np.empty(cols, np.uint8)
        for r in range(chunk * steps // chunks, (chunk + 1) * steps // chunks):
            g = r // rows
            rr = r - g * rows
            sr = p[g, rr]
            kg = keep[g, k0 : k0 + cols]
            sh = shift[g, rr]
            added = np.float32(0.0)
            if single:
                _count_ones(qb, kb, 0, 0, g, i0 + rr, k0, cols, 0, qb.shape[3], cnt)
                wa, kwg = qw[0, g, i0 + rr], kw[0, g, k0 : k0 + cols]
                for j in range(cols):
                    e = _exp2(wa * kwg[j] * (c - _TWO * _byte_to_float(cnt[j])) - sh) * kg[j]
                    sr[j] = e
                    added += e
            else:
                _score_row(qb, qw, kb, kw, c, g, i0 + rr, k0, cols, sr, h, cnt)
                for j in range(cols):
                    e = _exp2(sr[j] - sh) * kg[j]
                    sr[j] = e
                    added += e
            total[g, rr] += added


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
    Returns (B, H, N, D_v) in ``v``'s dtype, computed in float32: a transposed view of a (B, N, H, D_v) tensor, so
    the layer's merge of the heads costs no copy.

    Softmax is shift-invariant, so any shift ``m_i`` not below a row's largest score gives the same
    ``P``; the binary scores are bounded before any is computed, ``|S_ij| <= U_i = scale c sum_a |wq_a[i]|
    sum_b max_j |wk_b[j]|``. Where the spread ``2 U_i`` is at most :data:`SPREAD_LIMIT` (binary-sg at any
    head width up to 400 bits; binary-hamming while ``wq wk <= 2.5`` at d = 64) ``U_i`` is the shift,
    else a first pass finds the row's exact maximum. With the shift known before the keys, each key tile
    adds to the accumulator directly: no running maximum and no rescaling of the accumulator (the online
    softmax of Milakov & Gimelshein, 2018, that an earlier version used).

    Work goes in steps of ``block_rows`` query rows (default: as many as keep the probability tile of all
    B H groups within :data:`TILE_BUDGET` floats) times ``tile_size`` keys. Per step the Numba kernel
    :func:`_probability_kernel` computes the scores by popcount and ``P = 2^(S log2 e - shift)``, and one
    batched GEMM adds ``P V_tile`` (``torch.baddbmm``, PyTorch's BLAS); at the end each row is divided by
    its sum of ``P``. No N x N matrix exists: besides the inputs (O(B H N (d / 32 + D_v))) the memory is
    the tile (at most the budget, at least 8 rows).
    """
    if tile_size <= 0:
        raise ValueError(f"tile_size must be positive, got {tile_size}")
    if block_rows is not None and block_rows <= 0:
        raise ValueError(f"block_rows must be positive, got {block_rows}")
    if not q_terms or not k_terms:
        raise ValueError("binary_attention needs at least one query term and one key term")
    B, H, N, c = q_terms[0][0].shape
    G = B * H
    nbytes = -(-c // 8)  # bytes holding the c bits; the rest of each word is cleared on both sides

    def stack(terms, weight_scale):
        bits = [pack_signs(signs).view(np.uint8).reshape(G, N, -1)[:, :, :nbytes] for signs, _ in terms]
        w = [torch.ones(G, N) if w is None else w.detach().float().cpu().reshape(G, N) for _, w in terms]
        return np.stack(bits), (weight_scale * torch.stack(w)).contiguous().numpy()  # (T, G, N, nbytes), (T, G, N)

    qb, qw = stack(q_terms, scale * float(_LOG2E))  # scores in log2 units: P = 2^(S - shift)
    kb, kw = stack(k_terms, 1.0)
    kb = np.ascontiguousarray(kb.transpose(0, 1, 3, 2))  # (Bk, G, nbytes, N): byte planes of the keys
    keep = torch.ones(G, N) if mask is None else mask.cpu().float().repeat_interleave(H, dim=0)  # (G, N)
    keep = keep.contiguous().numpy()
    key_bound = (np.abs(kw) * keep).max(axis=2).sum(axis=0)  # (G,): sum_b max over real keys |wk_b|
    bound = (c * np.abs(qw).sum(axis=0) * key_bound[:, None]).astype(np.float32)  # (G, N) >= |S_ij|
    vf = v.detach().float().cpu().reshape(G, N, -1).contiguous()  # (G, N, D_v)
    tile = min(tile_size, N)
    rows = min(N, block_rows or max(_ROWS, TILE_BUDGET // (G * tile)))
    p = torch.empty(G, rows, tile)
    shift, total = np.empty((G, rows), np.float32), torch.empty(G, rows)
    acc = torch.empty(G, rows, vf.shape[2])
    out = torch.empty(B, N, H, vf.shape[2]).transpose(1, 2)  # (B, H, N, D_v) view of the layer's (B, N, H D_v)
    p_np, total_np, c32, chunks = p.numpy(), total.numpy(), np.float32(c), 4 * get_num_threads()
    for i0 in range(0, N, rows):
        r = min(rows, N - i0)
        _shift_kernel(qb, qw, kb, kw, keep, c32, i0, r, bound, tile, shift, chunks)
        total.zero_()
        acc.zero_()
        for k0 in range(0, N, tile):
            t = min(tile, N - k0)
            _probability_kernel(qb, qw, kb, kw, keep, c32, i0, r, k0, t, shift, p_np, total_np, chunks)
            acc[:, :r].baddbmm_(p[:, :r, :t], vf[:, k0 : k0 + t])
        out[:, :, i0 : i0 + r] = acc[:, :r].div_(total[:, :r, None]).view(B, H, r, -1)
    return out.to(device=v.device, dtype=v.dtype)
