"""Contract of every model preset, generated from the registries: every part acts.

For every preset of :func:`medattn.models.available_models` (at a small input; the Table-1 presets with
their widths shrunk), and for every attention-taking preset with every mechanism of
:func:`medattn.attention.available_attentions`, one forward and backward pass in float64 must

(a) run every module that holds parameters of its own (a forward hook on each must fire; the entries
    of ``READ_WITHOUT_CALL``, whose parameters a fused kernel reads, must not fire and are covered
    by (b)), and
(b) give every parameter a finite gradient that is not zero, except the entries of
    ``FROZEN_ON_PURPOSE`` (parameters that get no gradient by the mechanism's own equations), which
    must then really get none (so the list cannot go stale).

The q, k and v rows of a fused ``qkv`` projection are three projections and are checked separately.
"Zero" means below ``ZERO`` times the largest gradient entry of the model (float64 rounding noise is
~1e-16 of it; the smallest real gradients seen are ~1e-5 of it). A new preset or mechanism is covered
without a new test; a new model class needs one input builder in ``INPUTS``.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from medattn.attention import Attention, available_attentions
from medattn.models import available_models, create_model, takes_attention
from medattn.models.mil import AttentionMIL
from medattn.models.pixel import PixelTransformer
from medattn.models.presets import PRESETS
from medattn.models.resnet import ResNet
from medattn.models.segmentation import DilatedFCN3D, UNet3D
from medattn.models.segmentation.vit_seg import SegmentationViT
from medattn.models.swin import SwinClassifier
from medattn.models.transmil import TransMIL
from medattn.models.vit import VisionTransformer
from medattn.models.wsi import WSITransformer

ZERO = 1e-9

# (mechanism, parameter-name suffix) -> why this parameter gets no gradient. ``[q]``/``[k]``/``[v]`` name
# the rows of a fused qkv projection. A model built without ``attention=`` uses its default mechanism.
FROZEN_ON_PURPOSE = {
    # softmax_j(q . (k_j + b)) = softmax_j(q . k_j): a shift shared by every key cancels (timm keeps the bias).
    ("softmax", ".attn.qkv.bias[k]"): "softmax is invariant to a key shift shared by all keys",
    ("binary-sg", ".attn.qkv.weight[q]"): "BinaryFormer's stop-gradient baseline: sign(q), sign(k) pass no "
                                           "gradient, so attention trains only the values",
    ("binary-sg", ".attn.qkv.weight[k]"): "as above",
    ("binary-sg", ".attn.qkv.bias[q]"): "as above",
    ("binary-sg", ".attn.qkv.bias[k]"): "as above",
    # SeqNorm (Khader et al., eqs. 2-7) normalises Q, K, V per channel over the tokens: a shift shared by
    # all tokens cancels, i.e. the qkv bias and the bias of the LayerNorm that feeds only the qkv.
    ("seqnorm", ".attn.qkv.bias[q]"): "sequence normalisation removes per-channel shifts",
    ("seqnorm", ".attn.qkv.bias[k]"): "sequence normalisation removes per-channel shifts",
    ("seqnorm", ".attn.qkv.bias[v]"): "sequence normalisation removes per-channel shifts",
    ("seqnorm", ".norm1.bias"): "feeds only the qkv, whose shifts sequence normalisation removes",
    # K'^T V' = sum_j (g_k K^_j + b_k)(g_v V^_j + b_v)^T = g_k g_v sum_j K^_j V^_j^T + N b_k b_v^T because
    # the normalised K^, V^ sum to zero over the tokens: the gradient of b_k is proportional to b_v and
    # vice versa, both zero at their zero init, a saddle plain gradient descent never leaves.
    ("seqnorm", ".attn.k_norm.bias"): "gradient proportional to v_norm.bias, zero at init",
    ("seqnorm", ".attn.v_norm.bias"): "gradient proportional to k_norm.bias, zero at init",
}

# (mechanism, module-name suffix) -> why this module holds parameters that are read without calling it.
READ_WITHOUT_CALL = {
    ("seqnorm", ".attn.q_norm"): "the fused operator medattn::seqnorm_core reads the norms' parameters directly",
    ("seqnorm", ".attn.k_norm"): "as above",
    ("seqnorm", ".attn.v_norm"): "as above",
}

# applied where a preset is wider
SHRINK = {"embed_dim": 32, "attn_dim": 32, "mlp_dim": 32, "feature_dim": 8, "num_heads": 4, "decoder_dim": 32}


def halved_to(value: int, limit: int) -> int:
    """``value`` halved until it is at most ``limit``: widths stay multiples of the head counts they had."""
    while value > limit and value % 2 == 0:
        value //= 2
    return value


def small_kwargs(name: str) -> dict:
    """Overrides that make preset ``name`` cheap: narrower layers, two patches per axis."""
    cls, preset = PRESETS[name]
    defaults = {k: p.default for k, p in inspect.signature(cls).parameters.items()}
    kwargs = {key: halved_to(preset.get(key, defaults.get(key)), value) for key, value in SHRINK.items()
              if isinstance(preset.get(key, defaults.get(key)), int) and preset.get(key, defaults.get(key)) > value}
    patch = preset.get("patch_size")
    if patch is not None and "img_size" in defaults:
        kwargs["img_size"] = tuple(2 * p for p in patch) if isinstance(patch, tuple) else 2 * patch
    if preset.get("init_values") is not None:  # LayerScale from 1e-5 scales the attention's gradients by 1e-5, some
        kwargs["init_values"] = 1.0  # below the relative ZERO; the factors still run and get their own gradients
    return kwargs


def bag_inputs(model):  # two bags, the second padded: the masked path runs too
    return torch.randn(2, 5, model.feature_dim), torch.tensor([[True] * 5, [True] * 3 + [False] * 2])


INPUTS = {
    VisionTransformer: lambda model: (torch.randn(2, model.in_chans, *model.img_size),),
    SegmentationViT: lambda model: (torch.randn(2, model.in_chans, *model.img_size),),
    WSITransformer: bag_inputs,
    PixelTransformer: lambda model: (torch.randn(2, model.in_chans, 3, 4),),
    UNet3D: lambda model: (torch.randn(2, model.encoders[0][0][0].in_channels, 8, 8, 8),),
    DilatedFCN3D: lambda model: (torch.randn(2, model.stem[0].in_channels, 8, 8, 8),),
    ResNet: lambda model: (torch.randn(2, model.in_chans, *(16,) * model.spatial_dims),),
    AttentionMIL: bag_inputs,
    TransMIL: bag_inputs,
    SwinClassifier: lambda model: (torch.randn(2, model.in_chans, *(32,) * model.spatial_dims),),  # last stage 2^d
}

CASES = [(name, None) for name in available_models()] + [
    (name, attention) for name in available_models() if takes_attention(name) for attention in available_attentions()]


def named_gradients(model: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    """Gradient of every parameter by name; a fused qkv projection's rows split into ``[q]``, ``[k]``, ``[v]``."""
    grads = {name: param.grad for name, param in model.named_parameters()}
    for module_name, module in model.named_modules():
        if isinstance(module, Attention):
            for kind in ("weight", "bias"):
                key = f"{module_name}.qkv.{kind}"
                if key not in grads:
                    continue
                grad = grads.pop(key)
                rows = [module.inner_dim, module.inner_dim, module.qkv.out_features - 2 * module.inner_dim]
                parts = (None,) * 3 if grad is None else grad.split(rows)
                grads.update({f"{key}[{part}]": g for part, g in zip("qkv", parts, strict=True)})
    return grads


def mechanism_of(name: str, attention: str | None) -> str | None:
    """The mechanism a preset built with ``attention`` uses (its class default when None)."""
    if not takes_attention(name):
        return None
    return attention or inspect.signature(PRESETS[name][0]).parameters["attention"].default


def listed(table: dict, mechanism: str | None, name: str) -> bool:
    """Whether ``name`` ends with a suffix that ``table`` lists for ``mechanism``."""
    return any(entry == mechanism and name.endswith(suffix) for entry, suffix in table)


@pytest.mark.parametrize("name, attention", CASES, ids=[f"{n}-{a}" for n, a in CASES])
def test_every_part_runs_and_gets_a_gradient(name, attention):
    model_cls = PRESETS[name][0]
    if model_cls not in INPUTS:
        pytest.fail(f"add an input builder for {model_cls.__name__} to INPUTS")
    torch.manual_seed(0)
    model = create_model(name, attention=attention, **small_kwargs(name)).double().train()
    head = getattr(model, "head", None)
    if isinstance(head, torch.nn.Linear) and not head.weight.any():  # a head that starts at zero (vitwsi_small's
        torch.nn.init.normal_(head.weight, std=0.1)  # max readout) passes no gradient back in its first step
    fired = set()
    owners = [(n, m) for n, m in model.named_modules() if any(True for _ in m.parameters(recurse=False))]
    for module_name, module in owners:
        module.register_forward_hook(lambda mod, args, out, module_name=module_name: fired.add(module_name))
    inputs = [x.double() if x.is_floating_point() else x for x in INPUTS[model_cls](model)]
    out = model(*inputs)
    assert out.shape[0] == 2 and torch.isfinite(out).all()
    (out * torch.randn_like(out)).sum().backward()

    mechanism = mechanism_of(name, attention)
    not_called = {n for n, _ in owners if listed(READ_WITHOUT_CALL, mechanism, n)}
    assert sorted({n for n, _ in owners} - fired - not_called) == [], "modules with parameters that never ran"
    assert sorted(not_called & fired) == [], "listed in READ_WITHOUT_CALL but called"
    grads = named_gradients(model)
    assert [n for n, g in grads.items() if g is None] == [], "parameters without a gradient"
    assert [n for n, g in grads.items() if not torch.isfinite(g).all()] == [], "non-finite gradients"
    scale = max(g.abs().max().item() for g in grads.values())
    zero = {n for n, g in grads.items() if g.abs().max().item() <= ZERO * scale}
    frozen = {n for n in grads if listed(FROZEN_ON_PURPOSE, mechanism, n)}
    assert sorted(zero - frozen) == [], "parameters whose gradient is zero"
    assert sorted(frozen - zero) == [], "listed in FROZEN_ON_PURPOSE but they do get a gradient"


def test_frozen_list_is_not_everything():
    """Each FROZEN_ON_PURPOSE entry names one mechanism and matches only a few parameters of its model."""
    for (mechanism, suffix), why in FROZEN_ON_PURPOSE.items():
        assert mechanism in available_attentions() and why
        names = list(named_gradients(create_model("vit2d_tiny", attention=mechanism)))
        matched = [n for n in names if n.endswith(suffix)]
        assert 0 < len(matched) <= len(names) // 5, (mechanism, suffix)
