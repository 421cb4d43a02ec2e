"""Fast path of sequence-normalized attention: raw moments and a recomputing backward.

Khader et al. §2.1. With per-channel scale ``s = gamma / sqrt(var + eps)`` and shift
``c = beta - mean * s``, the normalized tensors are affine in the raw ones (``Q' = Q s + c``), so

    K'^T V' = s_k^T s_v * (K^T W V) + n (beta_k^T c_v + c_k^T (s_v mean_v))          (d x d)
    out     = W (Q' A)  with  A = K'^T V' / n,   i.e.   out = W (Q (s_q^T * A) + c_q A)

where W holds the 0/1 token mask and n the count of real tokens. Everything the forward needs from
the (B, H, N, d) tensors is a handful of reductions and products with d x d results:
``sum_n w x``, ``sum_n w x^2`` (both for q, k, v) and ``K^T W V``; then one (N x d) @ (d x d)
product makes the output. No normalized copy of Q, K or V is stored: the backward maps the
gradients of these raw moments back onto q, k, v with three products of the same size.

Moments about zero lose precision when a channel's mean dwarfs its spread (cancellation in
``E[x^2] - mean^2``). Where any channel has ``mean^2 > CONDITION_LIMIT * var``, the forward takes
the centred path (explicit normalized tensors) and the backward recomputes that path with autograd.
"""

from __future__ import annotations

import torch

#: Largest mean^2 / var ratio of any channel for which the raw-moment path is used (its relative
#: error grows like 6e-8 * (1 + ratio) in float32).
CONDITION_LIMIT = 1e3


#: Tokens per block when summing squares: small blocks keep temporaries out of fresh page-faulted memory.
SQUARE_BLOCK = 512


def _moments(x: torch.Tensor, weights: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """sum_n w x and sum_n w x^2, each (B, H, 1, d), for x (B, H, N, d).

    The squares are summed block by block of tokens, which measured faster than either one Gram
    product or one full-size square on this project's CPU (docs/performance.md).
    """
    total = x.sum(dim=2, keepdim=True) if weights is None else 0
    total_sq = 0
    for start in range(0, x.shape[2], SQUARE_BLOCK):
        block = x[:, :, start:start + SQUARE_BLOCK]
        weighted = block if weights is None else block * weights[:, :, start:start + SQUARE_BLOCK]
        if weights is not None:
            total = total + weighted.sum(dim=2, keepdim=True)
        total_sq = total_sq + torch.linalg.vecdot(weighted, block, dim=2).unsqueeze(-2)
    return total, total_sq


def scale_shift(total, total_sq, count, gamma, beta, eps):
    """Per-channel scale s and shift c of the normalization, and mean and variance, all (B, H, 1, d)."""
    mean = total / count
    var = (total_sq / count - mean.square()).clamp_min(0.0)
    scale = gamma * torch.rsqrt(var + eps)
    return scale, beta - mean * scale, mean, var


def _output_map(moments, count, affines, eps):
    """(A_q, b) with out = Q A_q + b: A_q = s_q^T * A (B, H, d, D_v), b = c_q A (B, H, 1, D_v).

    ``moments`` = (S_q, Sq_q, S_k, Sq_k, S_v, Sq_v, G_kv); ``affines`` = (gamma_q, beta_q, ..., beta_v)
    reshaped to (1, H, 1, d_t); ``eps`` = (eps_q, eps_k, eps_v).
    """
    s_q, sq_q, s_k, sq_k, s_v, sq_v, g_kv = moments
    gq, bq, gk, bk, gv, bv = affines
    eps_q, eps_k, eps_v = eps
    scale_q, shift_q, _, _ = scale_shift(s_q, sq_q, count, gq, bq, eps_q)
    scale_k, shift_k, _, _ = scale_shift(s_k, sq_k, count, gk, bk, eps_k)
    scale_v, shift_v, mean_v, _ = scale_shift(s_v, sq_v, count, gv, bv, eps_v)
    ktv = scale_k.transpose(-2, -1) * g_kv * scale_v  # (B, H, d, D_v)
    ktv = ktv + count * (bk.transpose(-2, -1) * shift_v + shift_k.transpose(-2, -1) * (scale_v * mean_v))
    a = ktv / count
    return scale_q.transpose(-2, -1) * a, shift_q @ a


def _ill_conditioned(moments, count) -> bool:
    for total, total_sq in zip(moments[0:6:2], moments[1:6:2]):
        mean = total / count
        var = total_sq / count - mean.square()
        if bool((mean.square() > CONDITION_LIMIT * var).any()):
            return True
    return False


def sequence_normalize(x, gamma, beta, weights, count, eps):
    """Explicit two-pass sequence normalization of x (B, H, N, d) over tokens; gamma, beta (1, H, 1, d).

    ``weights`` (B, 1, N, 1) or None selects real tokens (``count`` of them); padded rows come out zero.
    """
    xw = x if weights is None else x * weights
    mean = xw.sum(dim=2, keepdim=True) / count
    centred = x - mean if weights is None else (x - mean) * weights
    var = centred.square().sum(dim=2, keepdim=True) / count
    out = centred * (gamma * torch.rsqrt(var + eps)) + beta
    return out if weights is None else out * weights


def centred_seqnorm(q, k, v, affines, weights, count, eps):
    """Explicit form: normalized copies of q, k, v (two-pass statistics), then Q' (K'^T V') / n.

    ``eps`` = (eps_q, eps_k, eps_v).
    """
    gq, bq, gk, bk, gv, bv = affines
    q = sequence_normalize(q, gq, bq, weights, count, eps[0])
    k = sequence_normalize(k, gk, bk, weights, count, eps[1])
    v = sequence_normalize(v, gv, bv, weights, count, eps[2])
    return q @ ((k.transpose(-2, -1) @ v) / count)


def affine_views(params, like: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The six affine vectors (H * d_t,) as (1, H, 1, d_t) tensors in ``like``'s dtype (like is (B, H, N, d))."""
    return tuple(p.to(like.dtype).view(1, like.shape[1], 1, -1) for p in params)


class SeqNormCore(torch.autograd.Function):
    """out = W Q' (K'^T V') / n for q, k (B, H, N, d), v (B, H, N, D_v) in float32/float64.

    Inputs: q, k, v, the six affine tensors (H * d_t,), weights (B, 1, N, 1) or None, count (int or
    (B, 1, 1, 1)), eps = (eps_q, eps_k, eps_v). Output (B, H, N, D_v), zero at padded positions.

    Backward: the raw-moment formulas of the module docstring. Where the backward itself must be
    differentiable (``create_graph=True``: double backward, Hessian-vector products, gradient
    penalties), or the forward took the centred path, the backward instead recomputes the explicit
    centred form with autograd on the saved inputs, so higher derivatives are exact (those of the
    explicit form) rather than those of a hand-written first derivative.
    """

    @staticmethod
    def forward(ctx, q, k, v, gq, bq, gk, bk, gv, bv, weights, count, eps):
        affines = affine_views((gq, bq, gk, bk, gv, bv), q)
        moments = (*_moments(q, weights), *_moments(k, weights), *_moments(v, weights))
        g_kv = k.transpose(-2, -1) @ (v if weights is None else v * weights)  # (B, H, d, D_v)
        moments = moments + (g_kv,)
        ctx.centred = _ill_conditioned(moments, count)
        ctx.save_for_backward(q, k, v, gq, bq, gk, bk, gv, bv, *(() if weights is None else (weights,)))
        ctx.count, ctx.eps, ctx.has_weights = count, eps, weights is not None
        if ctx.centred:
            return centred_seqnorm(q, k, v, affines, weights, count, eps)
        a_q, b = _output_map(moments, count, affines, eps)
        ctx.moments = moments
        out = torch.baddbmm(b.flatten(0, 1), q.flatten(0, 1), a_q.flatten(0, 1)).view(*q.shape[:3], -1)
        return out if weights is None else out.mul_(weights)

    @staticmethod
    def backward(ctx, grad_out):
        saved = ctx.saved_tensors  # read once: checkpointing's recomputed tensors unpack only once
        q, k, v, *params = saved[:9]
        weights = saved[9] if ctx.has_weights else None
        if ctx.centred or torch.is_grad_enabled():
            return (*_explicit_backward(q, k, v, params, weights, ctx.count, ctx.eps, grad_out), None, None, None)
        return (*_raw_moment_backward(q, k, v, params, weights, ctx.count, ctx.eps, ctx.moments, grad_out),
                None, None, None)


def _explicit_backward(q, k, v, params, weights, count, eps, grad_out):
    """Gradients of :func:`centred_seqnorm` by autograd; differentiable when grad mode is on (create_graph)."""
    create_graph = torch.is_grad_enabled()
    inputs = [q, k, v, *params]
    with torch.enable_grad():
        if not create_graph:  # a first derivative only: a private graph over detached copies
            inputs = [t.detach().requires_grad_(True) for t in inputs]
        wanted = [t for t in inputs if t.requires_grad]
        out = centred_seqnorm(*inputs[:3], affine_views(inputs[3:], q), weights, count, eps)
        grads = iter(torch.autograd.grad(out, wanted, grad_out, create_graph=create_graph, allow_unused=True))
    return [next(grads) if t.requires_grad else None for t in inputs]


def _raw_moment_backward(q, k, v, params, weights, count, eps, moments, grad_out):
    """Gradients from the raw moments: three (N x d) @ (d x d)-sized products, no normalized copies."""
    g = grad_out if weights is None else grad_out * weights
    with torch.enable_grad():
        small = [t.detach().requires_grad_(True) for t in (*moments, *params)]
        a_q, b = _output_map(small[:7], count, affine_views(small[7:], q), eps)
        grad_a_q = q.transpose(-2, -1) @ g  # (B, H, d, D_v)
        grad_b = g.sum(dim=2, keepdim=True)  # (B, H, 1, D_v)
        d_s_q, d_sq_q, d_s_k, d_sq_k, d_s_v, d_sq_v, d_gkv, *d_params = torch.autograd.grad(
            (a_q, b), small, (grad_a_q, grad_b))
    a_q = a_q.detach()
    # out = Q a_q + b, and the raw moments: S = sum w x, Sq = sum w x^2, G_kv = K^T W V.
    grad_q = torch.baddbmm(d_s_q.flatten(0, 1), g.flatten(0, 1), a_q.transpose(-2, -1).flatten(0, 1))
    grad_q = grad_q.view(q.shape).addcmul_(q, 2 * d_sq_q)
    grad_k = torch.baddbmm(d_s_k.flatten(0, 1), v.flatten(0, 1), d_gkv.transpose(-2, -1).flatten(0, 1))
    grad_k = grad_k.view(k.shape).addcmul_(k, 2 * d_sq_k)
    grad_v = torch.baddbmm(d_s_v.flatten(0, 1), k.flatten(0, 1), d_gkv.flatten(0, 1))
    grad_v = grad_v.view(v.shape).addcmul_(v, 2 * d_sq_v)
    if weights is not None:
        grad_q.mul_(weights)
        grad_k.mul_(weights)
        grad_v.mul_(weights)
    return (grad_q, grad_k, grad_v, *d_params)
