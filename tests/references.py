"""Slow explicit forms of every core mechanism, written independently of the library.

Each takes the mechanism's parameters and x (B, N, dim) and forms the N x N matrix the fast path avoids.
"""

from __future__ import annotations

import torch


def randomize_norm_affines(attn):
    """Give every ``*norm.weight`` / ``*norm.bias`` non-trivial values (1 + 0.3 z, 0.3 z), so the affines are tested."""
    with torch.no_grad():
        for name, p in attn.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif name.endswith("norm.bias"):
                p.copy_(0.3 * torch.randn_like(p))
    return attn


def split_qkv(attn, x):
    """q, k, v as (B, H, N, d) computed from attn.qkv by explicit slicing."""
    B, N, _ = x.shape
    H, C = attn.num_heads, attn.inner_dim
    qkv = x @ attn.qkv.weight.T + (attn.qkv.bias if attn.qkv.bias is not None else 0)
    parts = [qkv[..., i * C:(i + 1) * C].reshape(B, N, H, C // H).transpose(1, 2) for i in range(3)]
    return parts


def merge(attn, out):
    B, H, N, d = out.shape
    return out.transpose(1, 2).reshape(B, N, H * d) @ attn.proj.weight.T + attn.proj.bias


def softmax_reference(attn, x):
    q, k, v = split_qkv(attn, x)
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    return merge(attn, torch.softmax(scores, dim=-1) @ v)


def _seq_normalize(t, norm):
    B, H, N, d = t.shape
    mean = t.mean(dim=2, keepdim=True)
    var = ((t - mean) ** 2).mean(dim=2, keepdim=True)
    gamma, beta = norm.weight.view(1, H, 1, d), norm.bias.view(1, H, 1, d)
    return gamma * (t - mean) / torch.sqrt(var + norm.eps) + beta


def seqnorm_reference(attn, x):
    """((Q' K'^T) V') / N with explicitly normalized Q', K', V'."""
    q, k, v = split_qkv(attn, x)
    q, k, v = _seq_normalize(q, attn.q_norm), _seq_normalize(k, attn.k_norm), _seq_normalize(v, attn.v_norm)
    scores = q @ k.transpose(-1, -2)  # (B, H, N, N)
    return merge(attn, scores @ v / x.shape[1])


def seqnorm_core_reference(attn, q, k, v, mask=None):
    """Per-head core out = Q' (K'^T V') / n on q, k, v (B, H, N, d), one sequence at a time over its real
    tokens (torch.var_mean, biased), padded rows zero: written without the library's normalization helpers."""
    out = torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype)
    for b in range(q.shape[0]):
        real = slice(None) if mask is None else mask[b]
        normed = []
        for t, norm in zip((q, k, v), (attn.q_norm, attn.k_norm, attn.v_norm)):
            t = t[b][:, real]  # (H, n, d_t)
            var, mean = torch.var_mean(t, dim=1, keepdim=True, unbiased=False)
            H, d = t.shape[0], t.shape[-1]
            normed.append(norm.weight.view(H, 1, d) * (t - mean) / torch.sqrt(var + norm.eps) + norm.bias.view(H, 1, d))
        qn, kn, vn = normed
        out[b][:, real] = (qn @ kn.transpose(-1, -2)) @ vn / qn.shape[1]
    return out


def sima_reference(attn, x):
    """(Q^ K^T) V with Q, K divided by their per-channel l1 norm over tokens."""
    q, k, v = split_qkv(attn, x)
    q = q / q.abs().sum(dim=2, keepdim=True).clamp_min(attn.eps)
    k = k / k.abs().sum(dim=2, keepdim=True).clamp_min(attn.eps)
    return merge(attn, (q @ k.transpose(-1, -2)) @ v)


def linear_reference(attn, x):
    """Row-normalized similarity matrix phi(q_i)^T phi(k_j) applied to V."""
    q, k, v = split_qkv(attn, x)
    phi_q = torch.where(q > 0, q + 1, torch.exp(q))
    phi_k = torch.where(k > 0, k + 1, torch.exp(k))
    sim = phi_q @ phi_k.transpose(-1, -2)  # (B, H, N, N)
    return merge(attn, (sim @ v) / (sim.sum(dim=-1, keepdim=True) + attn.eps))


def binary_attention_reference(q_terms, k_terms, v, scale, mask=None):
    """softmax(S) V in float64 for BinaryFormer's scores S = scale sum_(a,b) (wq_a wk_b^T) * (yq_a yk_b^T) (eq. 2 as
    a float product): terms ``(signs (B, H, N, c) +-1, weights (B, H, N) or None)``, v (B, H, N, D_v), mask (B, N)
    bool (False keys get no weight); differentiable in the signs, weights and v."""
    scores = 0
    for yq, wq in q_terms:
        for yk, wk in k_terms:
            s = yq.double() @ yk.double().transpose(-1, -2)  # (B, H, N, N)
            s = s if wq is None else s * wq.double()[..., :, None]
            scores = scores + scale * (s if wk is None else s * wk.double()[..., None, :])
    if mask is not None:
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1) @ v.double()


REFERENCES = {
    "softmax": softmax_reference,
    "seqnorm": seqnorm_reference,
    "sima": sima_reference,
    "linear": linear_reference,
}
