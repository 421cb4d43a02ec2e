"""Per-block activation checkpointing: the same gradients, fewer stored activations."""

from __future__ import annotations

import pytest
import torch

from medattn.models import create_model
from medattn.models.layers import Encoder, set_activation_checkpointing

MECHANISMS = ("softmax", "sima", "seqnorm")


def _inputs(name: str):
    generator = torch.Generator().manual_seed(1)
    if name == "vitwsi_tiny":
        features = torch.randn(2, 9, 16, generator=generator, dtype=torch.float64)
        mask = torch.ones(2, 9, dtype=torch.bool)
        mask[1, 6:] = False  # a padded bag: the mask goes through the checkpointed blocks too
        return (features,), {"mask": mask}
    if name == "pixel_tiny":
        return (torch.randn(2, 1, 6, 6, generator=generator, dtype=torch.float64),), {}
    return (torch.randn(2, 1, 32, 32, generator=generator, dtype=torch.float64),), {}


def _gradients(name: str, mechanism: str, checkpointing: bool, drop_rate: float = 0.0) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = create_model(name, attention=mechanism, drop_rate=drop_rate,
                         activation_checkpointing=checkpointing).double()
    args, kwargs = _inputs(name)
    torch.manual_seed(5)  # the dropout masks: replayed by the recomputation from the saved RNG state
    model(*args, **kwargs).square().sum().backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", ["vit2d_tiny", "vitwsi_tiny", "pixel_tiny"])
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_gradients_equal_with_and_without(name, mechanism):
    plain = _gradients(name, mechanism, checkpointing=False)
    recomputed = _gradients(name, mechanism, checkpointing=True)
    assert plain.keys() == recomputed.keys() and len(plain) > 0
    for key in plain:
        torch.testing.assert_close(recomputed[key], plain[key], rtol=1e-12, atol=1e-12, msg=key)


def test_dropout_masks_are_replayed():
    plain = _gradients("vit2d_tiny", "seqnorm", checkpointing=False, drop_rate=0.3)
    recomputed = _gradients("vit2d_tiny", "seqnorm", checkpointing=True, drop_rate=0.3)
    for key in plain:
        torch.testing.assert_close(recomputed[key], plain[key], rtol=1e-12, atol=1e-12, msg=key)


def _saved_bytes(model, x) -> int:
    """Bytes of the distinct storages autograd keeps for the backward pass of ``model(x)``."""
    storages = {}

    def pack(tensor):
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(x)
    return sum(storages.values())


def test_checkpointing_lowers_stored_activations():
    """Memory measured, not timed: the bytes kept for backward fall to the blocks' inputs (about 1/depth)."""
    torch.manual_seed(0)
    model = create_model("vit2d_small", attention="seqnorm", stem="patch")  # the stem stores its own activations
    x = torch.randn(2, 1, 64, 64)
    stored = _saved_bytes(model, x)
    assert set_activation_checkpointing(model, True) == 1
    checkpointed = _saved_bytes(model, x)
    block_inputs = 4 * 2 * (1 + 64) * 128 * 4  # depth x (B, 1 + N, D') float32
    assert checkpointed < stored / 5
    assert block_inputs <= checkpointed < 2 * block_inputs


def test_inference_and_models_without_blocks_are_untouched():
    model = create_model("vit2d_tiny", attention="seqnorm", activation_checkpointing=True)
    x = torch.randn(1, 1, 32, 32)
    with torch.no_grad():  # nothing is recorded, so nothing is recomputed
        out = model(x)
    assert not out.requires_grad
    assert set_activation_checkpointing(create_model("resnet2d_tiny"), True) == 0
    assert all(not m.activation_checkpointing for m in create_model("vit2d_tiny").modules() if isinstance(m, Encoder))
