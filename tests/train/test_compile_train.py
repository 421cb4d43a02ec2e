"""train.compile, train.activation_checkpointing and the fused optimizer in the training loop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from engine_data import bag_bundle, image_bundle, tiny_config
from medattn.attention import available_attentions, build_attention
from medattn.config import DEFAULTS
from medattn.errors import UserError
from medattn.models import create_model
from medattn.train import fit, model_setup
from medattn.train.optim import make_optimizer


def _loss_and_grads(module, model, x):
    model.zero_grad(set_to_none=True)
    loss = F.binary_cross_entropy_with_logits(module(x), torch.ones(len(x), 1))
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("mechanism", ["seqnorm", pytest.param("softmax", marks=pytest.mark.slow),
                                       pytest.param("sima", marks=pytest.mark.slow)])
def test_compiled_checkpointed_step_matches_eager(monkeypatch, mechanism):
    """The whole model's forward and backward captured with fullgraph=True (a graph break raises) and
    checkpointed blocks give the eager model's loss and gradients. (Every mechanism's own capture is
    checked fast in tests/attention/test_contract_attention.py; here the whole model, seqnorm in CI.)"""
    monkeypatch.setattr(model_setup, "COMPILE_BACKEND", "aot_eager")  # the same capture, no C++ build
    torch.manual_seed(0)
    model = create_model("vit2d_tiny", attention=mechanism)
    x = torch.randn(2, 1, 32, 32)
    loss, grads = _loss_and_grads(model, model, x)
    module = model_setup.training_module(model, model, {"compile": True, "activation_checkpointing": True})
    assert module is not model and model.encoder.activation_checkpointing
    compiled_loss, compiled_grads = _loss_and_grads(module, model, x)
    torch.testing.assert_close(compiled_loss, loss, rtol=1e-5, atol=1e-6)
    for name in grads:
        torch.testing.assert_close(compiled_grads[name], grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_fit_with_compile_and_checkpointing_keeps_plain_checkpoints(tmp_path, monkeypatch):
    monkeypatch.setattr(model_setup, "COMPILE_BACKEND", "aot_eager")
    config = tiny_config("train.compile=true", "train.activation_checkpointing=true", "train.epochs=1",
                         "model.attention=seqnorm")
    results = fit(config, image_bundle(), tmp_path / "run", progress=False, log=lambda m: None)
    assert 0 <= results["test"]["auroc"] <= 1
    state = load_file(tmp_path / "run" / "checkpoints" / "best" / "model.safetensors")
    assert state and not any("_orig_mod" in key for key in state)  # the plain model is saved


def test_checkpointing_a_model_without_blocks_is_a_user_error(tmp_path):
    config = tiny_config("model.name=abmil_tiny", "model.attention=null", "train.activation_checkpointing=true",
                         "train.epochs=1")
    with pytest.raises(UserError, match="train.activation_checkpointing: AttentionMIL has no transformer blocks"):
        fit(config, bag_bundle(), tmp_path / "run", progress=False, log=lambda m: None)


def test_compile_without_a_cxx_compiler_is_a_user_error(monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(model_setup.shutil, "which", lambda name: None)
    model = create_model("vit2d_tiny")
    with pytest.raises(UserError, match=r"train.compile: inductor needs a C\+\+ compiler"):
        model_setup.training_module(model, model, {"compile": True})


def test_options_are_checked_in_the_config():
    with pytest.raises(UserError, match="train.compile"):
        tiny_config("train.compile=2")
    with pytest.raises(UserError, match="train.activation_checkpointing"):
        tiny_config("train.activation_checkpointing=1")
    assert DEFAULTS["train"]["compile"] is False and DEFAULTS["train"]["activation_checkpointing"] is False


@pytest.mark.parametrize("name", ["adamw", "adam"])
def test_optimizer_is_fused_on_cpu_and_steps_like_the_loop_version(name):
    cfg = {**DEFAULTS["train"], "warmup_epochs": 1.0, "optimizer": name, "lr": 1e-2, "weight_decay": 0.1}
    torch.manual_seed(0)
    model = create_model("vit2d_tiny")
    twin = create_model("vit2d_tiny")
    twin.load_state_dict(model.state_dict())
    fused = make_optimizer(model, cfg)
    plain = make_optimizer(twin, cfg)
    for group in plain.param_groups:
        group["fused"], group["foreach"] = None, False
    assert all(group["fused"] for group in fused.param_groups)
    for step in range(3):  # gradients well away from zero: Adam's update divides by their running size
        for net, optimizer in ((model, fused), (twin, plain)):
            generator = torch.Generator().manual_seed(step)
            for p in net.parameters():
                p.grad = torch.rand(p.shape, generator=generator) + 0.5
            optimizer.step()
    for (key, a), b in zip(model.state_dict().items(), twin.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.slow
def test_fit_with_inductor(tmp_path):
    """The real compiler end to end (tens of seconds to minutes on a 2-core CPU; the fast tests above use
    the same capture with the aot_eager backend)."""
    results = fit(tiny_config("train.compile=true", "train.epochs=1"), image_bundle(), tmp_path / "run",
                  progress=False, log=lambda m: None)
    assert 0 <= results["test"]["auroc"] <= 1


@pytest.mark.parametrize("mechanism", available_attentions())
def test_every_mechanism_trains_compiled_under_the_backend_the_tests_use(mechanism):
    """Forward and backward of each mechanism under torch.compile(fullgraph=True) with ``aot_eager`` (the backend
    of train.compile's tests) equal eager; ``linear``'s elu backward once failed there on a strided view."""
    torch._dynamo.reset()  # a fresh cache: the recompile limit counts every earlier test's Attention.forward
    torch.manual_seed(0)
    attention = build_attention(mechanism, 32, 4).eval()  # eval: Bernoulli sampling off, gradients kept
    x = torch.randn(2, 9, 32)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False
    outputs = []
    for module in (attention, torch.compile(attention, backend="aot_eager", fullgraph=True)):
        attention.zero_grad(set_to_none=True)
        inputs = x.clone().requires_grad_(True)
        y = module(inputs, mask)
        y.square().sum().backward()
        outputs.append((y.detach(), inputs.grad, attention.qkv.weight.grad))
    for compiled, eager in zip(outputs[1], outputs[0]):
        torch.testing.assert_close(compiled, eager, rtol=1e-3, atol=1e-4)  # SeqNorm: fused vs explicit form
