"""Every launch the host code of the Triton kernels makes compiles for NVIDIA GPUs, without a GPU.

The interpreter tests (tests/attention/test_triton_kernels.py) check what the kernels compute; they do not compile
them, and the interpreter takes code that the compiler refuses (shapes, types, constexpr rules). Here each host
function (the SeqNorm operators' forward and backward, bit attention's forward and backward through each binary
mechanism's terms) runs on CPU tensors with every kernel's launch recorded instead of run; each recorded launch (its
argument types, constexprs and options, as the host code passes them) is compiled ahead of time down to a cubin for
a GPU architecture (``triton.compile`` with a ``GPUTarget``: Triton's MLIR passes, LLVM and the ``ptxas`` that the
``triton`` wheel ships; no GPU and no driver needed).

The recorded kernels take bf16 inputs as on CUDA tensors (``LOW``: bf16 tensor-core products, which the
interpreter does not run) and write nothing, so the outputs the host code goes on with are uninitialised; the
SeqNorm forward is kept off its PyTorch fallback for ill-conditioned moments (``_ill_conditioned`` made False) so that
its row map is launched too. What this does not check: that the compiled kernels run and give the interpreter's
numbers on a GPU.

Every run compiles two masked cases that between them cover both architectures, both dtypes and both ends of the
tile sizes: ``sm_90`` (H100 / H200, the issue's targets) in bf16 on the presets' head width 64, and ``sm_80`` (A100)
in float32 on the smallest tile (16); SeqNorm's kernels in both, bit attention's with each mechanism's terms in the
first and with ``binary-hamming``'s in the second; each case costs about 10-14 s of one core. The whole matrix
(widths 16, 32, 64, 128; float32 and bf16; with and without a mask; ``sm_75`` (T4) too) is ``-m slow`` (233 tests,
about 30 minutes on one core of a 2-core AMD EPYC).
"""

from __future__ import annotations

import os
import subprocess
import sys
from itertools import product
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="the Triton kernels need triton: pip install 'medattn[triton]'")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from medattn.attention import build_attention, triton_bits, triton_seqnorm, triton_support  # noqa: E402

#: Whether triton compiles here: not when its interpreter was turned on before it was imported in this process
#: (tests/attention/test_triton_kernels.py does that where it runs first); then test_in_a_fresh_process runs this file.
COMPILES_HERE = not isinstance(tl.zeros, InterpretedFunction)

KERNELS = (triton_seqnorm._token_sums_kernel, triton_seqnorm._row_map_kernel, triton_bits._pack_kernel,
           triton_bits._forward_kernel, triton_bits._query_grad_kernel, triton_bits._key_grad_kernel)
POINTER_TYPES = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.int32: "*i32"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MECHANISMS = ("binary-ste", "binary-sg", "binary-hamming", "binary-bernoulli")


@pytest.fixture(autouse=True)
def _compiles_here(request):
    if not COMPILES_HERE and request.node.name != "test_in_a_fresh_process":
        pytest.skip("triton runs its interpreter in this process: test_in_a_fresh_process runs these")


def test_in_a_fresh_process(tmp_path):
    """This file in a process of its own, with the interpreter off and a Triton cache of its own."""
    if COMPILES_HERE:
        pytest.skip("triton compiles in this process: the tests ran here")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", __file__],
                          cwd=Path(__file__).resolve().parents[2], env={**env, "TRITON_CACHE_DIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch, tmp_path_factory):
    """Compile, do not find a kernel compiled by an earlier run: a cache folder for this session."""
    if COMPILES_HERE and "TRITON_CACHE_DIR" not in os.environ:
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "triton-cache"))


def argument_type(value) -> str:
    """Triton's signature entry for a launch argument that is not a constexpr."""
    if isinstance(value, torch.Tensor):
        return POINTER_TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for {value!r}")


@pytest.fixture
def launches(monkeypatch):
    """The distinct launches made while the fixture lasts: {(kernel name, signature, constexprs, options): (kernel,
    signature, constexprs, options)}; the kernels themselves do not run."""
    recorded = {}

    def recorder(kernel):
        def run(*args, grid, warmup, **kwargs):
            signature, constexprs = {}, {}
            for index, param in enumerate(kernel.params):
                value = args[index] if index < len(args) else kwargs.pop(param.name)
                signature[param.name] = "constexpr" if param.is_constexpr else argument_type(value)
                if param.is_constexpr:
                    constexprs[(index,)] = value
            key = (kernel.fn.__name__, tuple(signature.items()), tuple(constexprs.items()), tuple(kwargs.items()))
            recorded[key] = (kernel, signature, constexprs, kwargs)
        return run

    for kernel in KERNELS:
        monkeypatch.setattr(kernel, "run", recorder(kernel))
    for module in (triton_seqnorm, triton_bits):  # bf16 tensor-core products, as for CUDA tensors
        monkeypatch.setattr(module, "low_products", lambda x: x.dtype == torch.bfloat16)
    monkeypatch.setattr(triton_seqnorm, "_ill_conditioned", lambda *args: False)
    return recorded


def launch_seqnorm(dtype: torch.dtype, width: int, masked: bool) -> None:
    """The SeqNorm operators' forward and backward by the kernels, as the operator calls them."""
    q, k, v, grad_out = (torch.randn(2, 2, 37, width).to(dtype) for _ in range(4))
    affines = [torch.ones(2 * width) for _ in range(6)]
    weights = torch.ones(2, 1, 37, 1, dtype=dtype) if masked else None
    outputs = list(triton_seqnorm.triton_seqnorm_forward(q, k, v, *affines, weights, [1e-5] * 3))
    outputs[8] = torch.tensor(False)  # the kernels' path, whatever the uninitialised moments say
    triton_seqnorm.triton_seqnorm_backward(grad_out, q, k, v, *affines, weights, [1e-5] * 3, *outputs[1:])


def launch_bits(mechanism: str, dtype: torch.dtype, width: int, masked: bool) -> None:
    """Bit attention's forward and backward on a training mechanism's terms (the Bernoulli one: two a side)."""
    attn = build_attention(mechanism, dim=2 * width, num_heads=2).train().to(dtype)
    q, k, v = (torch.randn(2, 2, 37, width, dtype=dtype, requires_grad=True) for _ in range(3))
    q_terms, k_terms = attn.binarise(q, k)
    mask = torch.ones(2, 37, dtype=torch.bool) if masked else None
    out = triton_bits.triton_binary_attention(q_terms, k_terms, v, width**-0.5, mask)
    out.backward(torch.ones_like(out))


def compile_all(recorded: dict, arch: int) -> list[str]:
    """Compile every recorded launch for ``sm_<arch>``; -> the kernels' names, one per launch."""
    assert recorded, "no kernel was launched"
    compiled = []
    for kernel, signature, constexprs, options in recorded.values():
        binary = triton.compile(ASTSource(kernel, signature, constexprs=constexprs), target=GPUTarget("cuda", arch, 32),
                                options=options)
        assert binary.asm["cubin"], kernel.fn.__name__
        compiled.append(kernel.fn.__name__)
    return compiled


SEQNORM_KERNELS = ["_row_map_kernel", "_token_sums_kernel"]
BIT_KERNELS = ["_forward_kernel", "_key_grad_kernel", "_pack_kernel", "_query_grad_kernel"]

#: (architecture, dtype, head width, masked): the whole matrix, and the cases compiled in every run.
MATRIX = list(product((90, 80, 75), DTYPES, (16, 32, 64, 128), (True, False)))
EVERY_RUN = [(90, "bf16", 64, True), (80, "fp32", 16, True)]
WHOLE = [pytest.param(*case, marks=pytest.mark.slow) for case in MATRIX if case not in EVERY_RUN]


def case_id(arch, dtype, width, masked) -> str:
    return f"sm{arch}-{dtype}-d{width}-{'masked' if masked else 'unmasked'}"


@pytest.mark.parametrize(("arch", "dtype", "width", "masked"), EVERY_RUN + WHOLE,
                         ids=[case_id(*case) for case in EVERY_RUN] + [case_id(*p.values) for p in WHOLE])
def test_seqnorm_launches_compile(launches, arch, dtype, width, masked):
    """The token sums (q alone; k with v and K^T W V; q with the output's gradient) and the row maps (the output;
    dq, dk, dv) as the operators launch them."""
    launch_seqnorm(DTYPES[dtype], width, masked)
    compiled = compile_all(launches, arch)
    assert sorted(set(compiled)) == SEQNORM_KERNELS and len(compiled) >= 4, compiled


#: Bit attention in every run: each mechanism's terms on the first case, one mechanism's on the second (the kernels'
#: source differs between mechanisms by constexpr terms, between cases by dtype, tile and architecture).
BIT_EVERY_RUN = [(m, *EVERY_RUN[0]) for m in MECHANISMS] + [("binary-hamming", *EVERY_RUN[1])]
BIT_WHOLE = [pytest.param(m, *case, marks=pytest.mark.slow)
             for case in MATRIX for m in MECHANISMS if (m, *case) not in BIT_EVERY_RUN]


def bit_case_id(mechanism, *case) -> str:
    return f"{mechanism}-{case_id(*case)}"


@pytest.mark.parametrize(("mechanism", "arch", "dtype", "width", "masked"), BIT_EVERY_RUN + BIT_WHOLE,
                         ids=[bit_case_id(*c) for c in BIT_EVERY_RUN] + [bit_case_id(*p.values) for p in BIT_WHOLE])
def test_bit_launches_compile(launches, mechanism, arch, dtype, width, masked):
    """Packing, the streamed forward and the gradient kernels with the mechanism's terms and the gradients it needs
    (binary-sg stops the gradients of q and k: no query-side kernel)."""
    launch_bits(mechanism, DTYPES[dtype], width, masked)
    expected = [name for name in BIT_KERNELS if not (mechanism == "binary-sg" and name == "_query_grad_kernel")]
    assert sorted(set(compile_all(launches, arch))) == expected


def test_recorder_sees_what_the_host_code_passes(launches):
    """The recorded launches carry the host code's dtypes, constexprs and launch options (a recorder that dropped
    them would compile other kernels than the GPU runs)."""
    launch_seqnorm(torch.bfloat16, 48, True)
    signatures = {name: (dict(signature), constexprs, options) for name, signature, constexprs, options in
                  ((key[0], *value[1:]) for key, value in launches.items())}
    signature, constexprs, options = signatures["_row_map_kernel"]
    assert signature["y_ptr"] == "*bf16" and signature["N"] == "i32" and signature["HAS_W"] == "constexpr"
    assert options == {"enable_fp_fusion": False}
    names = [param.name for param in triton_seqnorm._row_map_kernel.params]
    assert constexprs[(names.index("LOW"),)] is True  # bf16 tensor-core products, as for CUDA tensors
    assert constexprs[(names.index("BLOCK_Y"),)] == 64  # width 48 in a 64-wide tile


def test_kernels_serve_nvidia_builds_only(monkeypatch):
    """The kernels are compiled for NVIDIA targets only: a ROCm build of torch (its GPUs are "cuda" devices too)
    takes the PyTorch paths; a CUDA build takes the kernels (triton is installed here)."""
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert not triton_support.available()
    monkeypatch.setattr(torch.version, "hip", None)
    assert triton_support.available()
