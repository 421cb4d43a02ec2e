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
the centred path (explicit normalized tensors) and the backward differentiates that path.

The core is a registered PyTorch operator, ``medattn::seqnorm_core`` with its backward
``medattn::seqnorm_core_backward`` (:func:`seqnorm_core`): both choose their path inside the operator, from the
data, where a graph cannot see it, and say only their output shapes to the compiler (fake implementations), so
``torch.compile(fullgraph=True)`` keeps the fused path instead of tracing the explicit form. Both gradients are
written out by hand (:mod:`medattn.attention.seqnorm_maths`), since autograd does not run inside an operator. Where
the backward must itself be differentiable (``create_graph=True``: double backward, Hessian-vector products) it
differentiates the explicit centred form with autograd instead, so higher derivatives are those of the explicit
form. ``torch.export`` and ONNX export take the explicit form
(:func:`medattn.attention.base.is_exporting`): an exported program then needs no medattn to run. On CUDA, where
``triton`` is installed, both operators run Triton kernels (:mod:`medattn.attention.triton_seqnorm` registers them
when the mechanism module is imported: the same outputs, the same paths).

**The bf16 core.** Given bf16 q, k, v (bf16 autocast), the operator computes in bf16 instead of in float32: each
channel is first shifted by its mean rounded to bf16 (``x - shift``, zero at padded tokens; the output does not
depend on any constant shift, since the normalization removes it), then its sums and sums of squares are
accumulated in float32 (squares block by block), ``K^T V`` and ``Q A_q`` run as bf16 products (accumulated in
float32 by PyTorch) and the output is bf16. The shift keeps the raw moments well conditioned in bf16, whose
``K^T V`` is rounded to bf16: without it, channels whose means are about twice their spread give an output 6e-2
off (measured) instead of 3e-3. The backward takes the same shifted tensors and gives bf16 gradients of q, k, v
and float32 ones of the affines. Tolerance (tests/attention/test_seqnorm_bf16.py): relative Frobenius error of the
output and of every gradient against float64 on the same bf16 inputs at most 2^-7 (two bf16 roundings); measured
2.4-3.0e-3 and 2.9-4.0e-3, where rounding the exact output to bf16 alone gives 1.7e-3. No (B, H, N, d)-sized
tensor is cast in the layer.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import register_flop_formula

from .base import at_least_float32, float32_or_wider
from .seqnorm_maths import _centred_backward, _output_map, _raw_moment_backward, affine_views, centred_seqnorm

#: Largest mean^2 / var ratio of any channel for which the raw-moment path is used (its relative
#: error grows like 6e-8 * (1 + ratio) in float32).
CONDITION_LIMIT = 1e3


#: Tokens per block when summing squares: small blocks keep temporaries out of fresh page-faulted memory.
SQUARE_BLOCK = 512

#: Dtypes in which the core runs as it is given (its products in that dtype, statistics in float32), instead of in
#: float32: the bf16 core (module docstring). float16 is upcast: its range does not hold sums of squares.
LOW_PRECISION = (torch.bfloat16,)


def keeps_dtype(x: torch.Tensor) -> bool:
    """Whether the core computes in x's dtype (:data:`LOW_PRECISION`, the bf16 core) rather than in float32."""
    return x.dtype in LOW_PRECISION


def _moments(x: torch.Tensor, weights: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """sum_n w x and sum_n w x^2, each (B, H, 1, d), for x (B, H, N, d), accumulated in float32 or wider.

    The squares are summed block by block of tokens, which measured faster than either one Gram
    product or one full-size square on this project's CPU (docs/performance.md); a bf16 block is
    upcast on its own, so no full-size float32 copy is made.
    """
    accumulate = float32_or_wider(x)
    total = x.sum(dim=2, keepdim=True, dtype=accumulate) if weights is None else 0
    total_sq = 0
    for start in range(0, x.shape[2], SQUARE_BLOCK):
        block = x[:, :, start:start + SQUARE_BLOCK].to(accumulate)
        weighted = block if weights is None else block * weights[:, :, start:start + SQUARE_BLOCK]
        if weights is not None:
            total = total + weighted.sum(dim=2, keepdim=True)
        total_sq = total_sq + torch.linalg.vecdot(weighted, block, dim=2).unsqueeze(-2)
    return total, total_sq


def _ill_conditioned(moments, count) -> bool:
    """Whether a channel of q, k or v has ``mean^2 > CONDITION_LIMIT * var`` (from the raw moments): one read back
    from the device for all three, so that a GPU waits once per call."""
    flags = []
    for total, total_sq in zip(moments[0:6:2], moments[1:6:2]):
        mean = total / count
        var = total_sq / count - mean.square()
        flags.append((mean.square() > CONDITION_LIMIT * var).any())
    return bool(torch.stack(flags).any())


def _count(q: torch.Tensor, weights: torch.Tensor | None):
    """Real tokens: N, or (B, 1, 1, 1) from the 0/1 ``weights`` (B, 1, N, 1), counted in float32 or wider (a bf16
    count would round above 256)."""
    return q.shape[2] if weights is None else weights.sum(dim=2, keepdim=True, dtype=float32_or_wider(weights))


def _shift(x: torch.Tensor, weights: torch.Tensor | None, count) -> torch.Tensor:
    """The bf16 core's per-channel shift (B, H, 1, d): the mean of x (B, H, N, d) over its ``count`` real tokens,
    rounded to x's dtype; zeros where x is not in :data:`LOW_PRECISION` (no shift is applied then)."""
    if not keeps_dtype(x):
        return x.new_zeros(*x.shape[:2], 1, x.shape[3])
    if weights is None:
        total = x.sum(dim=2, keepdim=True, dtype=float32_or_wider(x))
    else:  # a product instead of a full-size masked copy; its bf16 rounding is harmless in a shift
        total = weights.transpose(-2, -1).to(x.dtype) @ x
    return (total / count).to(x.dtype)


def _centre(x: torch.Tensor, shift: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """``W (x - shift)``: x with its channels' means (nearly) removed and zero at padded tokens. The output does
    not depend on the shift (normalization removes any constant per channel), only the moments' conditioning
    does: about zero, bf16 moments of a shifted channel hold its spread instead of cancelling it away."""
    centred = x - shift
    return centred if weights is None else centred.mul_(weights.to(x.dtype))


def _low_precision_inputs(q, k, v, weights, shifts):
    """q, k, v as the core computes with them: centred by ``shifts`` in the bf16 core, as given otherwise; and the
    weights its sums need (None in the bf16 core: its centred tensors are already zero at padded tokens)."""
    if not keeps_dtype(q):
        return (q, k, v), weights
    return tuple(_centre(x, shift, weights) for x, shift in zip((q, k, v), shifts)), None


#: The two operators (``torch.ops.medattn.*``), defined with the library's low-level API: ``torch.library.custom_op``
#: wraps its functions so that their first call imports torch._dynamo (2 s and 80 MiB in every process).
_LIBRARY = torch.library.Library("medattn", "DEF")
_LIBRARY.define("seqnorm_core(Tensor q, Tensor k, Tensor v, Tensor gq, Tensor bq, Tensor gk, Tensor bk, Tensor gv, "
                "Tensor bv, Tensor? weights, float[] eps) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, "
                "Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")
_LIBRARY.define("seqnorm_core_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor gq, Tensor bq, "
                "Tensor gk, Tensor bk, Tensor gv, Tensor bv, Tensor? weights, float[] eps, Tensor s_q, Tensor sq_q, "
                "Tensor s_k, Tensor sq_k, Tensor s_v, Tensor sq_v, Tensor g_kv, Tensor centred, Tensor shift_q, "
                "Tensor shift_k, Tensor shift_v) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, "
                "Tensor)")

#: Saved by the operator beside its inputs: the seven moments, the path taken and the three shifts.
_SAVED_OUTPUTS = 11


def _core(q, k, v, gq, bq, gk, bk, gv, bv, weights, eps):
    """``medattn::seqnorm_core`` -> (out, S_q, Sq_q, S_k, Sq_k, S_v, Sq_v, G_kv, centred, shift_q, shift_k, shift_v):
    the output (in q's dtype) and what its backward needs (moments in float32 or wider, shifts in q's dtype)."""
    count = _count(q, weights)
    shifts = tuple(_shift(x, weights, count) for x in (q, k, v))
    (q, k, v), sum_weights = _low_precision_inputs(q, k, v, weights, shifts)
    moments = (*_moments(q, sum_weights), *_moments(k, sum_weights), *_moments(v, sum_weights),
               (k.transpose(-2, -1) @ (v if sum_weights is None else v * sum_weights)).to(float32_or_wider(q)))
    affines = affine_views((gq, bq, gk, bk, gv, bv), moments[0])  # moments[-1] is G_kv (B, H, d, D_v)
    centred = _ill_conditioned(moments, count)
    if centred:
        wide = [at_least_float32(t) for t in (q, k, v)]
        out = centred_seqnorm(*wide, affines, weights, count, eps).to(q.dtype)
    else:
        a_q, b = _output_map(moments, count, affines, eps)
        out = torch.baddbmm(b.to(q.dtype).flatten(0, 1), q.flatten(0, 1), a_q.to(q.dtype).flatten(0, 1))
        out = out.view(*q.shape[:3], -1)
        out = out if weights is None else out.mul_(weights.to(q.dtype))
    return (*(t.contiguous() for t in (out, *moments)), q.new_full((), centred, dtype=torch.bool), *shifts)


def _core_shapes(q, k, v, gq, bq, gk, bk, gv, bv, weights, eps):
    (B, H, N, d), dv, wide = q.shape, v.shape[-1], float32_or_wider(q)
    row, row_v = q.new_empty(B, H, 1, d, dtype=wide), q.new_empty(B, H, 1, dv, dtype=wide)
    return (q.new_empty(B, H, N, dv), row, row.clone(), row.clone(), row.clone(), row_v, row_v.clone(),
            q.new_empty(B, H, d, dv, dtype=wide), q.new_empty((), dtype=torch.bool),
            q.new_empty(B, H, 1, d), q.new_empty(B, H, 1, d), q.new_empty(B, H, 1, dv))


def _core_backward(grad_out, q, k, v, gq, bq, gk, bk, gv, bv, weights, eps, s_q, sq_q, s_k, sq_k, s_v, sq_v, g_kv,
                   centred, shift_q, shift_k, shift_v):
    """``medattn::seqnorm_core_backward`` -> gradients of q, k, v (in their dtype) and of the six affines
    (H * d_t,), on the path the forward took; the bf16 core's from the same shifted tensors as its forward."""
    params = (gq, bq, gk, bk, gv, bv)
    count, affines = _count(q, weights), affine_views(params, s_q)
    (q, k, v), _ = _low_precision_inputs(q, k, v, weights, (shift_q, shift_k, shift_v))
    if bool(centred):
        wide = [at_least_float32(t) for t in (q, k, v)]
        grads, d_affines = _centred_backward(*wide, affines, weights, count, eps, at_least_float32(grad_out))
        grads = [g.to(q.dtype) for g in grads]
    else:
        moments = (s_q, sq_q, s_k, sq_k, s_v, sq_v, g_kv)
        grads, d_affines = _raw_moment_backward(q, k, v, affines, weights, count, eps, moments, grad_out)
    return (*(g.contiguous() for g in grads),
            *(d.sum(dim=0).reshape(p.shape).to(p.dtype) for d, p in zip(d_affines, params)))


def _core_backward_shapes(grad_out, q, k, v, gq, bq, gk, bk, gv, bv, weights, eps, *moments_and_path):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),  # contiguous, as the operator's
            *(p.new_empty(p.shape) for p in (gq, bq, gk, bk, gv, bv)))


def _setup(ctx, inputs, output):
    q, k, v, gq, bq, gk, bk, gv, bv, weights, eps = inputs
    ctx.eps, ctx.has_weights = eps, weights is not None
    ctx.save_for_backward(q, k, v, gq, bq, gk, bk, gv, bv, *output[1:], *(() if weights is None else (weights,)))
    ctx.mark_non_differentiable(*output[1:])


def _backward(ctx, grad_out, *unused):
    saved = ctx.saved_tensors  # read once: checkpointing's recomputed tensors unpack only once
    (q, k, v, *params), moments_and_path = saved[:9], saved[9:9 + _SAVED_OUTPUTS]
    weights = saved[9 + _SAVED_OUTPUTS] if ctx.has_weights else None
    if torch.is_grad_enabled():  # create_graph: a differentiable backward, the explicit form's by autograd
        inputs = [q, k, v, *params]
        wanted = [t for t in inputs if t.requires_grad]
        wide = [at_least_float32(t) for t in (q, k, v)]
        out = centred_seqnorm(*wide, affine_views(params, wide[0]), weights, _count(q, weights), ctx.eps).to(q.dtype)
        grads = iter(torch.autograd.grad(out, wanted, grad_out, create_graph=True, allow_unused=True))
        return (*(next(grads) if t.requires_grad else None for t in inputs), None, None)
    return (*torch.ops.medattn.seqnorm_core_backward(grad_out, q, k, v, *params, weights, ctx.eps, *moments_and_path),
            None, None)


for _name, _function, _shapes in (("seqnorm_core", _core, _core_shapes),
                                  ("seqnorm_core_backward", _core_backward, _core_backward_shapes)):
    _LIBRARY.impl(_name, _function, "CompositeExplicitAutograd")
    torch.library.register_fake(f"medattn::{_name}", _shapes, lib=_LIBRARY)
torch.library.register_autograd("medattn::seqnorm_core", _backward, setup_context=_setup, lib=_LIBRARY)

@register_flop_formula(torch.ops.medattn.seqnorm_core)
def _core_flops(q_shape, k_shape, v_shape, *args, **kwargs) -> int:
    """What PyTorch's FlopCounterMode counts for the operator, whose inside it does not see: ``K^T W V`` and
    ``Q A_q``, ``4 B H N d D_v`` (the moments' sums are not matmuls)."""
    (B, H, N, d), dv = q_shape, v_shape[-1]
    return 4 * B * H * N * d * dv


@register_flop_formula(torch.ops.medattn.seqnorm_core_backward)
def _core_backward_flops(grad_shape, q_shape, k_shape, v_shape, *args, **kwargs) -> int:
    """Four products of the forward's size: ``Q^T G``, ``G A_q^T``, ``V dG^T``, ``K dG``: ``8 B H N d D_v``."""
    (B, H, N, d), dv = q_shape, v_shape[-1]
    return 8 * B * H * N * d * dv


def seqnorm_core(q, k, v, params, weights, eps) -> torch.Tensor:
    """out = W Q' (K'^T V') / n for q, k (B, H, N, d), v (B, H, N, D_v) in float32, float64 or bf16 (the bf16
    core; module docstring) (the operator ``medattn::seqnorm_core``): ``params`` the six affine tensors (H * d_t,)
    (gamma_q, beta_q, ..., beta_v), ``weights`` (B, 1, N, 1) 0/1 or None, ``eps`` (eps_q, eps_k, eps_v).
    -> (B, H, N, D_v) in q's dtype, zero at padded positions. The raw-moment path, or the centred one where the
    moments are ill-conditioned (module docstring); backward likewise, differentiable where ``create_graph`` asks
    for it."""
    return torch.ops.medattn.seqnorm_core(q, k, v, *params, weights, [float(e) for e in eps])[0]
