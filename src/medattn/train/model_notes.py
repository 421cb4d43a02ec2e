"""What a run records about its model beyond the config: size warnings and the preset values it left to defaults."""

from __future__ import annotations

import inspect
import math

from medattn.data import input_kinds
from medattn.data.base import TaskInfo
from medattn.models.presets import PRESETS

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
RECORDED_KWARGS = ("stem", "global_pool", "standardize_features", "readout", "init_values", "pool_norm")


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
