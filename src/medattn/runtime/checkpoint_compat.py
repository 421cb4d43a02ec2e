"""Checkpoints written before a preset's design changed load as what they are.

A checkpoint records its model config; a key it leaves out takes today's default. Where a default changed since
(a stem, a readout, standardised features, LayerScale), a checkpoint written before holds weights of the older
design, which its tensor names show: :func:`keep_design` writes that design into its ``model.kwargs`` as it is read
(:func:`medattn.runtime.checkpoint.load_meta`), so it builds and loads as it was trained.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from medattn.models.presets import PRESETS

#: The CPU ViT presets whose design changed since checkpoints were first written: the stem became the convolutional
#: one on 2026-11-24 (before: a patch embedding, ``patch_embed.weight``), then the residual one with the mean of the
#: patch tokens as readout on 2026-11-27 (issue 40; before: ``global_pool="token"``). Their checkpoints hold no
#: ``stem`` or ``global_pool`` key and load as what they are (:func:`_keep_vit_design`).
SMALL_VIT_PRESETS = ("vit2d_small", "vit3d_small")
#: A tensor only the residual stem has (:class:`~medattn.models.resnet.ResidualStem`: its full-resolution block).
RESIDUAL_STEM_TENSOR = "patch_embed.stem.3.conv1.weight"

Shapes = Callable[[], dict[str, tuple[int, ...]]]


def keep_design(meta: dict, shapes: Shapes) -> None:
    """Complete ``meta["config"]["model"]["kwargs"]`` (in place) with the design of an older checkpoint; ``shapes``
    gives the checkpoint's tensor names and shapes from the safetensors header (read only where a rule needs it)."""
    model_cfg = meta["config"]["model"]
    if "model_defaults" not in meta:  # written before the preset's values were recorded: read them from the weights
        _keep_vit_design(model_cfg, shapes)
    _keep_raw_features(model_cfg, shapes)
    _keep_class_token(model_cfg, shapes)
    _keep_unnormalised_pool(model_cfg, shapes)
    _keep_unscaled_branches(model_cfg, meta.get("model_defaults", {}), shapes)
    _keep_patch_swin(model_cfg, meta.get("model_defaults", {}), shapes)


#: ``swin2d_small`` and ``swin3d_small`` before they became hybrids on 2026-11-27 (issue 40): MONAI's SwinTransformer
#: with C = 24 and window 4 (the other values were the class's defaults then and now).
PATCH_SWIN_SMALL = {"stem": "patch", "init_values": None, "embed_dim": 24, "window_size": 4, "depths": (2, 2, 2, 2),
                    "num_heads": (3, 6, 12, 24), "patch_size": 2, "mlp_ratio": 4.0}
#: A tensor only the patch design has (MONAI's SwinTransformer patch embedding).
PATCH_SWIN_TENSOR = "encoder.patch_embed.proj.weight"


def _keep_patch_swin(model_cfg: dict, recorded: dict, shapes: Shapes) -> None:
    """A ``swin*_small`` checkpoint written before the presets became hybrids (no ``stem`` in its config or
    ``model_defaults``; MONAI's patch embedding among its tensors) gets the preset's values of then."""
    kwargs = model_cfg["kwargs"]
    if (model_cfg["name"] not in ("swin2d_small", "swin3d_small") or "stem" in kwargs or "stem" in recorded
            or PATCH_SWIN_TENSOR not in shapes()):
        return
    for key, value in PATCH_SWIN_SMALL.items():
        kwargs.setdefault(key, value)


def _keep_unscaled_branches(model_cfg: dict, recorded: dict, shapes: Shapes) -> None:
    """A transformer's checkpoint without LayerScale factors (no ``*.gamma`` tensor: written before its preset gained
    ``init_values`` on 2026-11-27, issue 40) gets ``init_values: None`` and loads as what it is."""
    kwargs = model_cfg["kwargs"]
    if "init_values" in kwargs or "init_values" in recorded or model_cfg["name"] not in PRESETS:
        return
    if PRESETS[model_cfg["name"]][1].get("init_values") is not None and not any(
            name.endswith(".gamma") for name in shapes()):
        kwargs["init_values"] = None


def _keep_class_token(model_cfg: dict, shapes: Shapes) -> None:
    """A bag transformer's checkpoint written with a class token (``cls_token``) and no ``readout`` key, of a preset
    whose default readout is another since (issue 40), gets ``readout: cls`` and loads as what it is."""
    kwargs = model_cfg["kwargs"]
    if "readout" in kwargs or model_cfg["name"] not in PRESETS:
        return
    cls, preset = PRESETS[model_cfg["name"]]
    readout = inspect.signature(cls).parameters.get("readout")
    if readout is not None and preset.get("readout", readout.default) != "cls" and "cls_token" in shapes():
        kwargs["readout"] = "cls"


def _keep_unnormalised_pool(model_cfg: dict, shapes: Shapes) -> None:
    """A bag transformer's checkpoint with a pooling readout written before the pooled vector was standardised
    (2026-11-28, issue 48: no ``pool_norm.mean`` tensor) gets ``pool_norm: false`` and loads as what it is."""
    kwargs = model_cfg["kwargs"]
    if "pool_norm" in kwargs or model_cfg["name"] not in PRESETS:
        return
    from medattn.models.wsi import POOL_NORM_READOUTS

    cls, preset = PRESETS[model_cfg["name"]]
    parameters = inspect.signature(cls).parameters
    if "pool_norm" not in parameters or preset.get("pool_norm") is not None:
        return
    readout = kwargs.get("readout", preset.get("readout", parameters["readout"].default))
    if readout in POOL_NORM_READOUTS and "pool_norm.mean" not in shapes():
        kwargs["pool_norm"] = False


def _keep_raw_features(model_cfg: dict, shapes: Shapes) -> None:
    """A bag model's checkpoint written before features were standardised (2026-11-25) holds no
    ``feature_norm.mean``; it gets ``standardize_features: false`` and loads as what it is."""
    kwargs = model_cfg["kwargs"]
    if "standardize_features" in kwargs or model_cfg["name"] not in PRESETS:
        return
    takes = "standardize_features" in inspect.signature(PRESETS[model_cfg["name"]][0]).parameters
    if takes and "feature_norm.mean" not in shapes():
        kwargs["standardize_features"] = False


def _keep_vit_design(model_cfg: dict, shapes: Shapes) -> None:
    """A checkpoint of a :data:`SMALL_VIT_PRESETS` preset written before its design changed gets the design its
    weights show in ``model.kwargs``: ``stem: patch`` (a single patchify convolution) or ``stem: conv`` (early
    convolutions, no residual block), each with ``global_pool: token``, the readout of those days."""
    kwargs = model_cfg["kwargs"]
    if model_cfg["name"] not in SMALL_VIT_PRESETS or "stem" in kwargs:
        return
    tensors = shapes()
    if RESIDUAL_STEM_TENSOR in tensors:
        return
    kwargs["stem"] = "patch" if "patch_embed.weight" in tensors else "conv"
    kwargs.setdefault("global_pool", "token")
