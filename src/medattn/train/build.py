"""From the config's model section to a model: checks that build nothing, the build, and one forward call."""

from __future__ import annotations

import inspect
import math

import torch
from torch import nn

from medattn.attention import available_attentions
from medattn.data.base import TaskInfo
from medattn.errors import UserError
from medattn.models import create_model, input_contract, takes_attention
from medattn.models.presets import PRESETS


def accepted_kwargs(name: str) -> set[str] | None:
    """The keyword arguments preset ``name``'s class takes (``attention`` aside); None when it takes any."""
    parameters = inspect.signature(PRESETS[name][0]).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return None
    return {k for k in parameters if k not in ("self", "attention")}


def check_model_config(model_cfg: dict) -> None:
    """The model section names a preset, a registered mechanism (or none, for models without one) and
    only keyword arguments the preset's class takes; a UserError names the key. Cheap: builds nothing."""
    name, attention, kwargs = model_cfg["name"], model_cfg.get("attention"), model_cfg.get("kwargs") or {}
    if name not in PRESETS:
        raise UserError(f"model.name: unknown model {name!r}; available: {', '.join(sorted(PRESETS))}")
    if attention is not None:
        if not takes_attention(name):
            raise UserError(f"model.attention: model {name!r} has no attention mechanism; got {attention!r} "
                            f"(set model.attention=null)")
        if attention not in available_attentions():
            raise UserError(f"model.attention: unknown attention {attention!r}; available: "
                            f"{', '.join(available_attentions())}")
    accepted = accepted_kwargs(name)
    unknown = [] if accepted is None else [k for k in kwargs if k not in accepted]
    if unknown:
        raise UserError(f"model.kwargs.{unknown[0]}: model {name!r} takes no argument {unknown[0]!r}; "
                        f"it takes {', '.join(sorted(accepted))}")


def build_model(model_cfg: dict, task: TaskInfo) -> nn.Module:
    """The configured preset with its input and output sizes taken from the task (explicit kwargs win).

    Built on the current default device (``with torch.device("meta")`` builds shapes only). Values the
    model refuses (``ValueError``/``TypeError`` from its constructor) become a UserError naming
    ``model.kwargs`` and the sizes taken from the data.
    """
    check_model_config(model_cfg)
    name = model_cfg["name"]
    given = dict(model_cfg.get("kwargs") or {})
    kwargs = {**given}
    kwargs.setdefault("num_classes", task.num_outputs)
    is_bag_model = input_contract(name) == "bag"
    if is_bag_model != (task.input_kind == "bag"):
        wants = "feature bags" if is_bag_model else "images or volumes"
        raise UserError(f"model {name!r} takes {wants} but the data gives {task.input_kind} inputs")
    if is_bag_model:
        kwargs.setdefault("feature_dim", task.input_shape[0])
    else:
        kwargs.setdefault("in_chans", task.input_shape[0])
        if "img_size" in inspect.signature(PRESETS[name][0]).parameters:  # the model's grid is the data's grid
            kwargs.setdefault("img_size", tuple(task.input_shape[1:]))
    try:
        return create_model(name, attention=model_cfg.get("attention"), **kwargs)
    except (ValueError, TypeError) as error:
        from_data = {k: v for k, v in kwargs.items() if k not in given}
        raise UserError(f"model.kwargs {given or '{}'} (with {from_data} from the data) do not build model "
                        f"{name!r}: {error}") from error


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
    if task.input_kind == "bag" or "img_size" not in preset or "patch_size" not in preset or "img_size" in given:
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


def forward(model: nn.Module, batch: dict, input_kind: str) -> torch.Tensor:
    """Logits (B, K) (segmentation: (B, K, H, W, D)): ``model(x)`` for images/volumes,
    ``model(features, mask, coords)`` for bags."""
    if input_kind == "bag":
        return model(batch["input"], mask=batch.get("mask"), coords=batch.get("coords"))
    return model(batch["input"])


def check_device(name: str) -> None:
    """``train.device`` names a device this machine has (CUDA/MPS present, the CUDA index in range)."""
    if name.startswith("cuda"):
        index = int(name.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise UserError(f"train.device={name}: this machine has {torch.cuda.device_count()} CUDA device(s); "
                            f"use train.device=auto or cpu")
    elif name == "mps" and not torch.backends.mps.is_available():
        raise UserError("train.device=mps: MPS is not available on this machine; use train.device=auto or cpu")


#: Model arguments whose preset value is recorded with a run when the config does not set them.
RECORDED_KWARGS = ("stem", "standardize_features")


def model_defaults(model_cfg: dict) -> dict:
    """``{"model.kwargs.stem": "conv", ...}``: the preset's values of :data:`RECORDED_KWARGS` the config left to it
    (a default one cannot see in the config), for the run's summary and results.json."""
    preset = PRESETS[model_cfg["name"]]
    given = model_cfg.get("kwargs") or {}
    signature = inspect.signature(preset[0]).parameters
    chosen = {}
    for key in RECORDED_KWARGS:
        if key in given or key not in signature:
            continue
        value = preset[1].get(key, signature[key].default)
        chosen[f"model.kwargs.{key}"] = value
    return chosen
