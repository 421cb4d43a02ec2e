"""Attention rollout and gradient-weighted rollout from the class token, linear-time for linear attention.

**Rollout** (Abnar & Zuidema 2020, "Quantifying attention flow in transformers", read from the class
token's row only). A pre-norm block maps token i to ``x_i + sum_j A_ij (...)_j`` (attention) and then a
token-wise MLP, which mixes no tokens. Rollout models each block's token mixing as ``M = (I + Abar) / 2``
with ``Abar`` the head-mean of the attention weights, and the class token's relevance over the input
tokens as the row ``e_cls^T M_L ... M_1``. Going down from the top:

    r_L = e_cls,        r_{l-1} = (r_l + rowmean_l(r_l)) / 2,     rowmean_l(r) = mean_h r^T A_h

and the relevance of input token j is ``r_0[j]`` (``r_0[cls]`` is the share the class token keeps). A ViT whose head
reads the mean of the patch tokens (``global_pool="avg"``) starts from those weights instead of ``e_cls``:
``r_L = (0, 1/N, ..., 1/N)`` (:func:`readout_start`); everything below is linear in r and unchanged.
Only row vectors ever meet A, so linear attention needs ``r^T A_h = s (r^T phi_q) phi_k^T``, O(N d)
(:mod:`medattn.attention.rows`, each mechanism's ``rollout_rule``); softmax forms its weights a block of
queries at a time. Softmax weights are row-stochastic, so r stays a probability vector; linear-attention
weights are signed and their rows do not sum to 1, so r is signed, and its sign says whether a token adds to
or takes from the class token's mixture, not whether it raises the logit (docs/explain.md).

**Gradient-weighted rollout** (the attention-gradient rule of Chefer, Gur & Wolf: ICCV 2021, "Generic
attention-model explainability for interpreting bi-modal and encoder-decoder transformers", eqs. 5-6;
their CVPR 2021 paper uses LRP relevances of A where this rule uses A itself). Chefer's rule, with
``G_h = d y_t / d A_h`` the gradient of the explained logit y_t through the whole network:

    Abar_l = mean_h (G_h ⊙ A_h)^+,   R <- R + Abar_l R  (block 1 to L, R = I),   relevance = R[cls, 1:]

Read from the class row, top-down: ``r_L = e_cls``, ``r_{l-1} = r_l + Abar_l^T r_l``. The entry-wise
positive part does not factorise through ``phi_q phi_k^T``, so this module computes instead

    r_{l-1} = r_l + mean_h ( r_l^T (G_h ⊙ A_h) )^+                    (positive part of the row, per head)

The row ``r^T (G_h ⊙ A_h)`` factorises exactly (:meth:`~medattn.attention.rows.ClassRows.gradient_rows`;
``G_h[i, j] = g_i . v_j`` with ``g = d y_t / d out_h``): O(N d D_v) per block, no N x N matrix. How it
differs from Chefer's: the clamp acts after the sum over queries i instead of on each (i, j) entry.
Because r >= 0 throughout, ``(sum_i r_i X_ij)^+ <= sum_i r_i X_ij^+``, so every entry is at most
Chefer's (at every depth, by induction), >= 0, and equal to Chefer's for the top block (r = e_cls,
the class row itself, which is exact) and wherever one head's terms ``r_i X_ij`` for a key j share one
sign. Softmax uses the same row rule from its explicit weights (block-wise), so the maps of all
mechanisms mean the same thing. Tested against explicit N x N float64 matrices whose gradient autograd
gives (tests/explain/test_explain.py).

The gradients g come from one backward pass: a forward hook adds a zero probe tensor to each attention
module's output, autograd gives ``d y_t / d output`` and, since :class:`~medattn.attention.base.Attention`
returns ``proj(out) * mask``, ``g = (d y_t / d output * mask) @ proj.weight`` split per head. No model
branches on the mechanism; parameters get no ``.grad``. The gradient rule needs that backward over the
whole sequence, so it is not streamed: bags too long for memory use :func:`streaming_rollout`.

The per-layer quantities (each attention module's input and mask) come from forward hooks on the
:class:`~medattn.attention.base.Attention` modules; q, k, v are recomputed from that input with the
module's own ``qkv`` and ``split_heads``. Models must put the class token first (``cls_token``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..attention import Attention
from ..attention.rows import FactorisedRows
from ..errors import UserError
from .rows import rows_for


@dataclass
class AttentionCall:
    """One attention module's forward: its input x (B, N, dim), key-padding mask (B, N) or None, and (with
    probes) the zero tensor added to its output, whose gradient is the gradient at the output."""

    module: Attention
    x: torch.Tensor
    mask: torch.Tensor | None
    probe: torch.Tensor | None = None

    def qkv(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k (B, H, N, d) and v (B, H, N, D_v) as the module computes them."""
        with torch.no_grad():
            return self.module.split_heads(self.module.qkv(self.x))

    def qk(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.qkv()[:2]

    def head_gradient(self, grad: torch.Tensor) -> torch.Tensor:
        """d y / d output (B, N, dim) -> g = d y / d out_h (B, H, N, D_v), out_h the per-head attention output
        (the base class returns ``proj(out) * mask``; dropout is off in eval mode)."""
        module = self.module
        if self.mask is not None:
            grad = grad * self.mask[..., None].to(grad.dtype)
        g = grad @ module.proj.weight.to(grad.dtype)  # (B, N, H * D_v)
        return g.unflatten(-1, (module.num_heads, module.value_dim)).transpose(1, 2)


@contextlib.contextmanager
def record_attention(model: nn.Module, probe: bool = False):
    """Within the block, every forward of an Attention module in ``model`` appends an :class:`AttentionCall`
    to the yielded list, in call order. With ``probe`` each output gets a zero tensor added (``call.probe``,
    requires grad), so autograd can give the gradient at every attention output."""
    calls: list[AttentionCall] = []

    def hook(module, args, kwargs, output):
        x = args[0] if args else kwargs["x"]
        mask = args[1] if len(args) > 1 else kwargs.get("mask", kwargs.get("attn_mask"))
        calls.append(AttentionCall(module, x.detach(), None if mask is None else mask.detach()))
        if probe:
            calls[-1].probe = torch.zeros_like(output, requires_grad=True)
            return output + calls[-1].probe
        return None

    handles = [m.register_forward_hook(hook, with_kwargs=True) for m in model.modules() if isinstance(m, Attention)]
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


def target_index(logits: torch.Tensor, target: int | None) -> torch.Tensor:
    """(B,) logit indices: ``target`` for every sample, or the predicted class (argmax; 0 for one output)."""
    if target is None:
        return logits.argmax(dim=1)
    if not 0 <= target < logits.shape[1]:
        raise UserError(f"target {target} is not one of the model's {logits.shape[1]} output(s)")
    return torch.full((logits.shape[0],), target, dtype=torch.long, device=logits.device)


def check_rollout_model(model: nn.Module) -> None:
    """UserError unless ``model`` has a class token first, one token per input after it (a model whose tokens are
    not its inputs declares ``tokens_are_inputs = False``) and attention modules that rollout has rules for."""
    modules = [m for m in model.modules() if isinstance(m, Attention)]
    if not getattr(model, "tokens_are_inputs", True):
        raise UserError(f"attention rollout maps tokens to inputs; {type(model).__name__}'s tokens are not its "
                        f"inputs (use --method gradxinput)")
    if not hasattr(model, "cls_token") or not modules:
        raise UserError(f"attention rollout needs a transformer with a class token; {type(model).__name__} has "
                        f"none (use --method gradxinput)")
    for module in modules:
        rows_for(module)


def readout_start(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(B, N) float64: the relevance rollout starts from at the last layer, the weights with which the head reads the
    final tokens (``model.readout_weights(N)``; the class token alone for a model without it)."""
    B, N, _ = x.shape
    if hasattr(model, "readout_weights"):
        return model.readout_weights(N).to(x.device).expand(B, N).clone()
    r = x.new_zeros(B, N, dtype=torch.float64)
    r[:, 0] = 1.0
    return r


def rollout_from_calls(model: nn.Module, calls: list[AttentionCall]) -> torch.Tensor:
    """r_0 (B, N) float64 from the recorded attention calls of one forward of ``model`` (module docstring)."""
    r = readout_start(model, calls[0].x)
    for call in reversed(calls):
        q, k = call.qk()
        r = 0.5 * (r + rows_for(call.module).row(call.module, q, k, call.mask, r))
    return r


def check_calls(model: nn.Module, calls: list[AttentionCall]) -> None:
    depth = sum(isinstance(m, Attention) for m in model.modules())
    if len(calls) != depth:
        raise UserError(f"expected each of the {depth} attention modules to run once, saw {len(calls)} calls")


@torch.no_grad()
def attention_rollout(model: nn.Module, *inputs, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``model(*inputs, **kwargs)``; -> (logits, r_0 (B, 1 + N) float64, class token first)."""
    check_rollout_model(model)
    with record_attention(model) as calls:
        logits = model(*inputs, **kwargs)
    check_calls(model, calls)
    return logits, rollout_from_calls(model, calls)


@contextlib.contextmanager
def without_recompute(model: nn.Module):
    """Activation checkpointing off in every encoder of ``model`` within the block (restored after): a
    recomputed block would run the attention hooks again and put fresh probes in the backward's graph."""
    from ..models.layers import Encoder

    encoders = [(m, m.activation_checkpointing) for m in model.modules() if isinstance(m, Encoder)]
    for encoder, _ in encoders:
        encoder.activation_checkpointing = False
    try:
        yield
    finally:
        for encoder, state in encoders:
            encoder.activation_checkpointing = state


def gradient_rollout(model: nn.Module, *inputs, target: int | None = None,
                     **kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradient-weighted rollout (module docstring) of logit ``target`` (default: the predicted class) for
    ``model(*inputs, **kwargs)``; -> (logits, target indices (B,), r_0 (B, 1 + N) float64 >= 0, class
    token first). One forward and one backward; memory that of a training step on the batch."""
    check_rollout_model(model)
    with without_recompute(model), record_attention(model, probe=True) as calls, torch.enable_grad():
        logits = model(*inputs, **kwargs)
        index = target_index(logits, target)
        check_calls(model, calls)
        grads = torch.autograd.grad(logits.gather(1, index[:, None]).sum(), [call.probe for call in calls])
    r = readout_start(model, calls[0].x)
    with torch.no_grad():
        for call, grad in zip(reversed(calls), reversed(grads)):
            q, k, v = call.qkv()
            rows = rows_for(call.module).gradient_rows(call.module, q, k, v, call.mask, r, call.head_gradient(grad))
            r = r + rows.clamp_min(0).mean(dim=1)
    return logits.detach(), index, r


@torch.no_grad()
def streaming_rollout(model, features, coords=None, chunk_size: int = 32_768) -> tuple[torch.Tensor, np.ndarray]:
    """Rollout tile scores for one bag (N, F) of a :class:`~medattn.models.wsi.WSITransformer` whose mechanisms
    stream and have factorised rows (SeqNorm), in memory O(chunk_size) plus the (N,) float32 scores.

    Unrolling the recursion with ``r_L = e_cls`` gives, for blocks m = 1..L (module docstring),

        r_0 = 2^-L e_cls + sum_m 2^-m rho_m,      rho_m[j] = (s_m / H) U_m . phi_k^(m)_j,
        U_m = r_m^T phi_q^(m) = 2^-(L-m) phi_q^(m)_cls + sum_{m'>m} 2^-(m'-m) (s_m'/H) U_m'^T C_{m',m},

    with ``C_{m',m} = sum_i phi_k^(m')_i phi_q^(m)_i^T`` (H d x H d). Passes over the bag: the streaming
    forward's statistics passes (gathering each layer's q, k sums on the way), one pass for the C's, one
    for the scores. Returns (logits (1, num_classes), scores (N,) = r_0 without the class token).
    """
    check_rollout_model(model)
    blocks = model.encoder.blocks
    rules = [rows_for(block.attn) for block in blocks]
    if not all(isinstance(rule, FactorisedRows) for rule in rules):
        raise UserError("streamed rollout needs linear attention (factorised rows) in every block")
    sums: list[dict | None] = [None] * len(blocks)

    def observe(layer: int, h: torch.Tensor) -> None:
        q, k, _ = blocks[layer].attn.split_heads(blocks[layer].attn.qkv(h))
        part = rules[layer].statistics(blocks[layer].attn, q, k, None)
        sums[layer] = part if sums[layer] is None else {key: sums[layer][key] + part[key] for key in part}

    states = model.stream_states(features, coords, chunk_size, observe)

    def maps_through(x: torch.Tensor):
        """(phi_q, phi_k, s) per block for a chunk x (1, n_c, D') at the model's input; each phi (n_c, H d)."""
        out = []
        for block, state, rule, stats in zip(blocks, states, rules, sums):
            h = block.norm1(x)
            q, k, _ = block.attn.split_heads(block.attn.qkv(h))
            phi_q, phi_k, scale = rule.maps(block.attn, q, k, None, stats)
            out.append((phi_q[0].transpose(0, 1).flatten(1), phi_k[0].transpose(0, 1).flatten(1), float(scale)))
            x = x + block.attn.stream_forward(state, h)
            x = x + block.mlp(block.norm2(x))
        return out, x

    L, H = len(blocks), [block.attn.num_heads for block in blocks]
    cross = {(hi, lo): 0 for hi in range(L) for lo in range(hi)}  # C_{hi,lo}, the class token included
    for index, x in enumerate(model.stream_chunks(features, coords, chunk_size)):
        maps, top = maps_through(x)
        if index == 0:
            cls_maps, cls_out = maps, top
        for hi, lo in cross:
            cross[hi, lo] = cross[hi, lo] + maps[hi][1].transpose(0, 1) @ maps[lo][0]  # (H d, H d)
    U: list[torch.Tensor | None] = [None] * L
    for m in reversed(range(L)):  # 0-based block m is block m + 1 of the docstring
        u = 0.5 ** (L - 1 - m) * cls_maps[m][0][0]
        for hi in range(m + 1, L):
            u = u + 0.5 ** (hi - m) * (cls_maps[hi][2] / H[hi]) * (U[hi] @ cross[hi, m])
        U[m] = u
    scores = np.empty(features.shape[0], dtype=np.float32)
    start = 0
    for index, x in enumerate(model.stream_chunks(features, coords, chunk_size)):
        if index == 0:
            continue
        maps, _ = maps_through(x)
        r = sum(0.5 ** (m + 1) * (maps[m][2] / H[m]) * (maps[m][1] @ U[m]) for m in range(L))
        scores[start:start + len(r)] = r.float().cpu().numpy()
        start += len(r)
    logits = model.head(model.encoder.norm(cls_out)[:, 0])
    return logits, scores
