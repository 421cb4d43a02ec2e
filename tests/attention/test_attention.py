"""Behaviour every registered attention mechanism must show, generated from the registry."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from medattn.attention import Attention, available_attentions, build_attention, get_attention_class, register
from medattn.attention.seqnorm import SequenceNorm
from references import REFERENCES, randomize_norm_affines

ALL = available_attentions()
LINEAR_COST = ["seqnorm", "sima", "linear"]


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).norm() / expected.norm().clamp_min(1e-30)).item()


def make(name, dim=32, num_heads=4, inner_dim=None, dtype=torch.float32, **kwargs):
    """A mechanism in eval mode with non-trivial values in every parameter (affines included)."""
    attn = build_attention(name, dim=dim, num_heads=num_heads, inner_dim=inner_dim, **kwargs)
    return randomize_norm_affines(attn.to(dtype).eval())


@pytest.mark.parametrize("name", sorted(REFERENCES))
@pytest.mark.parametrize("n", [1, 2, 197, 1025])
def test_equals_explicit_quadratic_form(name, n):
    attn = make(name, dim=48, num_heads=4, inner_dim=32)
    x = torch.randn(2, n, 48)
    with torch.no_grad():
        assert relative_error(attn(x), REFERENCES[name](attn, x)) <= 1e-5


def test_every_core_mechanism_has_a_reference():
    assert {"softmax", "seqnorm", "sima", "linear"} <= set(REFERENCES) <= set(ALL)


@pytest.mark.parametrize("name", [n for n in ALL if not get_attention_class(n).surrogate_gradient])
def test_gradcheck_float64_inputs_and_parameters(name):
    attn = make(name, dim=8, num_heads=2, dtype=torch.float64)
    names = [pname for pname, _ in attn.named_parameters()]
    params = [p.detach().clone().requires_grad_(True) for _, p in attn.named_parameters()]
    x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])

    def run(x, *params):
        return functional_call(attn, dict(zip(names, params)), (x, mask))

    assert torch.autograd.gradcheck(run, (x, *params), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("name", ALL)
def test_permutation_equivariant(name):
    attn = make(name)
    x = torch.randn(2, 11, 32)
    perm = torch.randperm(11)
    with torch.no_grad():
        torch.testing.assert_close(attn(x[:, perm]), attn(x)[:, perm], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("case", ["single_token", "constant", "huge_values"])
def test_degenerate_inputs_give_finite_output(name, case):
    attn = make(name)
    x = {
        "single_token": torch.randn(2, 1, 32),
        "constant": torch.randn(2, 1, 32).expand(2, 50, 32).contiguous(),
        "huge_values": 1e4 * torch.randn(2, 50, 32),
    }[case]
    out = attn(x)
    assert out.shape == x.shape and torch.isfinite(out).all()
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters() if p.grad is not None)


@pytest.mark.parametrize("name", [n if n in LINEAR_COST else pytest.param(n, marks=pytest.mark.slow) for n in ALL])
def test_long_sequence_finite_in_float32_and_bf16_autocast(name):
    """65,536 tokens; quadratic mechanisms take minutes here and run with the slow tests."""
    attn = make(name, dim=16, num_heads=2)
    x = torch.randn(1, 65_536, 16)
    with torch.no_grad():
        assert torch.isfinite(attn(x)).all()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = attn(x)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", ALL)
def test_timm_parameter_layout(name):
    attn = build_attention(name, dim=64, num_heads=8, inner_dim=32, qkv_bias=False)
    assert attn.qkv.weight.shape == (96, 64) and attn.qkv.bias is None
    assert attn.proj.weight.shape == (64, 32) and attn.proj.bias.shape == (64,)


def test_seqnorm_affine_parameters():
    attn = build_attention("seqnorm", dim=1024, num_heads=8, inner_dim=512)
    for norm in (attn.q_norm, attn.k_norm, attn.v_norm):
        assert norm.weight.shape == norm.bias.shape == (512,)
        assert torch.all(norm.weight == 1) and torch.all(norm.bias == 0)


def test_seqnorm_class_token_enters_statistics():
    """Changing only token 0 (the class token) changes every other token's output."""
    attn = make("seqnorm")
    x = torch.randn(1, 9, 32)
    y = x.clone()
    y[0, 0] += 5
    with torch.no_grad():
        assert not torch.allclose(attn(x)[0, 1:], attn(y)[0, 1:])


def test_seqnorm_token_mean_of_the_output_ignores_every_query():
    """Q' has mean beta_q over the tokens, so mean_i out_i = beta_q K'^T V' / N per head (docs/decisions.md:
    why the ViT keeps the class-token readout under seqnorm); the expected value is computed from K and V alone."""
    torch.manual_seed(0)
    attn = make("seqnorm")  # non-zero beta_q
    x = torch.randn(2, 50, 32)
    with torch.no_grad():
        q, k, v = attn.split_heads(attn.qkv(x))
        kv = attn.k_norm(k, None, 50).transpose(-2, -1) @ attn.v_norm(v, None, 50) / 50  # (B, H, d, d_v)
        beta_q = attn.q_norm.bias.view(1, attn.num_heads, 1, -1)
        torch.testing.assert_close(attn.attend(q, k, v, None).mean(dim=2, keepdim=True), beta_q @ kv,
                                   rtol=1e-5, atol=1e-5)
        q_other = torch.randn_like(q)  # any other queries: the same token mean
        torch.testing.assert_close(attn.attend(q_other, k, v, None).mean(dim=2, keepdim=True), beta_q @ kv,
                                   rtol=1e-5, atol=1e-5)


def test_seqnorm_statistics_in_float32_for_bf16_input():
    """bf16 projections with a large common offset are normalized in float32, not in bf16."""
    norm = SequenceNorm(32)
    x = (torch.randn(1, 2, 512, 16) + 300.0).bfloat16()
    out = norm(x, None, 512)
    assert out.dtype == torch.float32
    x32 = x.double()
    expected = (x32 - x32.mean(2, keepdim=True)) / (x32.var(2, keepdim=True, unbiased=False) + 1e-5).sqrt()
    assert relative_error(out.double(), expected) < 1e-5


def test_sima_picks_quadratic_order_for_short_sequences(monkeypatch):
    """N < d uses (Q K^T) V; the result is the same as Q (K^T V) either way (tested above)."""
    attn = make("sima", dim=64, num_heads=1)
    x = torch.randn(1, 4, 64)
    shapes = []
    original = torch.Tensor.__matmul__

    def spy(a, b):
        shapes.append(tuple(a.shape[-2:]) + tuple(b.shape[-1:]))
        return original(a, b)

    monkeypatch.setattr(torch.Tensor, "__matmul__", spy)
    with torch.no_grad():
        attn(x)
    assert (4, 64, 4) in shapes  # Q (4 x 64) @ K^T (64 x 4)


@pytest.mark.parametrize("kwargs, message", [
    (dict(dim=30, num_heads=4), "divisible"),
    (dict(dim=32, num_heads=0), "positive"),
    (dict(dim=32, num_heads=4, proj_drop=1.5), "dropout"),
])
@pytest.mark.parametrize("name", ALL)
def test_bad_arguments_raise(name, kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_attention(name, **kwargs)


@pytest.mark.parametrize("name", LINEAR_COST)
def test_linear_mechanisms_reject_attention_dropout(name):
    with pytest.raises(ValueError, match="attn_drop"):
        build_attention(name, dim=32, num_heads=4, attn_drop=0.1)


@pytest.mark.parametrize("name", ALL)
def test_bad_inputs_raise(name):
    attn = make(name)
    with pytest.raises(ValueError, match="shape"):
        attn(torch.randn(2, 5, 31))
    with pytest.raises(ValueError, match="bool"):
        attn(torch.randn(2, 5, 32), torch.ones(2, 5))
    with pytest.raises(ValueError, match="does not match"):
        attn(torch.randn(2, 5, 32), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="no real token"):
        attn(torch.randn(2, 5, 32), torch.tensor([[True] * 5, [False] * 5]))
    with pytest.raises(ValueError, match="empty"):
        attn(torch.randn(2, 0, 32))


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match="seqnorm"):
        build_attention("nope", dim=8)


def test_register_rejects_duplicates_and_non_attention_classes():
    with pytest.raises(ValueError, match="already"):
        register("seqnorm", get_attention_class("seqnorm"))
    with pytest.raises(TypeError):
        register("not-attention", torch.nn.Linear)


def test_base_class_is_abstract():
    with pytest.raises(NotImplementedError):
        Attention(8, 2)(torch.randn(1, 3, 8))
