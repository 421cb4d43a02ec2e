"""The CUDA paths against the CPU (issue 38's `-m cuda` selection): run where a GPU exists, skipped elsewhere.

On a GPU machine (``pytest -m cuda``, or ``benchmarks/gpu_session.sh``): every registered mechanism on CUDA equals
float64 on the CPU, in value and input gradients, with a padding mask, with the Triton kernels where they run and
with them switched off; the 2D, 3D and bag presets give the CPU's outputs; a run trained on CUDA (fp32 and bf16)
predicts on the CPU what it predicts on the GPU. TF32 is switched off for these comparisons (float32 products, as
on the CPU); tolerances: 1e-4 relative for float32 mechanisms, 1e-3 for whole models (many layers, other summation
orders). tests/attention/test_triton_kernels.py holds the kernels' own tests, which run compiled on CUDA there.
"""

from __future__ import annotations

import copy
import csv
from contextlib import nullcontext

import pytest
import torch

from engine_data import square_image_table
from medattn.attention import available_attentions, build_attention, triton_support
from medattn.cli import main
from medattn.models import create_model
from references import randomize_norm_affines

pytestmark = pytest.mark.cuda

TRAIN = ["train.epochs=1", "train.batch_size=4", "train.threads=1", "eval.bootstrap=0", "--no-progress"]


@pytest.fixture(autouse=True)
def _no_tf32():
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.detach().cpu().double(), expected.detach().cpu().double()
    return ((actual - expected).norm() / expected.norm()).item()


@pytest.mark.parametrize("kernels", ["triton", "torch"])
@pytest.mark.parametrize("name", available_attentions())
def test_mechanism_on_cuda_equals_float64_on_the_cpu(name, kernels):
    """One layer (dim 64, 4 heads, N = 150: several kernel tiles), the second sequence padded after 100 tokens, in
    eval mode (the Bernoulli mechanism's mode, no dropout): output and gradients of the input and parameters."""
    torch.manual_seed(0)
    attn = randomize_norm_affines(build_attention(name, dim=64, num_heads=4)).eval()
    x = torch.randn(2, 150, 64)
    mask = torch.ones(2, 150, dtype=torch.bool)
    mask[1, 100:] = False
    grad_out = torch.randn(2, 150, 64)
    results = []
    for device, dtype in (("cpu", torch.float64), ("cuda", torch.float32)):
        layer = copy.deepcopy(attn).to(device=device, dtype=dtype)
        leaf = x.to(device=device, dtype=dtype).requires_grad_(True)
        with triton_support.kernels_off() if kernels == "torch" else nullcontext():
            out = layer(leaf, mask.to(device))
            grads = torch.autograd.grad(out, [leaf, *layer.parameters()], grad_out.to(device=device, dtype=dtype),
                                        allow_unused=True)
        results.append((out, grads))
    (expected, expected_grads), (out, grads) = results
    assert relative_error(out, expected) < 1e-4
    assert relative_error(grads[0], expected_grads[0]) < 1e-4
    # the parameters' gradients as one vector: some are zero by the mechanism's equations (float rounding apart)
    pairs = [(g.flatten(), e.flatten()) for g, e in zip(grads[1:], expected_grads[1:]) if e is not None]
    if pairs:
        assert relative_error(torch.cat([g.cpu() for g, _ in pairs]), torch.cat([e for _, e in pairs])) < 1e-4


def preset_inputs(name: str, model: torch.nn.Module) -> tuple:
    if name == "vitwsi_tiny":  # two bags, the second padded
        return torch.randn(2, 50, model.feature_dim), torch.arange(50).expand(2, 50) < torch.tensor([[50], [30]])
    return (torch.randn(2, model.in_chans, *model.img_size),)


@pytest.mark.parametrize("name", ["vit2d_tiny", "vit3d_tiny", "vitwsi_tiny"])
def test_presets_on_cuda_give_the_cpus_outputs(name):
    torch.manual_seed(0)
    model = create_model(name).eval()
    inputs = preset_inputs(name, model)
    with torch.no_grad():
        expected = model(*inputs)
        out = model.cuda()(*(x.cuda() for x in inputs))
    assert relative_error(out, expected) < 1e-3


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_trained_on_cuda_predicts_the_same_on_the_cpu(tmp_path, precision):
    """A run trained on the GPU (train.device=cuda) predicts on the CPU what it predicts on the GPU."""
    square_image_table(tmp_path, "{name: vit2d_tiny, kwargs: {img_size: 16}}")
    assert main(["train", str(tmp_path / "c.yaml"), "train.device=cuda", f"train.precision={precision}", *TRAIN,
                 "--out", str(tmp_path / "run")]) == 0
    files = [str(tmp_path / f"{i}.png") for i in range(6)]
    predictions = {}
    for device in ("cuda", "cpu"):
        out = tmp_path / f"{device}.csv"
        assert main(["predict", str(tmp_path / "run"), *files, "--device", device, "--out", str(out)]) == 0
        predictions[device] = torch.tensor([[float(v) for k, v in row.items() if k.startswith("prob_")]
                                            for row in csv.DictReader(open(out))])
    tolerance = 1e-3 if precision == "fp32" else 2.0**-6
    assert torch.allclose(predictions["cuda"], predictions["cpu"], atol=tolerance)
