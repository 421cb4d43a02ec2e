"""The fused raw-moment seqnorm path and its centred fallback equal an independent explicit form
(tests/references.py, no library helper), in value and gradient."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from medattn.attention import build_attention, seqnorm_fused
from references import seqnorm_core_reference


@pytest.fixture
def centred_calls(monkeypatch):
    """Counts how often the centred (ill-conditioned) path runs."""
    calls = []
    original = seqnorm_fused.centred_seqnorm

    def counting(*args):
        calls.append(1)
        return original(*args)

    monkeypatch.setattr(seqnorm_fused, "centred_seqnorm", counting)
    return calls


def make(dtype=torch.float64, dim=16, heads=2):
    attn = build_attention("seqnorm", dim=dim, num_heads=heads).to(dtype)
    with torch.no_grad():
        for p in attn.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return attn


def split(attn, x):
    B, N, _ = x.shape
    return attn.qkv(x).view(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4).unbind(0)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("offset", [0.0, 1e3])
def test_fused_equals_reference_value_and_gradient(masked, offset, centred_calls):
    attn = make()
    x = torch.randn(3, 64, 16, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(3, 64, dtype=torch.bool)
    if masked:
        mask[1, 40:], mask[2, 20:] = False, False
    q, k, v = split(attn, x)
    q = q + offset  # a large common offset makes the raw moments ill-conditioned
    m = mask if masked else None
    fast = attn.attend(q, k, v, m)
    reference = seqnorm_core_reference(attn, q, k, v, m)
    assert len(centred_calls) == (1 if offset else 0)
    torch.testing.assert_close(fast, reference, rtol=1e-10, atol=1e-10)
    grad = torch.randn_like(fast)
    inputs = [x] + [p for name, p in attn.named_parameters() if not name.startswith("proj")]
    for a, b in zip(torch.autograd.grad(fast, inputs, grad, retain_graph=True),
                    torch.autograd.grad(reference, inputs, grad)):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-8)


def test_gradcheck_on_the_raw_moment_path(centred_calls):
    attn = make(dim=8)
    names = [n for n, _ in attn.named_parameters()]
    params = [p.detach().clone().requires_grad_(True) for p in attn.parameters()]
    x = torch.randn(2, 40, 8, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1, 30:] = False

    def run(x, *params):
        return functional_call(attn, dict(zip(names, params)), (x, mask))

    assert torch.autograd.gradcheck(run, (x, *params), eps=1e-6, atol=1e-5)
    assert not centred_calls


def test_float32_fused_matches_float64_reference():
    attn = make(torch.float64, dim=64, heads=4)
    x = torch.randn(1, 4096, 64, dtype=torch.float64)
    with torch.no_grad():
        expected = attn(x)
        actual = attn.float()(x.float()).double()
    assert ((actual - expected).norm() / expected.norm()).item() < 1e-5
