"""The attention contract, generated from the registry: every mechanism x path x mask pattern.

A new mechanism registered in :mod:`medattn.attention` is covered here without writing a test:

* masks: each real row equals the mechanism run on its sequence alone (computed by an independent slow
  form where one exists), padded rows are exactly zero, padded inputs get exactly zero gradient, and
  nothing is NaN, for every mask pattern (none, right padding, left padding longer than a kernel tile
  or block, holes, a single real token) and every path (with and without gradient, bit kernel and float
  emulation, raw moments and centred statistics);
* second derivatives are right (float64 ``gradgradcheck``) or refused with an error;
* every mechanism works inside MONAI's transformer block, called the way MONAI calls it;
* every mechanism compiles with ``fullgraph=True`` (no graph break) and exports with ``torch.export``
  and to ONNX with a dynamic token count (ONNX checked against onnxruntime, the ``onnx`` extra).
"""

from __future__ import annotations

import pytest
import torch

from medattn.attention import available_attentions, build_attention, get_attention_class, seqnorm_fused
from medattn.attention.binary.core import BinaryAttention
from medattn.attention.seqnorm import SeqNormAttention
from references import REFERENCES, randomize_norm_affines

ALL = available_attentions()
N, DIM, HEADS = 40, 16, 2
TILE = 16  # the kernel tile / statistics block the patterns below cross

MASK_PATTERNS = ["none", "right", "left_beyond_tile", "holes", "single_token"]


def make_mask(pattern: str) -> torch.Tensor | None:
    """(2, N) bool: row 0 is always full, row 1 carries the pattern."""
    if pattern == "none":
        return None
    mask = torch.ones(2, N, dtype=torch.bool)
    if pattern == "right":
        mask[1, 25:] = False
    elif pattern == "left_beyond_tile":
        mask[1, :TILE + 5] = False
    elif pattern == "holes":
        mask[1, ::3] = False
        mask[1, 17:29] = False
    elif pattern == "single_token":
        mask[1] = False
        mask[1, 23] = True
    return mask


def variants(name: str) -> list[str]:
    """The computational paths a mechanism has besides grad / no grad."""
    cls = get_attention_class(name)
    if issubclass(cls, BinaryAttention):
        return ["bit_kernel", "emulation"]
    if issubclass(cls, SeqNormAttention):
        return ["routed", "centred"]
    return ["default"]


CASES = [(name, variant, grad, pattern) for name in ALL for variant in variants(name)
         for grad in (False, True) for pattern in MASK_PATTERNS]


def make(name: str, variant: str = "default", dtype=torch.float32, dim: int = DIM, **kwargs):
    """The mechanism in eval mode (deterministic) with non-trivial affine parameters, on ``variant``'s path."""
    if variant in ("bit_kernel", "emulation"):
        kwargs.update(tile_size=TILE, bit_kernel=variant == "bit_kernel")
    torch.manual_seed(0)
    return randomize_norm_affines(build_attention(name, dim=dim, num_heads=HEADS, **kwargs).to(dtype).eval())


@pytest.fixture
def on_path(monkeypatch):
    """Select seqnorm's statistics (over blocks of TILE tokens): ``routed`` is the default choice (raw
    moments unless ill-conditioned, e.g. a single real token), ``raw_moments`` and ``centred`` force one."""

    def select(variant: str) -> None:
        monkeypatch.setattr(seqnorm_fused, "SQUARE_BLOCK", TILE)
        if variant == "raw_moments":
            monkeypatch.setattr(seqnorm_fused, "CONDITION_LIMIT", float("inf"))
        elif variant == "centred":
            monkeypatch.setattr(seqnorm_fused, "CONDITION_LIMIT", -1.0)

    return select


def alone(name: str, attn, x: torch.Tensor) -> torch.Tensor:
    """The mechanism on one unpadded sequence x (1, n, dim) by its independent slow form, without gradient."""
    with torch.no_grad():
        if name in REFERENCES:
            return REFERENCES[name](attn, x)
        bit_kernel, attn.bit_kernel = attn.bit_kernel, False  # the float emulation
        try:
            return attn(x)
        finally:
            attn.bit_kernel = bit_kernel


@pytest.mark.parametrize("name, variant, grad, pattern", CASES)
def test_each_row_equals_its_sequence_alone(name, variant, grad, pattern, on_path):
    on_path(variant)
    attn = make(name, variant)
    x = torch.randn(2, N, DIM)
    mask = make_mask(pattern)
    if mask is not None:
        x = torch.where(mask[..., None], x, 1e3 * torch.randn_like(x))  # garbage in padding must not leak
    x.requires_grad_(grad)
    with torch.set_grad_enabled(grad):
        out = attn(x, mask)
    assert torch.isfinite(out).all()
    for b in range(2):
        real = slice(None) if mask is None else mask[b]
        expected = alone(name, attn, x[b:b + 1, real].detach())
        torch.testing.assert_close(out[b:b + 1, real].detach(), expected, rtol=2e-5, atol=2e-5)
        if mask is not None:
            assert torch.all(out[b, ~mask[b]] == 0)
    if grad:
        (out * torch.randn_like(out)).sum().backward()
        assert torch.isfinite(x.grad).all()
        if mask is not None:
            assert torch.all(x.grad[~mask] == 0), "padded tokens must not influence any output"
        assert all(torch.isfinite(p.grad).all() for p in attn.parameters() if p.grad is not None)


def test_bit_kernel_with_left_padding_longer_than_the_default_tile():
    """N = 2,100 with 1,100 left-padded tokens at the default tile of 1,024: no NaN, equal to the emulation."""
    attn = build_attention("binary-hamming", dim=DIM, num_heads=1).eval()
    x = torch.randn(1, 2100, DIM)
    mask = torch.ones(1, 2100, dtype=torch.bool)
    mask[:, :1100] = False
    with torch.no_grad():
        out = attn(x, mask)
    assert attn.tile_size == 1024 and torch.isfinite(out).all()
    torch.testing.assert_close(out[:, 1100:], alone("binary-hamming", attn, x[:, 1100:]), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("name", ALL)
def test_value_width_option(name):
    """Every mechanism takes ``value_dim`` through the one base-class forward; masks still hold."""
    attn = make(name, value_dim=3)
    assert attn.qkv.out_features == 2 * DIM + HEADS * 3 and attn.proj.in_features == HEADS * 3
    x = torch.randn(2, 9, DIM)
    mask = torch.tensor([[True] * 9, [False] * 4 + [True] * 5])
    with torch.no_grad():
        out = attn(x, mask)
        torch.testing.assert_close(out[1:, 4:], attn(x[1:, 4:]), rtol=2e-5, atol=2e-5)
    assert out.shape == x.shape and torch.all(out[1, :4] == 0)


@pytest.mark.parametrize("name", ALL)
def test_attn_mask_keyword_means_mask(name):
    """timm and MONAI blocks pass ``attn_mask=``: the same key-padding mask for every mechanism."""
    attn = make(name)
    x = torch.randn(2, 9, DIM)
    mask = torch.tensor([[True] * 9, [True] * 6 + [False] * 3])
    with torch.no_grad():
        torch.testing.assert_close(attn(x, attn_mask=mask), attn(x, mask))
    with pytest.raises(ValueError, match="either"):
        attn(x, mask, attn_mask=mask)


@pytest.mark.parametrize("name", ALL)
def test_second_derivatives_are_right_or_refused(name, on_path):
    """float64 gradgradcheck (numerical derivative of the analytic gradient) on inputs and parameters."""
    on_path("raw_moments")
    if get_attention_class(name).surrogate_gradient:
        pytest.skip("a surrogate (straight-through) gradient is not the derivative of the forward")
    attn = make(name, dtype=torch.float64, dim=8)
    x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True] * 5, [False, True, True, True, False]])
    params = [p for p in attn.parameters() if p.requires_grad]
    names = [n for n, p in attn.named_parameters() if p.requires_grad]

    def run(x, *values):
        return torch.func.functional_call(attn, dict(zip(names, values)), (x, mask))

    try:
        assert torch.autograd.gradgradcheck(run, (x, *params), eps=1e-6, atol=1e-5)
    except RuntimeError as error:  # refused: must say so, never return a wrong number
        assert "differentiab" in str(error) or "not implemented" in str(error), error


def test_seqnorm_hessian_vector_product_equals_explicit_form(on_path):
    """The fused backward's own derivative equals the explicit form's (was off by 100%)."""
    on_path("raw_moments")
    attn = make("seqnorm", dtype=torch.float64)
    x = torch.randn(2, 7, DIM, dtype=torch.float64, requires_grad=True)
    v = torch.randn_like(x)

    def hvp(forward):
        (g,) = torch.autograd.grad(forward(x).square().sum(), x, create_graph=True)
        return torch.autograd.grad((g * v).sum(), x)[0]

    fused = hvp(attn)
    explicit = hvp(lambda t: REFERENCES["seqnorm"](attn, t))
    torch.testing.assert_close(fused, explicit, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("name", ALL)
def test_every_mechanism_inside_monai_transformer_block(name):
    """MONAI's TransformerBlock calls ``self.attn(self.norm1(x), attn_mask=attn_mask)``."""
    blocks = pytest.importorskip("monai.networks.blocks")
    block = blocks.TransformerBlock(hidden_size=DIM, mlp_dim=32, num_heads=HEADS).eval()
    block.attn = make(name)
    x = torch.randn(2, 12, DIM)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 8:] = False
    with torch.no_grad():
        out = block(x, attn_mask=mask)
        h = x + block.attn(block.norm1(x), mask)
        torch.testing.assert_close(out, h + block.mlp(block.norm2(h)))
        torch.testing.assert_close(block(x), block(x, attn_mask=None))


def test_softmax_equals_monai_self_attention_with_the_same_weights():
    """An independent implementation: MONAI's SABlock with our qkv/proj weights and key-padding mask."""
    blocks = pytest.importorskip("monai.networks.blocks")
    ours = make("softmax")
    theirs = blocks.SABlock(hidden_size=DIM, num_heads=HEADS, qkv_bias=True).eval()
    with torch.no_grad():
        theirs.qkv.weight.copy_(ours.qkv.weight)
        theirs.qkv.bias.copy_(ours.qkv.bias)
        theirs.out_proj.weight.copy_(ours.proj.weight)
        theirs.out_proj.bias.copy_(ours.proj.bias)
        x = torch.randn(2, 12, DIM)
        mask = torch.ones(2, 12, dtype=torch.bool)
        mask[1, :5] = False
        torch.testing.assert_close(ours(x, attn_mask=mask)[mask], theirs(x, attn_mask=mask)[mask])


def test_bit_kernel_only_on_cpu_tensors(monkeypatch):
    """Under no_grad the bit kernel runs for CPU tensors; on other devices the emulation (no host round trip)."""
    from medattn.attention.binary import core

    calls = []
    monkeypatch.setattr(core, "binary_attention", lambda *a, **k: calls.append("kernel") or a[2])
    attn = make("binary-sg")
    q = k = v = torch.randn(1, HEADS, 4, DIM // HEADS)
    with torch.no_grad():
        attn.attend(q, k, v, None)
        assert calls == ["kernel"]
        meta = [t.to("meta") for t in (q, k, v)]
        out = attn.attend(*meta, None)  # the emulation runs on any device; meta stands in for CUDA here
    assert calls == ["kernel"] and out.device.type == "meta"


def test_seqnorm_uses_each_norms_own_eps():
    """k_norm.eps and v_norm.eps were ignored (only q_norm.eps reached the fused core)."""
    attn = make("seqnorm", dtype=torch.float64)
    x = torch.randn(1, 6, DIM, dtype=torch.float64)
    base = attn(x)
    for norm in (attn.k_norm, attn.v_norm):
        norm.eps = 10.0
        with torch.no_grad():
            changed = attn(x)
            torch.testing.assert_close(changed, REFERENCES["seqnorm"](attn, x))
        assert not torch.allclose(changed, base)
        norm.eps = 1e-5


@pytest.mark.parametrize("name", ALL)
def test_compiles_without_graph_breaks(name):
    """``torch.compile(fullgraph=True)`` captures forward and backward whole (the bit kernel and the fused
    SeqNorm's data-dependent choice give way to their PyTorch forms while compiling)."""
    torch._dynamo.reset()  # a fresh cache: recompilation limits are shared across modules of one class
    attn = make(name)
    compiled = torch.compile(attn, fullgraph=True, backend="eager")  # capture only: graph breaks raise
    x = torch.randn(2, 12, DIM, requires_grad=True)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 9:] = False
    out = compiled(x, mask)
    out.sum().backward()
    with torch.no_grad():
        torch.testing.assert_close(out, attn(x, mask), rtol=2e-5, atol=2e-5)
        torch.testing.assert_close(compiled(x, mask), out, rtol=2e-5, atol=2e-5)
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("name", ALL)
def test_torch_export_with_a_dynamic_token_count(name):
    attn = make(name)
    x = torch.randn(2, 12, DIM)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, :5] = False
    tokens = torch.export.Dim("tokens", min=2, max=4096)
    program = torch.export.export(attn, (x, mask), dynamic_shapes=({1: tokens}, {1: tokens}))
    with torch.no_grad():
        for n in (12, 30):
            x, mask = torch.randn(2, n, DIM), torch.arange(n) < torch.tensor([[n], [n - 3]])
            torch.testing.assert_close(program.module()(x, mask), attn(x, mask), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("name", ALL)
def test_onnx_export_matches_onnxruntime(name, tmp_path):
    """ONNX (opset 18, dynamo exporter) with a dynamic token count, checked against onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    attn = make(name)
    x = torch.randn(2, 12, DIM)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, :5] = False
    tokens = torch.export.Dim("tokens", min=2, max=4096)
    program = torch.onnx.export(attn, (x, mask), dynamo=True, opset_version=18,
                                dynamic_shapes=({1: tokens}, {1: tokens}))
    program.save(str(tmp_path / "attention.onnx"))
    session = ort.InferenceSession(str(tmp_path / "attention.onnx"))
    names = [i.name for i in session.get_inputs()]
    x, mask = torch.randn(2, 30, DIM), torch.arange(30) < torch.tensor([[30], [17]])
    (actual,) = session.run(None, dict(zip(names, (x.numpy(), mask.numpy()))))
    with torch.no_grad():
        expected = attn(x, mask)
    torch.testing.assert_close(torch.from_numpy(actual), expected, rtol=1e-4, atol=1e-5)
