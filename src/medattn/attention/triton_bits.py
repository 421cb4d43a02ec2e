"""Triton kernels of bit attention: the CUDA path of the four binary mechanisms (BinaryFormer, Heinrich, MIDL 2025).

The attention is :mod:`medattn.attention.binary.core`'s::

    S_ij = scale * sum_(a,b) wq_a[i] wk_b[j] <yq_a[i], yk_b[j]>,   P = softmax(S) over the real keys,   out = P V

with the binary dot product of eq. (2), ``<x, y> = c - 2 popcount(x xor y)``, on signs packed 32 to an int32 word
(:func:`pack_words`: bit t of word w set where ``y[32 w + t] >= 0``, padding bits clear on both sides, so they
never count). The popcount is written out on the word's bits (:func:`_popcount`, the SWAR form, which LLVM's
optimiser can turn into one population-count instruction; not checked on a GPU here), since Triton's interpreter,
which runs the kernels on CPU tensors in the tests, has no ``libdevice``.

Forward (``_forward_kernel``): per tile of queries, a loop over key tiles with the online softmax (running maximum
and sum, the accumulator rescaled; Milakov & Gimelshein 2018, as in flash attention): no N x N matrix; besides the
output it keeps each row's log-sum-exp (N floats per head) for the backward.

Backward: the scores are recomputed tile by tile, ``dS = P (dP - D)`` with ``dP = dO V^T`` and
``D_i = sum_c dO_ic out_ic``. ``_query_grad_kernel`` (per query tile and query term) gives
``dwq_a[i] = scale sum_j dS_ij sum_b wk_b[j] <yq_a[i], yk_b[j]>`` and
``dyq_a[i] = scale wq_a[i] sum_j dS_ij sum_b wk_b[j] yk_b[j]`` (the signs unpacked from the words);
``_key_grad_kernel`` (per key tile and key term) gives dV, dwk_b and dyk_b alike. These are the exact gradients of
the float emulation with respect to its terms; what reaches q and k is then the mechanism's own rule, by autograd
through its :meth:`~medattn.attention.binary.core.BinaryAttention.binarise`: the straight-through estimator
(binary-ste), nothing (binary-sg), the token weights' MLP (binary-hamming), the Bernoulli weights (binary-bernoulli).

Products follow :mod:`.triton_common` (bf16 values in bf16 products on CUDA, float32 sums); ``dS`` and ``P`` are
rounded to V's dtype for their products.
"""

from __future__ import annotations

import math

import torch

from .triton_common import LAUNCH, block, dot, load_tile, low_products, rounded, store_tile, tl, token_weights, triton
from .triton_support import span

#: Query and key rows per tile.
BLOCK_M = 64
BLOCK_N = 64
#: Rows per program of :func:`pack_words`.
PACK_ROWS = 64
WORD_BITS = 32
_LOG2E = math.log2(math.e)


@triton.jit
def _pack_kernel(y_ptr, out_ptr, R, C, WORDS: tl.constexpr, WORDS_PAD: tl.constexpr, BLOCK_R: tl.constexpr):
    """Rows of y (R, C) contiguous -> out (R, WORDS) int32: bit t of word w set where ``y[r, 32 w + t] >= 0``
    (compared in float32: Triton's interpreter holds bf16 as integers)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    words, bits = tl.arange(0, WORDS_PAD), tl.arange(0, 32)
    cols = words[:, None] * 32 + bits[None, :]  # (WORDS_PAD, 32)
    inside = (rows < R)[:, None, None] & (cols < C)[None, :, :]
    y = tl.load(y_ptr + rows[:, None, None] * C + cols[None, :, :], mask=inside, other=-1.0).to(tl.float32)
    set_bits = ((y >= 0) & inside).to(tl.uint32) << bits[None, None, :].to(tl.uint32)
    packed = tl.sum(set_bits, axis=2)  # distinct bits: their sum is their bitwise or
    tl.store(out_ptr + rows[:, None] * WORDS + words[None, :], packed.to(tl.int32, bitcast=True),
             mask=(rows < R)[:, None] & (words < WORDS)[None, :])


@triton.jit
def _popcount(x):
    """Set bits of each int32 word (SWAR: pairs, nibbles, bytes, then one multiply adds the bytes)."""
    x = x.to(tl.uint32, bitcast=True)
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return ((x * 0x01010101) >> 24).to(tl.int32)


@triton.jit
def _binary_dot(q_bits, k_bits, rows, cols, N, WORDS: tl.constexpr, BITS: tl.constexpr):
    """``<y_i, y_j> = BITS - 2 popcount(q_i xor k_j)`` (R, C) float32 of packed rows of one term each (pointers at
    the term's head); rows and cols past N read zero words (their results are masked by the caller)."""
    count = _popcount(tl.load(q_bits + rows * WORDS, mask=rows < N, other=0)[:, None]
                      ^ tl.load(k_bits + cols * WORDS, mask=cols < N, other=0)[None, :])
    for t in tl.static_range(1, WORDS):
        count += _popcount(tl.load(q_bits + rows * WORDS + t, mask=rows < N, other=0)[:, None]
                           ^ tl.load(k_bits + cols * WORDS + t, mask=cols < N, other=0)[None, :])
    return (BITS - 2 * count).to(tl.float32)


@triton.jit
def _signs(bits, rows, N, WORDS: tl.constexpr, BITS: tl.constexpr, BLOCK_D: tl.constexpr):
    """The +-1 signs (R, BLOCK_D) float32 of packed rows (pointer at the term's head); 0 past BITS and N."""
    cd = tl.arange(0, BLOCK_D)
    inside = (rows < N)[:, None] & (cd < BITS)[None, :]
    word = tl.load(bits + rows[:, None] * WORDS + (cd // 32)[None, :], mask=inside, other=0)
    bit = ((word >> (cd % 32)[None, :]) & 1).to(tl.float32)
    return tl.where(inside, 2.0 * bit - 1.0, 0.0)


@triton.jit
def _log2_scores(q_bits, q_w, k_bits, k_w, keep_ptr, b, rows, cols, N, TERM_ROWS, scale_log2,
                 A: tl.constexpr, BK: tl.constexpr, WORDS: tl.constexpr, BITS: tl.constexpr,
                 HAS_MASK: tl.constexpr):
    """Scores ``S log2(e)`` (R, C) of query rows against key cols (pointers at head g; term a's at
    ``a * TERM_ROWS`` rows further), -inf at padded keys and past N."""
    s = tl.zeros([rows.shape[0], cols.shape[0]], tl.float32)
    for a in tl.static_range(A):
        wq = tl.load(q_w + a * TERM_ROWS + rows, mask=rows < N, other=0.0)
        for kb in tl.static_range(BK):
            wk = tl.load(k_w + kb * TERM_ROWS + cols, mask=cols < N, other=0.0)
            dots = _binary_dot(q_bits + a * TERM_ROWS * WORDS, k_bits + kb * TERM_ROWS * WORDS, rows, cols, N,
                               WORDS, BITS)
            s += wq[:, None] * wk[None, :] * dots
    real = token_weights(keep_ptr, b, cols, N, HAS_MASK) > 0
    return tl.where(real[None, :], s * scale_log2, float("-inf"))


@triton.jit
def _forward_kernel(q_bits, q_w, k_bits, k_w, keep_ptr, v_ptr, out_ptr, lse_ptr, H, N, DV, TERM_ROWS, scale_log2,
                    svb, svh, svn, svd, sob, soh, son, sod,
                    A: tl.constexpr, BK: tl.constexpr, WORDS: tl.constexpr, BITS: tl.constexpr,
                    HAS_MASK: tl.constexpr, LOW: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr):
    """Program (tile, g): out = softmax(S) V for a tile of queries of head g, and their log2-sum-exp2 (+inf for a
    row without real keys, whose output is 0)."""
    tile, g = tl.program_id(0), tl.program_id(1)
    b, h = g // H, g % H
    q_bits, k_bits, q_w, k_w = q_bits + g * N * WORDS, k_bits + g * N * WORDS, q_w + g * N, k_w + g * N
    rows, cv = tile * BLOCK_M + tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_V)
    top = tl.full([BLOCK_M], -1.0e30, tl.float32)  # finite: a tile without real keys leaves it, and alpha, alone
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_V], tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        s = _log2_scores(q_bits, q_w, k_bits, k_w, keep_ptr, b, rows, cols, N, TERM_ROWS, scale_log2,
                         A, BK, WORDS, BITS, HAS_MASK)
        new_top = tl.maximum(top, tl.max(s, axis=1))
        alpha = tl.exp2(top - new_top)
        p = tl.exp2(s - new_top[:, None])
        total = total * alpha + tl.sum(p, axis=1)
        v = load_tile(v_ptr, b, h, cols, cv, N, DV, svb, svh, svn, svd)
        acc = acc * alpha[:, None] + dot(rounded(p, v.dtype), v.to(tl.float32), LOW)
        top = new_top
    some = total > 0
    store_tile(out_ptr, acc / tl.where(some, total, 1.0)[:, None], b, h, rows, cv, N, DV, sob, soh, son, sod)
    tl.store(lse_ptr + g * N + rows, tl.where(some, top + tl.log2(tl.where(some, total, 1.0)), float("inf")),
             mask=rows < N)


@triton.jit
def _query_grad_kernel(q_bits, q_w, k_bits, k_w, keep_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dw_ptr, dy_ptr,
                       H, N, DV, TERM_ROWS, scale, scale_log2,
                       svb, svh, svn, svd, sdb, sdh, sdn, sdd,
                       A: tl.constexpr, BK: tl.constexpr, WORDS: tl.constexpr, BITS: tl.constexpr,
                       HAS_MASK: tl.constexpr, NEED_W: tl.constexpr, NEED_Y: tl.constexpr, LOW: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program (tile, g, a): with ``NEED_W`` gradients of query term a's weights (-> dw (A, G, N)), with ``NEED_Y``
    of its signs
    (-> dy (A, G, N, BITS)) for a tile of queries of head g."""
    tile, g, term = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, h = g // H, g % H
    q_bits, k_bits, q_w, k_w = q_bits + g * N * WORDS, k_bits + g * N * WORDS, q_w + g * N, k_w + g * N
    rows, cv, cd = tile * BLOCK_M + tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_V), tl.arange(0, BLOCK_D)
    do = load_tile(do_ptr, b, h, rows, cv, N, DV, sdb, sdh, sdn, sdd).to(tl.float32)
    lse = tl.load(lse_ptr + g * N + rows, mask=rows < N, other=float("inf"))
    delta = tl.load(delta_ptr + g * N + rows, mask=rows < N, other=0.0)
    dw = tl.zeros([BLOCK_M], tl.float32)
    dy = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        s = _log2_scores(q_bits, q_w, k_bits, k_w, keep_ptr, b, rows, cols, N, TERM_ROWS, scale_log2,
                         A, BK, WORDS, BITS, HAS_MASK)
        p = tl.exp2(s - lse[:, None])
        v = load_tile(v_ptr, b, h, cols, cv, N, DV, svb, svh, svn, svd)
        ds = p * (dot(do, tl.trans(v.to(tl.float32)), LOW) - delta[:, None])
        for kb in tl.static_range(BK):
            wk = tl.load(k_w + kb * TERM_ROWS + cols, mask=cols < N, other=0.0)
            ds_w = ds * wk[None, :]
            if NEED_W:
                dw += tl.sum(ds_w * _binary_dot(q_bits + term * TERM_ROWS * WORDS, k_bits + kb * TERM_ROWS * WORDS,
                                                rows, cols, N, WORDS, BITS), axis=1)
            if NEED_Y:
                dy += dot(rounded(ds_w, v.dtype), _signs(k_bits + kb * TERM_ROWS * WORDS, cols, N, WORDS, BITS,
                                                         BLOCK_D), LOW)
    at = term * TERM_ROWS + g * N + rows
    if NEED_W:
        tl.store(dw_ptr + at, dw * scale, mask=rows < N)
    if NEED_Y:
        wq = tl.load(q_w + term * TERM_ROWS + rows, mask=rows < N, other=0.0)
        tl.store(dy_ptr + at[:, None] * BITS + cd[None, :], dy * (scale * wq)[:, None],
                 mask=(rows < N)[:, None] & (cd < BITS)[None, :])


@triton.jit
def _key_grad_kernel(q_bits, q_w, k_bits, k_w, keep_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dv_ptr, dw_ptr, dy_ptr,
                     H, N, DV, TERM_ROWS, scale, scale_log2,
                     svb, svh, svn, svd, sdb, sdh, sdn, sdd, sgb, sgh, sgn, sgd,
                     A: tl.constexpr, BK: tl.constexpr, WORDS: tl.constexpr, BITS: tl.constexpr,
                     HAS_MASK: tl.constexpr, NEED_W: tl.constexpr, NEED_Y: tl.constexpr, LOW: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program (tile, g, b): gradients of V (written by b = 0), with ``NEED_W`` of key term b's weights
    (-> dw (BK, G, N)), with ``NEED_Y`` of its signs (-> dy (BK, G, N, BITS)) for a tile of keys of head g."""
    tile, g, term = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, h = g // H, g % H
    q_bits, k_bits, q_w, k_w = q_bits + g * N * WORDS, k_bits + g * N * WORDS, q_w + g * N, k_w + g * N
    cols, cv, cd = tile * BLOCK_N + tl.arange(0, BLOCK_N), tl.arange(0, BLOCK_V), tl.arange(0, BLOCK_D)
    v = load_tile(v_ptr, b, h, cols, cv, N, DV, svb, svh, svn, svd)
    dv = tl.zeros([BLOCK_N, BLOCK_V], tl.float32)
    dw = tl.zeros([BLOCK_N], tl.float32)
    dy = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for start in range(0, N, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        do = load_tile(do_ptr, b, h, rows, cv, N, DV, sdb, sdh, sdn, sdd)
        lse = tl.load(lse_ptr + g * N + rows, mask=rows < N, other=float("inf"))
        delta = tl.load(delta_ptr + g * N + rows, mask=rows < N, other=0.0)
        s = _log2_scores(q_bits, q_w, k_bits, k_w, keep_ptr, b, rows, cols, N, TERM_ROWS, scale_log2,
                         A, BK, WORDS, BITS, HAS_MASK)
        p = tl.exp2(s - lse[:, None])
        dv += dot(tl.trans(rounded(p, do.dtype)), do.to(tl.float32), LOW)
        ds = p * (dot(do.to(tl.float32), tl.trans(v.to(tl.float32)), LOW) - delta[:, None])
        for a in tl.static_range(A):
            wq = tl.load(q_w + a * TERM_ROWS + rows, mask=rows < N, other=0.0)
            ds_w = ds * wq[:, None]
            if NEED_W:
                dw += tl.sum(ds_w * _binary_dot(q_bits + a * TERM_ROWS * WORDS, k_bits + term * TERM_ROWS * WORDS,
                                                rows, cols, N, WORDS, BITS), axis=0)
            if NEED_Y:
                dy += dot(tl.trans(rounded(ds_w, v.dtype)), _signs(q_bits + a * TERM_ROWS * WORDS, rows, N, WORDS,
                                                                   BITS, BLOCK_D), LOW)
    if term == 0:
        store_tile(dv_ptr, dv, b, h, cols, cv, N, DV, sgb, sgh, sgn, sgd)
    at = term * TERM_ROWS + g * N + cols
    if NEED_W:
        tl.store(dw_ptr + at, dw * scale, mask=cols < N)
    if NEED_Y:
        wk = tl.load(k_w + term * TERM_ROWS + cols, mask=cols < N, other=0.0)
        tl.store(dy_ptr + at[:, None] * BITS + cd[None, :], dy * (scale * wk)[:, None],
                 mask=(cols < N)[:, None] & (cd < BITS)[None, :])


def pack_words(y: torch.Tensor) -> torch.Tensor:
    """Signs of y (..., c) packed 32 to an int32 word: (..., ceil(c / 32)), bit t of word w set where
    ``y[..., 32 w + t] >= 0``, bits past c clear."""
    c = y.shape[-1]
    words = triton.cdiv(c, WORD_BITS)
    y = y.contiguous()
    out = torch.empty(*y.shape[:-1], words, dtype=torch.int32, device=y.device)
    rows = y.numel() // c
    _pack_kernel[(triton.cdiv(rows, PACK_ROWS),)](y, out, rows, c, WORDS=words,
                                                  WORDS_PAD=triton.next_power_of_2(words), BLOCK_R=PACK_ROWS, **LAUNCH)
    return out


class _BitAttention(torch.autograd.Function):
    """softmax(S) V from stacked terms: yq (A, B, H, N, c) signs, wq (A, B, H, N) weights, yk, wk likewise
    (Bk terms), v (B, H, N, D_v), keep (B, N) float32 0/1 or None -> (B, H, N, D_v) in v's dtype."""

    @staticmethod
    def forward(ctx, yq, wq, yk, wk, v, keep, scale):
        A, B, H, N, c = yq.shape
        q_bits, k_bits = pack_words(yq), pack_words(yk)
        q_w, k_w = wq.float().contiguous(), wk.float().contiguous()
        out = torch.empty(B, H, N, v.shape[-1], dtype=v.dtype, device=v.device)
        lse = torch.empty(B * H, N, dtype=torch.float32, device=v.device)
        _forward_kernel[(triton.cdiv(N, BLOCK_M), B * H)](
            q_bits, q_w, k_bits, k_w, q_w if keep is None else keep, v, out, lse, H, N, v.shape[-1], B * H * N,
            scale * _LOG2E, *v.stride(), *out.stride(), A=A, BK=yk.shape[0], WORDS=q_bits.shape[-1], BITS=c,
            HAS_MASK=keep is not None, LOW=low_products(v), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
            BLOCK_V=block(v.shape[-1]), **LAUNCH)
        ctx.save_for_backward(q_bits, q_w, k_bits, k_w, keep, v, out, lse)
        ctx.scale, ctx.bits, ctx.dtypes = scale, c, (yq.dtype, wq.dtype, yk.dtype, wk.dtype)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q_bits, q_w, k_bits, k_w, keep, v, out, lse = ctx.saved_tensors
        A, B, H, N, words = q_bits.shape
        BK, G, DV = k_bits.shape[0], B * H, v.shape[-1]
        need_yq, need_wq, need_yk, need_wk = ctx.needs_input_grad[:4]
        delta = (grad_out.float() * out.float()).sum(dim=-1).reshape(G, N).contiguous()  # D_i = sum_c dO_ic O_ic
        inputs = (q_bits, q_w, k_bits, k_w, q_w if keep is None else keep, v, grad_out, lse, delta)
        sizes = (H, N, DV, G * N, ctx.scale, ctx.scale * _LOG2E, *v.stride(), *grad_out.stride())
        options = dict(A=A, BK=BK, WORDS=words, BITS=ctx.bits, HAS_MASK=keep is not None, LOW=low_products(v),
                       BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_V=block(DV), BLOCK_D=block(ctx.bits), **LAUNCH)
        dwq = torch.empty(A, B, H, N, dtype=torch.float32, device=v.device)
        dyq = torch.empty(A, B, H, N, ctx.bits, dtype=torch.float32, device=v.device) if need_yq else dwq
        if need_yq or need_wq:
            _query_grad_kernel[(triton.cdiv(N, BLOCK_M), G, A)](*inputs, dwq, dyq, *sizes, NEED_W=need_wq,
                                                                 NEED_Y=need_yq, **options)
        dv = torch.empty(B, H, N, DV, dtype=v.dtype, device=v.device)
        dwk = torch.empty(BK, B, H, N, dtype=torch.float32, device=v.device)
        dyk = torch.empty(BK, B, H, N, ctx.bits, dtype=torch.float32, device=v.device) if need_yk else dwk
        _key_grad_kernel[(triton.cdiv(N, BLOCK_N), G, BK)](*inputs, dv, dwk, dyk, *sizes, *dv.stride(),
                                                            NEED_W=need_wk, NEED_Y=need_yk, **options)
        grads = (dyq, dwq, dyk, dwk)
        return (*(g.to(dtype) if need else None for g, dtype, need in zip(grads, ctx.dtypes, ctx.needs_input_grad)),
                dv, None, None)


def triton_binary_attention(q_terms, k_terms, v: torch.Tensor, scale: float,
                            mask: torch.Tensor | None = None) -> torch.Tensor:
    """``softmax(S) V`` by the kernels, differentiable: the form of
    :func:`medattn.attention.binary.core.emulated_attention` without dropout.

    q_terms / k_terms: lists of ``(signs, weights)``, signs (B, H, N, c) (+-1, or any tensor: only ``>= 0``
    counts), c at most 128, weights (B, H, N) or None (= 1); v (B, H, N, D_v) float32 or bf16, D_v at most 128;
    mask (B, N) bool, True = real key, or None. -> (B, H, N, D_v) in v's dtype. Gradients reach v, the weights and
    the signs (exact for the float form; see the module docstring). Runs on CUDA tensors, or on CPU tensors under
    Triton's interpreter.
    """
    if not q_terms or not k_terms:
        raise ValueError("triton_binary_attention needs at least one query term and one key term")
    largest = max(span(v), *(len(terms) * terms[0][0].numel() for terms in (q_terms, k_terms)))
    if largest >= 2**31:
        raise ValueError(f"the Triton kernels address at most 2^31 - 1 elements per tensor (int32 offsets); the "
                         f"stacked terms or v span {largest}")
    ones = torch.ones(v.shape[:-1], dtype=torch.float32, device=v.device)
    yq, yk = (torch.stack([signs for signs, _ in terms]) for terms in (q_terms, k_terms))
    wq, wk = (torch.stack([ones if w is None else w.float() for _, w in terms]) for terms in (q_terms, k_terms))
    keep = None if mask is None else mask.to(device=v.device, dtype=torch.float32).contiguous()
    return _BitAttention.apply(yq, wq, yk, wk, v, keep, scale)
