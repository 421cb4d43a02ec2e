"""SeqNorm's fused core as registered operators (medattn::seqnorm_core and its backward): checked by PyTorch's own
operator test, equal to the explicit form in value, gradient (gradcheck, float64) and second derivative on both
paths, kept whole by torch.compile(fullgraph=True) forward and backward, and left out of exported programs."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from medattn.attention import build_attention, seqnorm_fused
from medattn.attention.seqnorm_fused import seqnorm_core
from medattn.attention.seqnorm_maths import affine_views, centred_seqnorm

PATHS = {"raw_moments": float("inf"), "centred": -1.0}


def inputs(masked: bool, dtype=torch.float64, b=2, h=2, n=24, d=4, dv=3):
    """q, k, v, the six affines (non-trivial), weights and eps, all leaves that want gradients."""
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(b, h, n, d, dtype=dtype, generator=gen) + 0.5 for _ in range(2))
    v = torch.randn(b, h, n, dv, dtype=dtype, generator=gen) - 0.3
    params = [1 + 0.3 * torch.randn(h * size, dtype=dtype, generator=gen) if i % 2 == 0 else
              0.3 * torch.randn(h * size, dtype=dtype, generator=gen) for i, size in enumerate((d, d, d, d, dv, dv))]
    weights = None
    if masked:
        weights = torch.ones(b, 1, n, 1, dtype=dtype)
        weights[1, :, n // 2:] = 0
    leaves = [t.requires_grad_(True) for t in (q, k, v, *params)]
    return leaves, weights, (1e-5, 2e-5, 1e-5)


def explicit(q, k, v, *params, weights, eps):
    count = q.shape[2] if weights is None else weights.sum(dim=2, keepdim=True)
    return centred_seqnorm(q, k, v, affine_views(params, q), weights, count, eps)


@pytest.fixture(params=sorted(PATHS))
def path(request, monkeypatch):
    monkeypatch.setattr(seqnorm_fused, "CONDITION_LIMIT", PATHS[request.param])
    return request.param


@pytest.mark.parametrize("masked", [False, True])
def test_pytorch_operator_checks_pass(masked, path):
    """Schema, fake (meta) shapes, autograd registration and dispatch, by torch.library.opcheck."""
    leaves, weights, eps = inputs(masked, torch.float32)
    torch.library.opcheck(torch.ops.medattn.seqnorm_core.default, (*leaves, weights, list(eps)))


@pytest.mark.parametrize("masked", [False, True])
def test_equals_the_explicit_form_value_gradient_and_second_derivative(masked, path):
    leaves, weights, eps = inputs(masked)

    def fused(*tensors):
        return seqnorm_core(*tensors[:3], tensors[3:], weights, eps)

    torch.testing.assert_close(fused(*leaves), explicit(*leaves, weights=weights, eps=eps), rtol=1e-10, atol=1e-10)
    assert torch.autograd.gradcheck(fused, leaves, eps=1e-6, atol=1e-6)
    if masked and path == "raw_moments":  # a differentiable backward is the explicit form's on every path: once,
        small, small_weights, _ = inputs(masked, h=1, n=10)  # on a fifth of the inputs (it took 20 s at full size)

        def fused_small(*tensors):
            return seqnorm_core(*tensors[:3], tensors[3:], small_weights, eps)

        assert torch.autograd.gradgradcheck(fused_small, small, eps=1e-6, atol=1e-5)


def recording_backend(graphs: dict):
    """A compile backend that keeps the forward and backward graphs AOTAutograd hands on and runs them as they are."""
    def keep(kind):
        def compiler(graph, example_inputs):
            graphs[kind] = {str(node.target) for node in graph.graph.nodes}
            return make_boxed_func(graph.forward)
        return compiler

    return aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"))


def test_compile_fullgraph_keeps_the_fused_operator_forward_and_backward():
    torch._dynamo.reset()
    torch.manual_seed(0)
    attn = build_attention("seqnorm", dim=16, num_heads=2)
    x = torch.randn(2, 40, 16, requires_grad=True)
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1, 30:] = False
    graphs: dict[str, set] = {}
    compiled = torch.compile(attn, fullgraph=True, backend=recording_backend(graphs))
    out = compiled(x, mask)
    (grad_compiled,) = torch.autograd.grad(out.square().sum(), x)
    assert "medattn.seqnorm_core.default" in graphs["forward"]
    assert "medattn.seqnorm_core_backward.default" in graphs["backward"]
    assert not any("rsqrt" in target for target in graphs["forward"])  # the explicit form was not traced
    eager = attn(x, mask)
    (grad_eager,) = torch.autograd.grad(eager.square().sum(), x)
    torch.testing.assert_close(out, eager)
    torch.testing.assert_close(grad_compiled, grad_eager)


def test_exported_programs_hold_no_medattn_operator():
    """torch.export takes the explicit form, so the program runs where medattn is not installed (ONNX likewise:
    tests/attention/test_contract_attention.py runs it in onnxruntime)."""
    attn = build_attention("seqnorm", dim=16, num_heads=2).eval()
    x = torch.randn(1, 20, 16)
    program = torch.export.export(attn, (x,))
    assert not any("medattn" in str(node.target) for node in program.graph.nodes)
    torch.testing.assert_close(program.module()(x), attn(x))


def test_a_first_call_loads_no_compiler():
    """torch.library.custom_op's wrappers import torch._dynamo on an operator's first call (2 s and 80 MiB in every
    process that predicts one image); the operators are defined without them."""
    import subprocess
    import sys

    code = ("import sys, torch; from medattn.attention import build_attention; "
            "a = build_attention('seqnorm', dim=16, num_heads=2); a(torch.randn(1, 8, 16, requires_grad=True)).sum()"
            ".backward(); assert 'torch._dynamo' not in sys.modules, 'torch._dynamo was imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_flop_counter_sees_the_operators_work():
    """FlopCounterMode does not look inside an operator: each carries its own formula (4 and 8 B H N d D_v)."""
    from torch.utils.flop_counter import FlopCounterMode

    leaves, weights, eps = inputs(False, torch.float32, b=2, h=2, n=24, d=4, dv=3)
    with FlopCounterMode(display=False) as counter:
        seqnorm_core(*leaves[:3], leaves[3:], weights, eps).sum().backward()
    counts = {str(op): flops for op, flops in counter.get_flop_counts()["Global"].items()}
    assert counts["medattn.seqnorm_core"] == 4 * 2 * 2 * 24 * 4 * 3
    assert counts["medattn.seqnorm_core_backward"] == 8 * 2 * 2 * 24 * 4 * 3
