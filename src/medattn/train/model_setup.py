"""The model a supervised run trains, before its first step, and what the run records about it.

* :func:`size_warnings`: the data does not fit the preset's grid; :func:`preset_design` and :func:`model_defaults`:
  the preset values the config left to it (the checkpoint's ``model_defaults``; the summary's and results.json's).
* :func:`initialise` (``--init-from``): a new model started from another run's checkpoint or a plain weights file.
  A checkpoint must fill the new model's encoder (every tensor outside its ``head``): it is refused when a tensor of
  the encoder has another shape there (another preset: ``vit2d_small``'s pretraining into ``vit2d_tiny``) or when no
  tensor outside the head shares a name and shape (a ViT's pretraining into a ResNet, where only the head's bias
  matched). Tensors only one attention mechanism has (SeqNorm's norms) stay new, as :func:`convert_attention` keeps
  them; the head is the task's and may differ. So a run records ``pretrained`` only when its encoder was loaded.
* :func:`fit_feature_norm`: the bag models' feature standardisation
  (:class:`medattn.models.layers.FeatureStandardizer`) fitted on the training split: per-feature mean and standard
  deviation over every training instance.
* :func:`training_module`: memory and speed of the training step. ``train.activation_checkpointing: true`` turns on
  per-block recomputation in every transformer encoder of the model
  (:func:`medattn.models.layers.set_activation_checkpointing`): the same gradients, the blocks' stored activations
  cut to their inputs, about one more forward pass of compute. ``train.compile: true`` trains through
  ``torch.compile(model, fullgraph=True)`` (inductor): forward and backward are each captured whole and fused
  (LayerNorm, GELU, residual adds, the attention cores' elementwise work). Only the training step is compiled;
  validation, test and the checkpoints use the plain model (the same parameters), so a checkpoint never depends on
  the compiler. Under DDP the graph is split at the gradient buckets, so ``fullgraph`` is off there. The first step
  compiles (tens of seconds to minutes on a CPU); a new input shape (e.g. a shorter last batch) compiles once more.
"""

from __future__ import annotations

import inspect
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

from medattn.data import input_kinds
from medattn.data.base import TaskInfo
from medattn.errors import UserError
from medattn.models.layers import FeatureStandardizer, set_activation_checkpointing
from medattn.models.presets import PRESETS
from medattn.models.pretrained import describe, load_pretrained
from medattn.runtime import checkpoint

#: A token count this many times the preset's own (or 1/this) is worth a warning: attention cost and the data a
#: ViT needs grow with it, and a preset's depth and width were chosen for its own grid.
TOKEN_RATIO_WARNING = 2.0


def _per_axis(value, spatial: int) -> tuple[int, ...]:
    return (value,) * spatial if isinstance(value, int) else tuple(value)


def size_warnings(model_cfg: dict, task: TaskInfo) -> list[str]:
    """Sentences for the run summary when the data's size does not fit the preset's (empty when it does).

    A patch-based preset (``img_size`` and ``patch_size``) is built on the data's grid (:func:`build_model`),
    so a preset made for 64 px images runs 784 tokens on 224 px images where it was designed for 64. When the
    token count differs from the preset's by :data:`TOKEN_RATIO_WARNING` or more, say so and name the keys
    that change it (``data.image_size``/``data.target_size``, ``model.kwargs.patch_size``).
    """
    preset = PRESETS[model_cfg["name"]][1]
    given = model_cfg.get("kwargs") or {}
    gridless = not input_kinds.of(task.input_kind).spatial_dims  # a bag: no grid to cut into patches
    if gridless or "img_size" not in preset or "patch_size" not in preset or "img_size" in given:
        return []
    spatial = len(task.input_shape) - 1
    design, design_patch = (_per_axis(preset[key], spatial) for key in ("img_size", "patch_size"))
    patch = _per_axis(given.get("patch_size", preset["patch_size"]), spatial)
    if not len(patch) == len(design) == len(design_patch) == spatial:
        return []  # build_model reports the mismatch of dimensions
    tokens = math.prod(s // p for s, p in zip(task.input_shape[1:], patch))
    designed = math.prod(s // p for s, p in zip(design, design_patch))
    if max(tokens, designed) < TOKEN_RATIO_WARNING * min(tokens, designed):
        return []
    size_key = "data.target_size" if spatial == 3 else "data.image_size"
    shape = "x".join(map(str, task.input_shape[1:]))
    return [f"model {model_cfg['name']!r} is made for inputs of {'x'.join(map(str, design))} ({designed} tokens of "
            f"{'x'.join(map(str, design_patch))}); the data gives {shape}: {tokens} tokens of "
            f"{'x'.join(map(str, patch))} ({tokens / designed:.3g}x); set {size_key} or model.kwargs.patch_size "
            f"to change it"]


#: Model arguments whose preset value is recorded with a run when the config does not set them (in the summary and
#: results.json, and in the checkpoint, which applies them on load: a later change of the preset's default does not
#: change what a checkpoint builds).
RECORDED_KWARGS = ("stem", "global_pool", "standardize_features", "readout", "init_values", "pool_norm",
                   "pooled_features")


def preset_design(model_cfg: dict) -> dict:
    """``{"stem": "residual", ...}``: the preset's values of :data:`RECORDED_KWARGS` the config left to it (the
    checkpoint's ``model_defaults``); a value that is None (a feature left off) is not recorded."""
    preset = PRESETS[model_cfg["name"]]
    given = model_cfg.get("kwargs") or {}
    signature = inspect.signature(preset[0]).parameters
    design = {key: preset[1].get(key, signature[key].default) for key in RECORDED_KWARGS
              if key not in given and key in signature}
    return {key: value for key, value in design.items() if value is not None}


def model_defaults(model_cfg: dict) -> dict:
    """``{"model.kwargs.stem": "conv", ...}``: :func:`preset_design` as config keys, for the run's summary and
    results.json (a default one cannot see in the config)."""
    return {f"model.kwargs.{key}": value for key, value in preset_design(model_cfg).items()}


#: Tensor names a log line shows before it counts the rest.
SHOWN_NAMES = 6
#: The prefix of the task's own tensors (the classifier head), which a checkpoint need not fill.
HEAD = "head."


def initialise(model: nn.Module, init_from: str | Path, log: Callable[[str], None]) -> dict:
    """Load ``init_from`` into a new model: a plain weights file (timm, DINO, MAE or MONAI ViT) or another run's
    checkpoint (its shared tensors, which must fill the encoder: :func:`encoder_problem`); logs and returns what was
    loaded, adapted, new and unused."""
    if checkpoint.is_plain_weights(init_from):
        loaded = load_pretrained(model, init_from)
        log(f"initialised from {init_from}: {describe(loaded)}")
        return {"from": str(init_from), **loaded}
    folder = checkpoint.resolve(init_from)
    meta = checkpoint.load_meta(folder)
    problem = encoder_problem(model, folder)
    if problem:
        raise UserError(f"--init-from {init_from} ({meta['config']['model']['name']}): {problem}; start from a "
                        f"checkpoint of the same preset")
    new, unused = checkpoint.init_from(model, folder)
    pretrained = meta.get("pretrained")  # written by medattn pretrain
    log(f"initialised from {init_from}" + (f" (pretrained by {pretrained['objective']})" if pretrained else "")
        + f": {len(new)} new tensor(s)" + (f": {_some(new)}" if new else "")
        + (f"; {len(unused)} checkpoint tensor(s) unused: {_some(unused)}" if unused else "")
        + ("; every name is in results.json (init_from)" if len(new) + len(unused) > 2 * SHOWN_NAMES else ""))
    return {"from": str(init_from), "new_tensors": new, "unused_tensors": unused, "pretrained": pretrained}


def encoder_problem(model: nn.Module, folder: Path) -> str | None:
    """Why the checkpoint in ``folder`` would load less than ``model``'s encoder (its tensors outside :data:`HEAD`),
    or None when it fills it (see the module docstring). ``model`` may be on the meta device."""
    stored = checkpoint.header_shapes(folder)
    own = {name: tuple(t.shape) for name, t in model.state_dict().items() if not name.startswith(HEAD)}
    other = [name for name, shape in own.items() if name in stored and stored[name] != shape]
    if other:
        return (f"it would load less than the encoder: {len(other)} of the model's encoder tensors have another "
                f"shape in it ({other[0]}: {list(stored[other[0]])} there, {list(own[other[0]])} in the model)")
    if not any(stored.get(name) == shape for name, shape in own.items()):
        return "it would load none of the encoder: no tensor outside the head shares a name and shape with the model"
    return None


def takes_encoder(model_config: dict, init_from: str | Path) -> bool:
    """Whether a model of ``model_config`` (a config's ``model`` section) takes the encoder of the checkpoint at
    ``init_from`` (a plain weights file: yes, its loader adapts it); the model is built on the meta device."""
    if checkpoint.is_plain_weights(init_from):
        return True
    from medattn.runtime.build import build_model

    folder = checkpoint.resolve(init_from)
    task = checkpoint.task_from_dict(checkpoint.load_meta(folder)["task"])
    with torch.device("meta"):
        model = build_model(model_config, task)
    return encoder_problem(model, folder) is None


def _some(names: list[str]) -> str:
    """The first :data:`SHOWN_NAMES` names, and how many more."""
    more = len(names) - SHOWN_NAMES
    return ", ".join(names[:SHOWN_NAMES]) + (f" and {more} more" if more > 0 else "")


def feature_statistics(dataset: Dataset) -> tuple[torch.Tensor, torch.Tensor, int]:
    """-> (mean (F,), std (F,), instances): over every instance of every bag of ``dataset`` (its ``"input"``
    (N, F)), accumulated in float64; the population std (ddof 0). Bags are read as training reads them
    (``max_instances`` subsampling included) under a forked RNG, so the training order stays as seeded."""
    total, squares, count = None, None, 0
    with torch.random.fork_rng():
        for index in range(len(dataset)):
            features = dataset[index]["input"].double()  # (N, F)
            total = features.sum(0) if total is None else total + features.sum(0)
            squares = features.square().sum(0) if squares is None else squares + features.square().sum(0)
            count += features.shape[0]
    mean = total / count
    return mean, (squares / count - mean.square()).clamp_min(0).sqrt(), count


def fit_feature_norm(model: nn.Module, train_set: Dataset) -> dict | None:
    """Set every :class:`FeatureStandardizer` of ``model`` to the training split's statistics; -> what was
    fitted (for results.json), or None when the model has none (images, or ``standardize_features=False``)."""
    layers = [m for m in model.modules() if isinstance(m, FeatureStandardizer)]
    if not layers:
        return None
    mean, std, count = feature_statistics(train_set)
    for layer in layers:
        layer.set_statistics(mean.to(layer.mean), std.to(layer.std))
    return {"instances": count, "bags": len(train_set), "mean_range": [float(mean.min()), float(mean.max())],
            "std_range": [float(std.min()), float(std.max())]}


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
