"""Building the two diffusion stages from a run config, and their checkpoints.

Stage 1 (``task: diffusion_vqae``): ``model.name: vqae3d``, the VQ-AE's arguments in ``model.kwargs``
(:class:`~medattn.diffusion.vqae.VQAutoencoder3d`). Stage 2 (``task: diffusion_transformer``):
``model.name: absorbing_transformer``, ``model.attention`` any registered mechanism, ``model.kwargs``
the transformer's ``dim``, ``depth``, ``num_heads``, ``mlp_ratio``, ``attention_kwargs``
(:class:`~medattn.diffusion.transformer.AbsorbingTransformer`); its grid and codebook sizes come from
the stage-1 checkpoint (``diffusion.vqae_checkpoint``) and the data's volume size.

A checkpoint is the usual folder, written by the training loop (:mod:`medattn.runtime.checkpoint`:
``model.safetensors`` written atomically, ``checkpoint.json`` with ``config`` and ``diffusion``: stage, volume shape,
SYNTHETIC flag, epoch; ``checkpoints/last`` also the training state), read by :func:`read_meta` and
:func:`load_stage`. A stage-2 checkpoint holds the VQ-AE too (``vqae.*`` tensors beside ``transformer.*``, and the
stage-1 config in its metadata), so it is self-contained: moving or deleting the stage-1 run does not break
inpainting. Loading builds the model on the meta device first and
compares every tensor's name and shape with the file before any weight is read.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from medattn.catalogue import DIFFUSION_STAGES
from medattn.config import validate
from medattn.diffusion.transformer import AbsorbingTransformer
from medattn.diffusion.vqae import VQAutoencoder3d, patch_grid
from medattn.errors import UserError
from medattn.runtime import checkpoint

STAGES = DIFFUSION_STAGES
TRANSFORMER_KEYS = ("dim", "depth", "num_heads", "mlp_ratio", "attention_kwargs", "drop_rate")


class DiffusionModel(nn.Module):
    """The VQ-AE and, for stage 2, the transformer: one state dict (``vqae.*``, ``transformer.*``)."""

    def __init__(self, vqae: VQAutoencoder3d, transformer: AbsorbingTransformer | None = None) -> None:
        super().__init__()
        self.vqae = vqae
        self.transformer = transformer


def check_stage_config(config: dict) -> None:
    """``model.name`` matches ``task``, and stage 2 names a stage-1 checkpoint; UserError naming the key."""
    task, name = config["task"], config["model"]["name"]
    if task not in STAGES:
        raise UserError(f"task must be one of {', '.join(STAGES)} for a diffusion run, got {task!r}")
    if name != STAGES[task]:
        raise UserError(f"model.name must be {STAGES[task]!r} for task {task}, got {name!r}")
    if task == "diffusion_transformer" and not config["diffusion"]["vqae_checkpoint"]:
        raise UserError("diffusion.vqae_checkpoint: stage 2 needs the stage-1 (diffusion_vqae) run folder or "
                        "checkpoint")
    if task == "diffusion_vqae" and config["model"].get("attention") not in (None, "softmax"):
        raise UserError("model.attention: the VQ-AE has no attention (set it on the diffusion_transformer stage)")


def build_vqae(config: dict) -> VQAutoencoder3d:
    """The stage-1 model of ``config`` (its ``model.kwargs``); bad arguments are a UserError naming them."""
    kwargs = config["model"]["kwargs"]
    try:
        return VQAutoencoder3d(**kwargs)
    except (TypeError, ValueError) as error:
        raise UserError(f"model.kwargs {kwargs} do not build the VQ-AE: {error}") from None


def build_transformer(config: dict, vqae: VQAutoencoder3d, volume_shape: tuple[int, ...]) -> AbsorbingTransformer:
    """The stage-2 transformer over the token grid of volumes of ``volume_shape`` encoded by ``vqae``."""
    kwargs = dict(config["model"]["kwargs"])
    unknown = sorted(set(kwargs) - set(TRANSFORMER_KEYS))
    if unknown:
        raise UserError(f"model.kwargs.{unknown[0]}: the absorbing transformer takes {', '.join(TRANSFORMER_KEYS)}")
    grid = tuple(n * vqae.latent_size for n in patch_grid(tuple(volume_shape), vqae.patch_size))
    try:
        return AbsorbingTransformer(grid, vqae.num_codebooks, vqae.codebook_size,
                                    attention=config["model"]["attention"] or "softmax", **kwargs)
    except (TypeError, ValueError) as error:
        raise UserError(f"model.kwargs {kwargs} (attention {config['model']['attention']!r}) do not build the "
                        f"transformer: {error}") from None


def read_meta(folder: Path) -> dict:
    """A diffusion checkpoint's ``checkpoint.json``, checked (config, volume shape, a stage-2 checkpoint's stage-1
    config); a one-line UserError naming the file otherwise. Supervised code reads checkpoints with
    :func:`medattn.runtime.checkpoint.load_meta`, which refuses these."""
    path = Path(folder) / checkpoint.META_FILE
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UserError(f"{path}: unreadable checkpoint metadata ({error})") from None
    info = meta.get("diffusion") if isinstance(meta, dict) else None
    if not isinstance(info, dict) or not isinstance(meta.get("config"), dict):
        raise UserError(f"{path}: not a diffusion checkpoint (train one with task: diffusion_vqae or "
                        f"diffusion_transformer)")
    validate(meta["config"], str(path))
    shape = info.get("volume_shape")
    if not (isinstance(shape, list) and len(shape) == 3 and all(isinstance(n, int) and 0 < n <= 1 << 14
                                                                 for n in shape)):
        raise UserError(f"{path}: diffusion.volume_shape must be three positive sizes, got {shape!r}")
    if meta["config"]["task"] == "diffusion_transformer" and not isinstance(info.get("vqae_config"), dict):
        raise UserError(f"{path}: a diffusion_transformer checkpoint must hold the stage-1 config (vqae_config)")
    if "vqae_config" in info:
        validate(info["vqae_config"], f"{path}: vqae_config")
    return meta


def load_stage(path: str | Path, want_transformer: bool = False) -> tuple[DiffusionModel, dict]:
    """A diffusion checkpoint (run folder, checkpoint folder or its weights file) -> (model in eval mode, meta).

    ``want_transformer``: refuse a stage-1 checkpoint (UserError). Shapes are checked before weights are read.
    """
    if not Path(path).exists():
        raise UserError(f"checkpoint {path} does not exist")
    folder = checkpoint.resolve(path)
    meta = read_meta(folder)
    config, info = meta["config"], meta["diffusion"]
    is_transformer = config["task"] == "diffusion_transformer"
    if want_transformer and not is_transformer:
        raise UserError(f"{folder}: a diffusion_vqae (stage-1) checkpoint; this needs a diffusion_transformer one "
                        f"(or use --method random)")

    def build() -> DiffusionModel:
        vqae = build_vqae(info["vqae_config"] if is_transformer else config)
        transformer = build_transformer(config, vqae, tuple(info["volume_shape"])) if is_transformer else None
        return DiffusionModel(vqae, transformer)

    with torch.device("meta"):
        checkpoint.check_shapes(folder, build())
    model = build()
    model.load_state_dict(checkpoint.load_weights(folder))
    return model.eval(), meta
