"""Explanations: the linear-time class rows equal the explicit N x N attention of the same module, rollout
equals the explicit matrix product, gradient-weighted rollout equals its rule on explicit matrices whose gradient
autograd gives (and Chefer et al.'s entry-wise rule at the top block), streamed bags equal in-memory ones,
gradient x input is the gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from medattn.attention import Attention, build_attention
from medattn.errors import UserError
from medattn.explain import (
    attention_rollout,
    default_method,
    explain,
    gradient_rollout,
    record_attention,
    rows_for,
    streaming_rollout,
)
from medattn.models import create_model
from medattn.models.layers import set_activation_checkpointing

MECHANISMS = ["seqnorm", "sima", "linear", "softmax"]


def perturb_norms(module: torch.nn.Module) -> None:
    """Non-trivial SeqNorm affines (weight 1, bias 0 at init would hide mistakes in the affine)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name and name.endswith(("weight", "bias")):
                p.add_(0.3 * torch.randn_like(p))


def seq_normalize(x: torch.Tensor, weight, bias, eps: float, keep: torch.Tensor) -> torch.Tensor:
    """Explicit two-pass sequence normalization of x (B, H, N, d) over real tokens ``keep`` (B, N)."""
    H, d = x.shape[1], x.shape[-1]
    w = keep[:, None, :, None].double()
    n = w.sum(2, keepdim=True)
    mean = (x * w).sum(2, keepdim=True) / n
    var = ((x - mean) ** 2 * w).sum(2, keepdim=True) / n
    out = (x - mean) / torch.sqrt(var + eps) * weight.view(1, H, 1, d) + bias.view(1, H, 1, d)
    return out * w


def explicit_attention(module, q, k, v, keep):
    """(A (B, H, N, N), the values A multiplies) written out for each mechanism, independent of the code under test."""
    w = keep[:, None, :, None].double()
    if type(module).__name__ == "SeqNormAttention":
        qn = seq_normalize(q, module.q_norm.weight, module.q_norm.bias, module.q_norm.eps, keep)
        kn = seq_normalize(k, module.k_norm.weight, module.k_norm.bias, module.k_norm.eps, keep)
        vn = seq_normalize(v, module.v_norm.weight, module.v_norm.bias, module.v_norm.eps, keep)
        return qn @ kn.transpose(-2, -1) / w.sum(2, keepdim=True), vn
    if type(module).__name__ == "SimAAttention":
        qn = q * w / (q * w).abs().sum(2, keepdim=True).clamp_min(module.eps)
        kn = k * w / (k * w).abs().sum(2, keepdim=True).clamp_min(module.eps)
        return qn @ kn.transpose(-2, -1), v
    if type(module).__name__ == "LinearAttention":
        pq, pk = F.elu(q) + 1, (F.elu(k) + 1) * w
        scores = pq @ pk.transpose(-2, -1)
        return scores / (scores.sum(-1, keepdim=True) + module.eps), v
    scores = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
    return scores.softmax(-1), v


@pytest.mark.parametrize("name", MECHANISMS)
@pytest.mark.parametrize("masked", [False, True])
def test_class_rows_equal_the_explicit_attention_matrix(name, masked):
    torch.manual_seed(0)
    module = build_attention(name, 24, num_heads=3).double().eval()
    perturb_norms(module)
    B, N = 2, 37
    x = torch.randn(B, N, 24, dtype=torch.float64) + 0.5
    keep = torch.ones(B, N, dtype=torch.bool)
    if masked:
        keep[1, 29:] = False
    mask = keep if masked else None
    q, k, v = module.split_heads(module.qkv(x))
    A, values = explicit_attention(module, q, k, v, keep)
    # the reference matrix is the module's: A times its values is the module's own attention output
    torch.testing.assert_close((A @ values) * keep[:, None, :, None], module.attend(q, k, v, mask) *
                               keep[:, None, :, None], rtol=1e-9, atol=1e-10)
    r = torch.randn(B, N, dtype=torch.float64) * keep
    expected = torch.einsum("bn,bhnm->bm", r, A) / module.num_heads
    torch.testing.assert_close(rows_for(module).row(module, q, k, mask, r), expected, rtol=1e-9, atol=1e-12)


def explicit_rollout(model, *inputs, start=None, **kwargs):
    """s^T M_L ... M_1 with M = (I + mean_h A_h) / 2 from the explicit matrices; s = e_cls unless ``start`` (N,)."""
    with torch.no_grad(), record_attention(model) as calls:
        model(*inputs, **kwargs)
    B, N, _ = calls[0].x.shape
    r = torch.zeros(B, 1, N, dtype=torch.float64)
    if start is None:
        r[:, 0, 0] = 1
    else:
        r[:, 0] = start
    keep = torch.ones(B, N, dtype=torch.bool) if calls[0].mask is None else calls[0].mask
    for call in reversed(calls):
        q, k, v = call.module.split_heads(call.module.qkv(call.x))
        A, _ = explicit_attention(call.module, q, k, v, keep)
        r = r @ (0.5 * torch.eye(N, dtype=torch.float64) + 0.5 * A.mean(1))
    return r[:, 0]


@pytest.mark.parametrize("name", MECHANISMS)
def test_rollout_equals_the_explicit_matrix_product(name):
    torch.manual_seed(1)
    model = create_model("vitwsi_tiny", attention=name, num_classes=2).double().eval()
    perturb_norms(model)
    features = torch.randn(2, 40, 16, dtype=torch.float64)
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[0, 31:] = False
    _, r = attention_rollout(model, features, mask=mask)
    torch.testing.assert_close(r, explicit_rollout(model, features, mask=mask), rtol=1e-9, atol=1e-12)
    assert (r[~torch.cat([mask.new_ones(2, 1), mask], 1)] == 0).all()  # padded tiles get nothing


@pytest.mark.parametrize("name", MECHANISMS)
def test_rollout_of_an_average_pooled_vit_starts_from_the_patch_tokens(name):
    """The head reads the mean of the N patch tokens: rollout is (0, 1/N, ..., 1/N)^T M_L ... M_1, not the class
    token's row (which the head never reads)."""
    torch.manual_seed(2)
    model = create_model("vit2d_tiny", attention=name, global_pool="avg").double().eval()
    perturb_norms(model)
    x = torch.randn(2, 1, 32, 32, dtype=torch.float64)
    _, r = attention_rollout(model, x)
    start = torch.full((17,), 1 / 16, dtype=torch.float64)
    start[0] = 0
    torch.testing.assert_close(r, explicit_rollout(model, x, start=start), rtol=1e-9, atol=1e-12)
    assert not torch.allclose(r, explicit_rollout(model, x), atol=1e-6)  # the class token's row differs
    torch.testing.assert_close(model(x), model.head(model.forward_features(x)[:, 1:].mean(1)))


def explicit_gradient_rollouts(model, target, *inputs, **kwargs):
    """(the row-clamped rule, Chefer's entry-clamped rule) from explicit N x N float64 weights: each module's
    attention is replaced by ``A @ values`` with A written out (:func:`explicit_attention`), and autograd
    gives d logit / dA directly, independent of the factorisation and of the probe/proj gradient."""
    weights = []

    def explicit(module):
        def attend(q, k, v, mask):
            keep = torch.ones(q.shape[0], q.shape[2], dtype=torch.bool) if mask is None else mask
            A, values = explicit_attention(module, q, k, v, keep)
            A.retain_grad()
            weights.append(A)
            return A @ values
        return attend

    modules = [m for m in model.modules() if isinstance(m, Attention)]
    for module in modules:
        module.attend = explicit(module)
    try:
        model(*inputs, **kwargs)[:, target].sum().backward()
    finally:
        for module in modules:
            del module.attend
    products = [A.grad * A.detach() for A in weights]  # (B, H, N, N) each: G ⊙ A
    B, _, N, _ = products[0].shape
    r = torch.zeros(B, N, dtype=torch.float64)
    r[:, 0] = 1
    for X in reversed(products):
        r = r + torch.einsum("bn,bhnm->bhm", r, X).clamp_min(0).mean(1)
    R = torch.eye(N, dtype=torch.float64).expand(B, N, N)
    for X in products:
        R = R + X.clamp_min(0).mean(1) @ R
    return r, R[:, 0]


@pytest.mark.parametrize("name", MECHANISMS)
@pytest.mark.parametrize("depth", [1, 2])
def test_gradient_rollout_equals_its_rule_on_explicit_matrices(name, depth):
    torch.manual_seed(6)
    model = create_model("vitwsi_tiny", attention=name, num_classes=3, depth=depth).double().eval()
    perturb_norms(model)
    features = torch.randn(2, 33, 16, dtype=torch.float64) + 0.3
    mask = torch.ones(2, 33, dtype=torch.bool)
    mask[1, 25:] = False
    logits, index, r = gradient_rollout(model, features, target=2, mask=mask)
    assert all(p.grad is None for p in model.parameters()) and (index == 2).all()
    torch.testing.assert_close(logits, model(features, mask=mask).detach())  # the probes change nothing
    rule, chefer = explicit_gradient_rollouts(model, 2, features, mask=mask)
    torch.testing.assert_close(r, rule, rtol=1e-9, atol=1e-12)
    assert (r >= 0).all() and (r[:, 1:][~mask] == 0).all()
    assert (r <= chefer + 1e-12).all()  # the clamp after the sum over queries never exceeds Chefer's
    if depth == 1:  # the top block reads the class row itself: Chefer's rule exactly
        torch.testing.assert_close(r, chefer, rtol=1e-9, atol=1e-12)
    else:
        assert (r < chefer - 1e-9).any()  # the two rules do differ below the top (this check can fail)


def test_gradient_rollout_ignores_activation_checkpointing():
    """A recomputed block ran the probe hooks again, so the gradients went to fresh probes (silently wrong maps)."""
    torch.manual_seed(8)
    model = create_model("vitwsi_tiny", attention="seqnorm").eval()
    features = torch.randn(1, 40, 16)
    expected = explain(model, features, "gradrollout").relevance
    set_activation_checkpointing(model, True)
    torch.testing.assert_close(explain(model, features, "gradrollout").relevance, expected)
    assert model.encoder.activation_checkpointing  # restored


def test_gradient_rollout_on_images_follows_the_target_and_the_default():
    torch.manual_seed(7)
    model = create_model("vit2d_tiny", attention="seqnorm", num_classes=3).eval()
    x = torch.randn(2, 1, 32, 32)
    out = explain(model, x)  # auto: gradrollout for a transformer with rules
    assert out.method == "gradrollout" and (out.target == out.logits.argmax(1)).all()
    assert out.relevance.shape == (2, 32, 32) and (out.relevance >= 0).all()
    maps = [explain(model, x, "gradrollout", target=t).relevance for t in range(3)]
    assert not torch.allclose(maps[0], maps[1])  # class-specific, unlike rollout
    assert default_method(create_model("vit2d_tiny", attention="binary-ste").eval()) == "gradxinput"
    assert explain(create_model("resnet2d_tiny").eval(), x[:1]).method == "gradxinput"


def test_softmax_rollout_is_a_probability_vector_at_every_depth():
    torch.manual_seed(2)
    model = create_model("vit2d_tiny", attention="softmax").double().eval()
    _, r = attention_rollout(model, torch.randn(3, 1, 32, 32, dtype=torch.float64))
    torch.testing.assert_close(r.sum(1), torch.ones(3, dtype=torch.float64))
    assert (r >= 0).all()


@pytest.mark.parametrize("chunk_size", [1, 50, 1000])
def test_streamed_bag_rollout_equals_in_memory(chunk_size):
    torch.manual_seed(3)
    model = create_model("vitwsi_tiny", attention="seqnorm", depth=3, pos_encoding="sincos",
                         coord_scale=256.0).eval()
    perturb_norms(model)
    features, coords = torch.randn(300, 16) + 2.0, torch.randint(0, 40, (300, 2)).float() * 256
    expected = explain(model, features[None], "rollout", coords=coords[None])
    logits, scores = streaming_rollout(model, features, coords, chunk_size=chunk_size)
    torch.testing.assert_close(torch.from_numpy(scores), expected.relevance[0], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(logits, expected.logits, rtol=1e-5, atol=1e-5)


def test_streamed_rollout_refuses_mechanisms_that_cannot_stream():
    with pytest.raises((UserError, ValueError)):
        streaming_rollout(create_model("vitwsi_tiny", attention="sima").eval(), torch.randn(10, 16))


def test_gradient_x_input_is_the_gradient_times_the_input():
    torch.manual_seed(4)
    model = create_model("vit3d_tiny", attention="seqnorm", num_classes=3).double().eval()
    x = torch.randn(2, 1, 16, 16, 8, dtype=torch.float64)
    out = explain(model, x, method="gradxinput", target=2)
    assert all(p.grad is None for p in model.parameters())  # no parameter gradient is kept
    x_req = x.clone().requires_grad_(True)
    model(x_req)[:, 2].sum().backward()
    torch.testing.assert_close(out.relevance.double(), (x_req.grad * x)[:, 0], rtol=1e-5, atol=1e-6)
    assert out.relevance.shape == (2, 16, 16, 8) and (out.target == 2).all()


@pytest.mark.parametrize("preset, shape", [("vit2d_tiny", (1, 1, 32, 32)), ("vit3d_tiny", (1, 1, 16, 16, 8))])
def test_rollout_heatmap_gives_each_patch_its_token(preset, shape):
    torch.manual_seed(5)
    model = create_model(preset, attention="sima").eval()
    x = torch.randn(*shape)
    out = explain(model, x, "rollout")
    _, r = attention_rollout(model, x)
    assert out.relevance.shape == (shape[0], *shape[2:])
    grid = tuple(s // p for s, p in zip(shape[2:], model.patch_size))
    corners = out.relevance[0][tuple(slice(None, None, p) for p in model.patch_size)]
    torch.testing.assert_close(corners, r[0, 1:].float().reshape(grid))
    last = out.relevance[0][tuple(slice(p - 1, None, p) for p in model.patch_size)]
    torch.testing.assert_close(last, corners)  # constant over each patch


def test_bad_requests_are_user_errors():
    model = create_model("vit2d_tiny", attention="seqnorm").eval()
    with pytest.raises(UserError, match="unknown explanation method"):
        explain(model, torch.randn(1, 1, 32, 32), method="lrp")
    with pytest.raises(UserError, match="expected"):
        explain(model, torch.randn(1, 2, 32, 32))
    with pytest.raises(UserError, match="no rule"):
        explain(create_model("vit2d_tiny", attention="binary-ste").eval(), torch.randn(1, 1, 32, 32), "gradrollout")
    with pytest.raises(UserError, match="class token"):
        explain(create_model("resnet2d_tiny").eval(), torch.randn(1, 1, 32, 32), "rollout")
    for method in ("gradxinput", "gradrollout"):
        with pytest.raises(UserError, match="target"):
            explain(model, torch.randn(1, 1, 32, 32), method=method, target=3)


def test_a_rule_without_a_gradient_form_is_a_user_error():
    from medattn.attention.rows import ClassRows
    from medattn.attention.sima import SimAAttention

    class Custom(SimAAttention):  # a new mechanism carries its own rule: here one without a gradient form
        rollout_rule = ClassRows()

    module = Custom(8, num_heads=2)
    q = torch.randn(1, 2, 5, 4)
    with pytest.raises(UserError, match="no gradient-weighted form.*gradxinput"):
        rows_for(module).gradient_rows(module, q, q, q, None, torch.ones(1, 5), q)


@pytest.mark.parametrize("preset", ["vitwsi_tiny", "abmil_tiny", "transmil_tiny"])
def test_every_bag_model_gets_one_score_per_instance(preset):
    """The default method scores each real instance of a padded bag once (TransMIL's tokens are a squared grid,
    not its instances: it takes gradient x input, and rollout is refused in one line)."""
    torch.manual_seed(0)
    model = create_model(preset, feature_dim=8).eval()
    bags, mask = torch.randn(2, 7, 8), torch.tensor([[True] * 7, [True] * 5 + [False] * 2])
    explained = explain(model, bags, mask=mask, coords=torch.zeros(2, 7, 2))
    assert explained.relevance.shape == (2, 7) and (explained.relevance[1, 5:] == 0).all()
    if preset == "transmil_tiny":
        assert default_method(model) == "gradxinput"
        with pytest.raises(UserError, match="tokens are not its inputs"):
            explain(model, bags, method="rollout", mask=mask, coords=torch.zeros(2, 7, 2))
