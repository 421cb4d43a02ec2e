"""Memory and speed options of the training step: activation checkpointing and ``torch.compile``.

``train.activation_checkpointing: true`` turns on per-block recomputation in every transformer encoder
of the model (:func:`medattn.models.layers.set_activation_checkpointing`): the same gradients, the
blocks' stored activations cut to their inputs, about one more forward pass of compute.

``train.compile: true`` trains through ``torch.compile(model, fullgraph=True)`` (inductor): forward and
backward are each captured whole and fused (LayerNorm, GELU, residual adds, the attention cores'
elementwise work). Only the training step is compiled; validation, test and the checkpoints use the
plain model (the same parameters), so a checkpoint never depends on the compiler. Under DDP the graph is
split at the gradient buckets, so ``fullgraph`` is off there. The first step compiles (tens of seconds
to minutes on a CPU); a new input shape (e.g. a shorter last batch) compiles once more.
"""

from __future__ import annotations

import os
import shutil

import torch
from torch import nn

from medattn.errors import UserError
from medattn.models.layers import set_activation_checkpointing

#: torch.compile backend of ``train.compile``; tests swap in "aot_eager" (the same capture, no C++ build).
COMPILE_BACKEND = "inductor"


def training_module(model: nn.Module, wrapped: nn.Module, train_cfg: dict) -> nn.Module:
    """The module the training step calls: ``wrapped`` (the model or its DDP wrapper), compiled if
    ``train.compile``; ``model`` gets activation checkpointing if ``train.activation_checkpointing``.

    Raises UserError naming the key for a model without transformer blocks to checkpoint, or for
    ``train.compile`` on a CPU without a C++ compiler (inductor needs one).
    """
    if train_cfg.get("activation_checkpointing") and set_activation_checkpointing(model, True) == 0:
        raise UserError(f"train.activation_checkpointing: {type(model).__name__} has no transformer blocks to "
                        "checkpoint; set it to false")
    if not train_cfg.get("compile"):
        return wrapped
    on_cpu = all(p.device.type == "cpu" for p in model.parameters())
    if COMPILE_BACKEND == "inductor" and on_cpu and not _cxx_compiler():
        raise UserError("train.compile: inductor needs a C++ compiler on a CPU (g++ or clang++, or $CXX); none "
                        "found: install one or set train.compile=false")
    return torch.compile(wrapped, fullgraph=wrapped is model, backend=COMPILE_BACKEND)


def _cxx_compiler() -> str | None:
    candidates = [os.environ["CXX"]] if os.environ.get("CXX") else ["g++", "clang++", "c++"]
    return next((path for path in map(shutil.which, candidates) if path), None)
