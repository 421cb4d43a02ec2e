"""The SeqNorm core's algebra on tensors: the output from the raw moments, the explicit centred form, and the
gradients of both written out by hand.

The equations are :mod:`medattn.attention.seqnorm_fused`'s (its module docstring): from the raw moments
(``sum_n w x``, ``sum_n w x^2``, ``K^T W V``) the normalization's per-channel scale and shift (:func:`scale_shift`)
and the output map ``out = Q A_q + b`` (:func:`_output_map`); the explicit form normalizes copies of q, k, v
(:func:`sequence_normalize`, :func:`centred_seqnorm`). Autograd does not run inside the operator
``medattn::seqnorm_core``, so its backward is written out here: the raw-moment path's (:func:`_raw_moment_backward`,
through :func:`_output_map_backward`) and the centred path's (:func:`_centred_backward`, through
:func:`_normalize_backward`). Which path runs, the bf16 core's shift and the operator itself are
:mod:`medattn.attention.seqnorm_fused`'s; the Triton kernels (:mod:`medattn.attention.triton_seqnorm`) take the small
(d x d) steps between them from here.
"""

from __future__ import annotations

import torch


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


def _norm_backward(total, total_sq, count, gamma, eps, d_scale, d_shift, d_mean=0.0):
    """Gradients through :func:`scale_shift` (scale ``s = gamma r``, shift ``c = beta - mean s``, ``r =
    (var + eps)^-1/2``, ``var = Sq / n - mean^2`` clamped at 0, ``mean = S / n``): from those of s, c (and of the
    mean itself) to -> (dS, dSq, dgamma, dbeta), each (B, H, 1, d)."""
    mean = total / count
    var = total_sq / count - mean.square()
    r = torch.rsqrt(var.clamp_min(0.0) + eps)
    scale = gamma * r
    d_mean = d_mean - d_shift * scale
    d_scale = d_scale - d_shift * mean
    d_var = (d_scale * gamma) * (-0.5 * r.pow(3)) * (var >= 0)  # clamp_min's gradient: kept where var >= 0
    d_mean = d_mean - 2 * mean * d_var
    return d_mean / count, d_var / count, d_scale * r, d_shift


def _output_map_backward(moments, count, affines, eps, grad_a_q, grad_b):
    """Gradients of :func:`_output_map` (``a_q = s_q^T * A``, ``b = c_q A``, ``A = K'^T V' / n``) with respect to
    its seven moments and six affines (per batch element, (B, H, 1, d_t)), from those of a_q and b."""
    s_q, sq_q, s_k, sq_k, s_v, sq_v, g_kv = moments
    gq, bq, gk, bk, gv, bv = affines
    scale_q, shift_q, _, _ = scale_shift(s_q, sq_q, count, gq, bq, eps[0])
    scale_k, shift_k, _, _ = scale_shift(s_k, sq_k, count, gk, bk, eps[1])
    scale_v, shift_v, mean_v, _ = scale_shift(s_v, sq_v, count, gv, bv, eps[2])
    k_t, shift_k_t = scale_k.transpose(-2, -1), shift_k.transpose(-2, -1)
    a = (k_t * g_kv * scale_v + count * (bk.transpose(-2, -1) * shift_v + shift_k_t * (scale_v * mean_v))) / count
    d_ktv = (scale_q.transpose(-2, -1) * grad_a_q + shift_q.transpose(-2, -1) @ grad_b) / count  # (B, H, d, D_v)
    d_scale_q = (grad_a_q * a).sum(dim=-1).unsqueeze(-2)
    d_shift_q = grad_b @ a.transpose(-2, -1)
    through_shift_k = count * (shift_k @ d_ktv)  # (B, H, 1, D_v): the n c_k^T (s_v mean_v) term
    d_scale_k = (d_ktv * g_kv * scale_v).sum(dim=-1).unsqueeze(-2)
    d_shift_k = count * ((scale_v * mean_v) @ d_ktv.transpose(-2, -1))
    d_scale_v = (d_ktv * g_kv * k_t).sum(dim=-2, keepdim=True) + through_shift_k * mean_v
    d_shift_v = count * (bk @ d_ktv)
    d_s_q, d_sq_q, d_gq, d_bq = _norm_backward(s_q, sq_q, count, gq, eps[0], d_scale_q, d_shift_q)
    d_s_k, d_sq_k, d_gk, d_bk = _norm_backward(s_k, sq_k, count, gk, eps[1], d_scale_k, d_shift_k)
    d_s_v, d_sq_v, d_gv, d_bv = _norm_backward(s_v, sq_v, count, gv, eps[2], d_scale_v, d_shift_v,
                                               through_shift_k * scale_v)
    d_bk = d_bk + count * (shift_v @ d_ktv.transpose(-2, -1))  # the n beta_k^T c_v term
    return (d_s_q, d_sq_q, d_s_k, d_sq_k, d_s_v, d_sq_v, d_ktv * k_t * scale_v), (d_gq, d_bq, d_gk, d_bk, d_gv, d_bv)


def _normalize_backward(x, gamma, weights, count, eps, grad):
    """Gradients of :func:`sequence_normalize` -> (dx, dgamma, dbeta per batch element (B, H, 1, d)):
    ``dx = w r (g - sum(w g) / n - x_hat sum(w g x_hat) / n)`` with ``g = dy w gamma`` (instance norm's backward
    over the real tokens)."""
    xw = x if weights is None else x * weights
    mean = xw.sum(dim=2, keepdim=True) / count
    centred = x - mean if weights is None else (x - mean) * weights
    r = torch.rsqrt(centred.square().sum(dim=2, keepdim=True) / count + eps)
    x_hat = centred * r
    dy = grad if weights is None else grad * weights
    g = dy * gamma
    dx = r * (g - g.sum(dim=2, keepdim=True) / count - x_hat * (g * x_hat).sum(dim=2, keepdim=True) / count)
    return (dx if weights is None else dx * weights), (dy * x_hat).sum(dim=2, keepdim=True), dy.sum(dim=2,
                                                                                                        keepdim=True)


def _centred_backward(q, k, v, affines, weights, count, eps, grad_out):
    """Gradients of :func:`centred_seqnorm` (out = Q' A, A = K'^T V' / n) -> dq, dk, dv and the six affines'."""
    gq, bq, gk, bk, gv, bv = affines
    qn = sequence_normalize(q, gq, bq, weights, count, eps[0])
    kn = sequence_normalize(k, gk, bk, weights, count, eps[1])
    vn = sequence_normalize(v, gv, bv, weights, count, eps[2])
    a = kn.transpose(-2, -1) @ vn / count
    d_a = qn.transpose(-2, -1) @ grad_out / count
    dq, d_gq, d_bq = _normalize_backward(q, gq, weights, count, eps[0], grad_out @ a.transpose(-2, -1))
    dk, d_gk, d_bk = _normalize_backward(k, gk, weights, count, eps[1], vn @ d_a.transpose(-2, -1))
    dv, d_gv, d_bv = _normalize_backward(v, gv, weights, count, eps[2], kn @ d_a)
    return (dq, dk, dv), (d_gq, d_bq, d_gk, d_bk, d_gv, d_bv)


def _raw_moment_backward(q, k, v, affines, weights, count, eps, moments, grad_out):
    """Gradients from the raw moments: three (N x d) @ (d x d)-sized products, no normalized copies.

    The (N, d) tensors may be bf16 (the bf16 core): the small ones, in float32, are cast to their dtype for the
    products, whose sums PyTorch accumulates in float32."""
    low = q.dtype
    weights = None if weights is None else weights.to(low)
    g = grad_out if weights is None else grad_out * weights
    a_q, _ = _output_map(moments, count, affines, eps)
    (d_s_q, d_sq_q, d_s_k, d_sq_k, d_s_v, d_sq_v, d_gkv), d_affines = _output_map_backward(
        moments, count, affines, eps, (q.transpose(-2, -1) @ g).to(a_q.dtype),
        g.sum(dim=2, keepdim=True, dtype=a_q.dtype))
    # out = Q a_q + b, and the raw moments: S = sum w x, Sq = sum w x^2, G_kv = K^T W V.
    a_q, d_gkv = a_q.to(low), d_gkv.to(low)
    grad_q = torch.baddbmm(d_s_q.to(low).flatten(0, 1), g.flatten(0, 1), a_q.transpose(-2, -1).flatten(0, 1))
    grad_q = grad_q.view(q.shape).addcmul_(q, (2 * d_sq_q).to(low))
    grad_k = torch.baddbmm(d_s_k.to(low).flatten(0, 1), v.flatten(0, 1), d_gkv.transpose(-2, -1).flatten(0, 1))
    grad_k = grad_k.view(k.shape).addcmul_(k, (2 * d_sq_k).to(low))
    grad_v = torch.baddbmm(d_s_v.to(low).flatten(0, 1), k.flatten(0, 1), d_gkv.flatten(0, 1))
    grad_v = grad_v.view(v.shape).addcmul_(v, (2 * d_sq_v).to(low))
    if weights is not None:
        for grad in (grad_q, grad_k, grad_v):
            grad.mul_(weights)
    return (grad_q, grad_k, grad_v), d_affines
