"""The Triton kernels of the SeqNorm core (medattn.attention.triton_seqnorm) and of bit attention
(medattn.attention.triton_bits) against float64 references (tests/references.py), in value and gradient.

Without a GPU the kernels run on CPU tensors through Triton's interpreter. ``TRITON_INTERPRET=1`` is read when a
function is decorated, Triton's own library functions included, so it must be set before triton is first imported,
which ``import medattn.attention`` does (torch.utils.flop_counter imports it). Set here, that holds when this file
runs first in its process; where other test modules imported medattn before, :func:`test_in_a_fresh_process` runs this
file in a process of its own and the tests here skip. With a GPU the same tests run the compiled kernels on CUDA
tensors.

Tolerances (docs/performance-kernels.md, "CUDA kernels (Triton)"): relative Frobenius error of the output and of every
gradient at most 1e-5 for float32 inputs and 2^-7 (two bf16 roundings, as tests/attention/test_seqnorm_bf16.py) for
bf16 inputs, against float64 on the same inputs. Sizes are tiny: the interpreter runs every block operation in NumPy.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton", reason="the Triton kernels need triton: pip install 'medattn[triton]'")

import triton.language as tl  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from medattn.attention import build_attention, seqnorm_fused, triton_bits, triton_seqnorm, triton_support  # noqa: E402
from medattn.attention.binary.sign import sign_ste  # noqa: E402
from references import binary_attention_reference, randomize_norm_affines, seqnorm_core_reference  # noqa: E402

#: Whether the kernels can run in this process: on CUDA, or with Triton's library set up for its interpreter.
RUNS_HERE = DEVICE == "cuda" or isinstance(tl.zeros, InterpretedFunction)


@pytest.fixture(autouse=True)
def _runs_here(request):
    if not RUNS_HERE and request.node.name != "test_in_a_fresh_process":
        pytest.skip("triton was imported before its interpreter was turned on: test_in_a_fresh_process runs these")


def test_in_a_fresh_process():
    """This file in a process of its own, where the interpreter is on before triton is imported."""
    if RUNS_HERE:
        pytest.skip("the kernels run in this process: the tests ran here")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
                          cwd=Path(__file__).resolve().parents[2], env={**os.environ, "TRITON_INTERPRET": "1"},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2.0**-7}
#: How far (in spreads) the channel means of the SeqNorm inputs sit from zero. The float32 core takes raw moments
#: (no shift), whose error grows like 6e-8 (1 + mean^2 / var) (seqnorm_fused.CONDITION_LIMIT): the PyTorch core's as
#: much as the kernels' (measured 5-9e-6 for either at two spreads, 1-2e-6 at one). The bf16 core shifts every
#: channel by its mean, so its inputs sit two spreads off, where an unshifted bf16 core would fail.
OFFSET = {torch.float32: 1.0, torch.bfloat16: 2.0}


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.detach().cpu().double(), expected.detach().cpu().double()
    return ((actual - expected).norm() / expected.norm()).item()


def padding(batch: int, n: int) -> torch.Tensor:
    """A (batch, n) mask whose last sequence keeps its first third of tokens."""
    mask = torch.ones(batch, n, dtype=torch.bool)
    mask[-1, n // 3:] = False
    return mask


# --- the SeqNorm core ------------------------------------------------------------------------------------------

def seqnorm_case(dtype, d, n, masked, heads=2, batch=2, offset=None):
    """A float64 seqnorm layer with random affines; q, k, v (batch, heads, n, d) in ``dtype`` whose channels sit
    about ``offset`` (default :data:`OFFSET`) spreads off zero; the mask or None."""
    offset = OFFSET[dtype] if offset is None else offset
    attn = randomize_norm_affines(build_attention("seqnorm", dim=heads * d, num_heads=heads)).double()
    q, k, v = (torch.randn(batch, heads, n, d) + offset * torch.randn(1, heads, 1, d) for _ in range(3))
    return attn, [t.to(dtype) for t in (q, k, v)], padding(batch, n) if masked else None


def operator_arguments(attn, q, k, v, mask):
    """The operators' arguments on DEVICE: q, k, v, the six affines (float32), the weights (B, 1, N, 1) and eps."""
    params = [p.detach().float().to(DEVICE) for norm in attn.norms for p in (norm.weight, norm.bias)]
    weights = None if mask is None else mask[:, None, :, None].to(device=DEVICE, dtype=q.dtype)
    return [t.to(DEVICE) for t in (q, k, v)], params, weights, [norm.eps for norm in attn.norms]


@pytest.fixture
def no_fallback(monkeypatch):
    """The kernels must serve: the PyTorch core the Triton functions fall back to fails the test."""
    def refuse(*args):
        raise AssertionError("the PyTorch core ran instead of the kernels")

    monkeypatch.setattr(triton_seqnorm, "_core", refuse)
    monkeypatch.setattr(triton_seqnorm, "_core_backward", refuse)


@pytest.mark.parametrize(("dtype", "d", "n", "masked"), [
    (torch.float32, 16, 37, False), (torch.float32, 48, 129, True), (torch.float32, 64, 37, True),
    (torch.bfloat16, 16, 129, True), (torch.bfloat16, 48, 37, False), (torch.bfloat16, 64, 37, True),
])
def test_seqnorm_kernels_match_float64(dtype, d, n, masked, no_fallback):
    """Forward and backward of the operators by the kernels (q, k, v and all six affines) against the float64 form."""
    attn, (q, k, v), mask = seqnorm_case(dtype, d, n, masked)
    (qd, kd, vd), params, weights, eps = operator_arguments(attn, q, k, v, mask)
    outputs = triton_seqnorm.triton_seqnorm_forward(qd, kd, vd, *params, weights, eps)
    grad_out = torch.randn(outputs[0].shape).to(dtype)
    grads = triton_seqnorm.triton_seqnorm_backward(grad_out.to(DEVICE), qd, kd, vd, *params, weights, eps,
                                                   *outputs[1:])
    exact = [t.double().requires_grad_(True) for t in (q, k, v)]
    expected = seqnorm_core_reference(attn, *exact, mask)
    affines = [p for norm in attn.norms for p in (norm.weight, norm.bias)]
    expected_grads = torch.autograd.grad(expected, [*exact, *affines], grad_out.double())
    assert outputs[0].dtype == dtype and [g.dtype for g in grads] == [dtype] * 3 + [torch.float32] * 6
    errors = [relative_error(outputs[0], expected), *(relative_error(a, b) for a, b in zip(grads, expected_grads))]
    assert max(errors) < TOLERANCE[dtype], errors


def test_token_sums_add_up_over_several_programs(monkeypatch, no_fallback):
    """With one tile of tokens per program, N = 129 takes three programs per head, whose partial sums add up."""
    monkeypatch.setattr(triton_seqnorm, "TOKENS_PER_PROGRAM", triton_seqnorm.BLOCK_N)
    attn, (q, k, v), mask = seqnorm_case(torch.float32, 16, 129, True, heads=1)
    (qd, kd, vd), params, weights, eps = operator_arguments(attn, q, k, v, mask)
    outputs = triton_seqnorm.triton_seqnorm_forward(qd, kd, vd, *params, weights, eps)
    grad_out = torch.randn(outputs[0].shape)
    grads = triton_seqnorm.triton_seqnorm_backward(grad_out.to(DEVICE), qd, kd, vd, *params, weights, eps,
                                                   *outputs[1:])
    exact = [t.double().requires_grad_(True) for t in (q, k, v)]
    expected = seqnorm_core_reference(attn, *exact, mask)
    expected_grads = torch.autograd.grad(expected, exact, grad_out.double())
    assert relative_error(outputs[0], expected) < 1e-5
    assert max(relative_error(a, b) for a, b in zip(grads, expected_grads)) < 1e-5


@pytest.fixture
def kernels_registered():
    """The operators with the Triton implementations as their kernels on DEVICE: on the CPU registered for this
    test (as medattn.attention.seqnorm registers them for CUDA), on CUDA as they are."""
    if DEVICE == "cuda":
        yield
        return
    with torch.library._scoped_library("medattn", "IMPL") as library:
        triton_seqnorm.register("CPU", library)
        yield


def test_layer_runs_the_kernels_through_the_operator(kernels_registered, monkeypatch):
    """SeqNormAttention.attend -> medattn::seqnorm_core -> the kernels, and autograd -> seqnorm_core_backward -> the
    kernels: value and gradients of q, k, v and the norms' parameters against float64."""
    calls = []
    for name in ("triton_seqnorm_forward", "triton_seqnorm_backward"):
        function = getattr(triton_seqnorm, name)
        monkeypatch.setattr(triton_seqnorm, name, lambda *args, f=function, n=name: calls.append(n) or f(*args))
    attn, (q, k, v), mask = seqnorm_case(torch.float32, 16, 37, True)
    layer = copy.deepcopy(attn).float().to(DEVICE)
    leaves = [t.to(DEVICE).requires_grad_(True) for t in (q, k, v)]
    out = layer.attend(*leaves, mask.to(DEVICE))
    grad_out = torch.randn(out.shape)
    norm_params = [p for norm in layer.norms for p in (norm.weight, norm.bias)]
    grads = torch.autograd.grad(out, [*leaves, *norm_params], grad_out.to(DEVICE))
    exact = [t.double().requires_grad_(True) for t in (q, k, v)]
    expected = seqnorm_core_reference(attn, *exact, mask)
    affines = [p for norm in attn.norms for p in (norm.weight, norm.bias)]
    expected_grads = torch.autograd.grad(expected, [*exact, *affines], grad_out.double())
    assert calls == ["triton_seqnorm_forward", "triton_seqnorm_backward"]
    assert relative_error(out, expected) < 1e-5
    assert max(relative_error(a, b) for a, b in zip(grads, expected_grads)) < 1e-5


def test_pytorch_core_where_the_kernels_do_not_serve():
    """Ill-conditioned moments (a channel mean 1e3 spreads off zero), float64 and kernels_off(): the PyTorch core's
    tuple, exactly."""
    attn, (q, k, v), _ = seqnorm_case(torch.float32, 16, 37, False, heads=1, batch=1, offset=1e3)
    (qd, kd, vd), params, weights, eps = operator_arguments(attn, q, k, v, None)
    outputs = triton_seqnorm.triton_seqnorm_forward(qd, kd, vd, *params, weights, eps)
    assert outputs[8] and torch.equal(outputs[0], seqnorm_fused._core(qd, kd, vd, *params, weights, eps)[0])
    wide = [t.double() for t in (qd, kd, vd)]
    assert torch.equal(triton_seqnorm.triton_seqnorm_forward(*wide, *params, weights, eps)[0],
                       seqnorm_fused._core(*wide, *params, weights, eps)[0])
    attn, (q, k, v), _ = seqnorm_case(torch.float32, 16, 37, False, heads=1, batch=1)
    (qd, kd, vd), params, weights, eps = operator_arguments(attn, q, k, v, None)
    with triton_support.kernels_off():
        switched = triton_seqnorm.triton_seqnorm_forward(qd, kd, vd, *params, weights, eps)
    assert torch.equal(switched[0], seqnorm_fused._core(qd, kd, vd, *params, weights, eps)[0])


def test_pytorch_core_for_tensors_past_int32_offsets(monkeypatch):
    """Tensors spanning more than MAX_ELEMENTS elements (int32 offsets in the kernels) take the PyTorch core. Made
    small here: q is a view into a wider tensor (as q of a fused qkv projection), whose element count fits the limit
    and whose span (first to last element in storage) does not."""
    attn, (q, k, v), _ = seqnorm_case(torch.float32, 16, 37, False, heads=1, batch=1)
    q = torch.cat([q, torch.randn_like(q)], dim=-1)[..., :16]
    (qd, kd, vd), params, weights, eps = operator_arguments(attn, q, k, v, None)
    assert triton_support.span(qd) == 2 * qd.numel() - 16
    monkeypatch.setattr(triton_support, "MAX_ELEMENTS", qd.numel())
    monkeypatch.setattr(triton_seqnorm, "token_sums", lambda *args, **kwargs: pytest.fail("the kernels ran"))
    outputs = triton_seqnorm.triton_seqnorm_forward(qd, kd, vd, *params, weights, eps)
    assert torch.equal(outputs[0], seqnorm_fused._core(qd, kd, vd, *params, weights, eps)[0])


# --- bit attention ---------------------------------------------------------------------------------------------

def inputs(batch, heads, n, d, dtype=torch.float32):
    """q, k (batch, heads, n, d) and v (batch, heads, n, 16) on DEVICE, needing gradients."""
    return [torch.randn(batch, heads, n, width).to(device=DEVICE, dtype=dtype).requires_grad_(True)
            for width in (d, d, 16)]


def gradients(out, wanted, grad_out):
    """d out / d wanted (None where out does not depend on one)."""
    return torch.autograd.grad(out, wanted, grad_out, retain_graph=True, allow_unused=True)


@pytest.mark.parametrize(("mechanism", "d", "n", "batch", "masked"), [
    ("binary-ste", 48, 37, 2, True), ("binary-sg", 16, 37, 2, False), ("binary-hamming", 64, 37, 2, True),
    ("binary-bernoulli", 16, 37, 2, True), ("binary-hamming", 16, 129, 1, True),
])
def test_bit_attention_matches_float64(mechanism, d, n, batch, masked):
    """Each mechanism's terms (the Bernoulli one in training: two sampled terms a side) through the kernels and
    through the float64 form: output and gradients of q, k, v and the mechanism's parameters (its surrogate rule by
    autograd), float32. N = 129 spans three query and key tiles."""
    attn = build_attention(mechanism, dim=2 * d, num_heads=2).to(DEVICE).train()
    q, k, v = inputs(batch, 2, n, d)
    mask = padding(batch, n).to(DEVICE) if masked else None
    q_terms, k_terms = attn.binarise(q, k)
    out = triton_bits.triton_binary_attention(q_terms, k_terms, v, d**-0.5, mask)
    expected = binary_attention_reference(q_terms, k_terms, v, d**-0.5, mask)
    grad_out = torch.randn_like(out)
    wanted = [q, k, v, *(p for name, p in attn.named_parameters() if name.startswith(("q_weight.", "k_weight.")))]
    got, reference = gradients(out, wanted, grad_out), gradients(expected, wanted, grad_out.double())
    assert [g is None for g in got] == [g is None for g in reference]
    errors = [relative_error(out, expected), *(relative_error(a, b) for a, b in zip(got, reference) if b is not None)]
    assert max(errors) < 1e-5, errors


def test_bit_attention_bf16_within_bf16_tolerance():
    """bf16 signs (straight-through), weights and values: output and gradients of q, k, v and the weights within
    2^-7 of float64 on the same bf16 inputs."""
    q, k, v = inputs(2, 2, 37, 32, torch.bfloat16)
    wq, wk = ((0.5 + torch.rand(2, 2, 37)).to(device=DEVICE, dtype=torch.bfloat16).requires_grad_(True)
              for _ in range(2))
    terms = [(sign_ste(q), wq)], [(sign_ste(k), wk)]
    mask = padding(2, 37).to(DEVICE)
    out = triton_bits.triton_binary_attention(*terms, v, 32**-0.5, mask)
    expected = binary_attention_reference(*terms, v, 32**-0.5, mask)
    grad_out = torch.randn_like(out)
    got, reference = gradients(out, [q, k, v, wq, wk], grad_out), gradients(expected, [q, k, v, wq, wk],
                                                                             grad_out.double())
    assert out.dtype == torch.bfloat16 and all(g.dtype == torch.bfloat16 for g in got)
    errors = [relative_error(out, expected), *(relative_error(a, b) for a, b in zip(got, reference))]
    assert max(errors) < 2.0**-7, errors


def test_binary_layer_takes_the_kernels_where_they_run(monkeypatch):
    """BinaryAttention.attend hands its terms to the kernels where they run (here: made to run on DEVICE): the layer's
    output and gradients equal those of its float emulation."""
    attn = build_attention("binary-hamming", dim=32, num_heads=2).to(DEVICE)
    x = torch.randn(2, 37, 32, device=DEVICE, requires_grad=True)
    mask = padding(2, 37).to(DEVICE)
    grad_out = torch.randn(2, 37, 32, device=DEVICE)
    results = []
    for runs in (False, True):
        monkeypatch.setattr(triton_support, "runs_kernels", lambda *tensors, runs=runs: runs)
        out = attn(x, mask)
        results.append((out, gradients(out, [x, *attn.parameters()], grad_out)))
    (emulated, emulated_grads), (kernels, kernel_grads) = results
    assert relative_error(kernels, emulated) < 1e-5
    assert max(relative_error(a, b) for a, b in zip(kernel_grads, emulated_grads)) < 1e-5


def test_bit_attention_refuses_stacks_past_int32_offsets():
    """Two terms of 2^30 elements stack to 2^31 (past int32 offsets): a clear error before anything is allocated
    (meta tensors hold no memory)."""
    signs = torch.empty(1, 1, 2**24, 64, device="meta")
    v = torch.empty(1, 1, 2**24, 16, device="meta")
    with pytest.raises(ValueError, match="2\\^31 - 1 elements"):
        triton_bits.triton_binary_attention([(signs, None), (signs, None)], [(signs, None)], v, 0.125)
