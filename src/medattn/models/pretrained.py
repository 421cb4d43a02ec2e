"""Start a :class:`~medattn.models.vit.VisionTransformer` from another code base's pretrained weights, offline.

``load_pretrained(model, source, family=None)`` reads a weights file the user already has (nothing
downloads), recognises the family, maps its names onto ours, adapts what needs adapting and copies the
rest bit for bit. It returns a report a run can print: ``loaded`` (copied unchanged), ``adapted`` (see
``how``), ``new`` (our tensors that keep their fresh initialisation) and ``dropped`` (the file's tensors
the model has no place for, by their names in the file).

Files (read by :func:`medattn.models.weights.read_state_dict`): ``.safetensors``, or a PyTorch file read with
``torch.load(weights_only=True)`` (no code runs; anything but tensors and plain containers is refused). A training
checkpoint's state dict is found under ``state_dict``, ``model`` (MAE), ``teacher`` or ``student`` (DINO); a
``module.`` prefix (DDP) is removed, and with a ``backbone.`` prefix (DINO) only the backbone is used.

Families (all store timm's block layout; our attention keeps it, see :mod:`medattn.models.convert`):

=========  =====================================================================================
``timm``   ``cls_token`` (1, 1, D), ``pos_embed`` (1, 1 + N, D) (or (1, N, D) without a class
           position), ``patch_embed.proj.{weight,bias}`` (D, 3, p, p), ``blocks.{i}.norm1``,
           ``.attn.qkv``, ``.attn.proj``, ``.norm2``, ``.mlp.fc1``, ``.mlp.fc2`` (optional layer scale
           ``.ls1.gamma``/``.ls2.gamma``), ``norm``, ``head``
``dino``   timm's names without a head (DINO); DINOv2 adds ``mask_token`` (1, D) and layer scale
``mae``    timm's names plus the decoder (``decoder_*``, ``mask_token``), which is dropped
``monai``  ``monai.networks.nets.ViT``: ``patch_embedding.patch_embeddings`` (conv), ``patch_embedding.
           position_embeddings`` (1, N, D) (no class position), ``blocks.{i}.attn.out_proj``, ``.mlp.linear1``,
           ``.mlp.linear2``, ``norm_cross_attn`` (unused, dropped), ``classification_head.0``
=========  =====================================================================================

Adaptations, each listed in the report:

* position embeddings are interpolated from the file's grid to the model's (bicubic in 2D, trilinear in
  3D, as the model does at run time; the class token's position is kept). Without a class position in the
  file (MONAI, timm ``no_embed_class``) the class token gets position zero, which is what those models do.
  The file's grid is the square (cube) root of its number of positions unless ``source_grid`` is given;
* the patch embedding's input channels: to 1 channel by summing the kernels over the file's channels (a
  grey image then gives what the RGB model gave for the grey image repeated in R, G and B); to other
  counts by repeating the channels cyclically and scaling by ``C_file / C`` (timm's rule);
* another patch size: the kernel is resized with bilinear (2D) or trilinear (3D) interpolation
  (``align_corners=False``) and scaled by the ratio of the patch areas (volumes), so a constant patch
  keeps its embedding. Exact for the mean, approximate for texture;
* layer scale ``gamma`` is folded into the layer before it (``proj``, ``fc2``): ``gamma * (W x + b)``;
* a missing qkv bias (MONAI's default, ``qkv_bias=False``) becomes a zero bias.

What to keep (``keep``; default the model's ``pretrained_keep`` attribute, else everything): ``"all"``,
``"binaryformer"`` (:data:`BINARYFORMER_KEEP`: the patch embedding, the class token and positions, and the
MLPs of blocks 0-3 with their pre-norms, as BinaryFormer's App. A.1 fine-tunes DINO's ViT-S/8; every
attention, ``norm1``, the MLPs of blocks 4 and later and the final norm keep their fresh initialisation),
or a list of glob patterns (:mod:`fnmatch`) on timm's names. A tensor the choice leaves out is reported
under ``new`` and ``not_kept`` (ours) and ``dropped`` (the file's); its shape is not checked.

A head of another shape (ImageNet's 1000 classes) is dropped and ours is new. Attention tensors that only
our mechanism has (e.g. SeqNorm's ``q_norm``) are new, so the weights load into a model of any mechanism.
What the state dict cannot show must be set to match by the user: ``num_heads`` (6 for ViT-S, 12 for
ViT-B), and the file's input normalisation (e.g. ImageNet mean/std). Our LayerNorms use eps 1e-5 (timm,
DINO and MAE 1e-6, MONAI 1e-5). A block, width or patch-dimension mismatch is a one-line UserError naming
the tensor; nothing is written to the model before every tensor has been checked.
"""

from __future__ import annotations

import fnmatch
import math
import re
from pathlib import Path

import torch
import torch.nn.functional as F

from medattn.errors import UserError

from .layers import ConvStem
from .resnet import ResidualStem
from .vit import VisionTransformer, resample_position_embedding
from .weights import read_state_dict

FAMILIES = ("timm", "dino", "mae", "monai")
MONAI_NAMES = [  # MONAI name -> timm name
    (re.compile(r"^patch_embedding\.patch_embeddings\.(weight|bias)$"), r"patch_embed.proj.\1"),
    (re.compile(r"^patch_embedding\.position_embeddings$"), "pos_embed"),
    (re.compile(r"^blocks\.(\d+)\.attn\.out_proj\.(weight|bias)$"), r"blocks.\1.attn.proj.\2"),
    (re.compile(r"^blocks\.(\d+)\.mlp\.linear([12])\.(weight|bias)$"), r"blocks.\1.mlp.fc\2.\3"),
    (re.compile(r"^classification_head(?:\.0)?\.(weight|bias)$"), r"head.\1"),
]
REQUIRED = re.compile(r"^(patch_embed\.proj\.weight|blocks\.\d+\.(norm[12]\.(weight|bias)|attn\.qkv\.weight|"
                      r"attn\.proj\.(weight|bias)|mlp\.fc[12]\.(weight|bias)))$")
DROPPABLE = re.compile(r"^(decoder_.*|mask_token|head\..*|head_dist\..*|fc_norm\..*|reg_token|register_tokens|"
                       r"blocks\.\d+\.norm_cross_attn\..*)$")
LAYER_SCALE = re.compile(r"^blocks\.(\d+)\.ls([12])\.gamma$")
# BinaryFormer App. A.1: keep the patch embedding and the MLPs of blocks 0-3 (timm's names; the pre-norm of
# an MLP belongs to it, and the positions and class token to the embedding); re-initialise the rest.
BINARYFORMER_KEEP = ("patch_embed.*", "pos_embed", "cls_token", "blocks.[0-3].norm2.*", "blocks.[0-3].mlp.*")
KEEP_CHOICES = {"all": None, "binaryformer": BINARYFORMER_KEEP}


def check_keep(keep) -> str | list[str] | None:
    """``keep`` unchanged if it is None, a name of :data:`KEEP_CHOICES` or a non-empty list of glob
    patterns; UserError (a ValueError) otherwise."""
    if keep is None or (isinstance(keep, str) and keep in KEEP_CHOICES):
        return keep
    if isinstance(keep, (list, tuple)) and keep and all(isinstance(p, str) and p for p in keep):
        return list(keep)
    raise UserError(f"pretrained_keep must be one of {', '.join(KEEP_CHOICES)} or a list of glob patterns on "
                     f"timm's tensor names, got {keep!r}")


def keep_patterns(keep) -> tuple[str, ...] | None:
    """Glob patterns of the tensors to keep, None for all (``keep`` as :func:`check_keep` accepts it)."""
    keep = check_keep(keep)
    return KEEP_CHOICES[keep] if isinstance(keep, str) else None if keep is None else tuple(keep)


def load_pretrained(model: VisionTransformer, source, family: str | None = None,
                    source_grid: tuple[int, ...] | None = None, keep=None) -> dict:
    """Copy pretrained weights (a path or a state dict) into ``model``; returns the report (module docstring).

    ``family`` (one of :data:`FAMILIES`) is detected from the names when None. ``source_grid`` is the
    file's patch grid when it is not a square (2D) or cube (3D). ``keep`` (see the module docstring)
    defaults to ``model.pretrained_keep`` where the model has one, else everything.
    """
    if not isinstance(model, VisionTransformer):
        raise UserError(f"pretrained ViT weights load into a VisionTransformer, not a {type(model).__name__}")
    where = str(source) if isinstance(source, (str, Path)) else "the state dict"
    state = read_state_dict(source)
    from_dino = any(k.startswith("backbone.") for k in state)
    state, dropped = _strip_prefixes(state)
    family = _check_family(state, family, where, from_dino)
    state, origin, how = _to_timm_names(state, family, where)
    patterns = keep_patterns(getattr(model, "pretrained_keep", None) if keep is None else keep)
    tensors, report = _match(model, state, origin, how, where, source_grid, patterns)
    with torch.no_grad():
        own = model.state_dict()
        for key, tensor in tensors.items():
            own[key].copy_(tensor)
    report["dropped"] = dropped + report["dropped"]
    return {"family": family, **report}


def describe(report: dict) -> str:
    """One line for a run's log: counts, each adaptation, and the new and dropped tensors by name."""
    adapted = "; ".join(f"{k}: {how}" for k, how in report["how"].items())
    return (f"{report['family']} weights: {len(report['loaded'])} tensor(s) loaded, {len(report['adapted'])} adapted"
            + (f" ({adapted})" if adapted else "") + f", {len(report['new'])} new"
            + (f" ({', '.join(report['new'])})" if report["new"] else "")
            + (f" of which {len(report['not_kept'])} left out by the keep choice" if report.get("not_kept") else "")
            + f", {len(report['dropped'])} dropped"
            + (f" ({', '.join(report['dropped'])})" if report["dropped"] else ""))


def _strip_prefixes(state: dict) -> tuple[dict, list[str]]:
    """Remove DDP's ``module.``; keep only a DINO checkpoint's ``backbone.`` (its projection head is dropped)."""
    if all(k.startswith("module.") for k in state):
        state = {k.removeprefix("module."): v for k, v in state.items()}
    if any(k.startswith("backbone.") for k in state):
        dropped = [k for k in state if not k.startswith("backbone.")]
        return {k.removeprefix("backbone."): v for k, v in state.items() if k.startswith("backbone.")}, dropped
    return state, []


def _check_family(state: dict, family: str | None, where: str, from_dino: bool) -> str:
    layout = ("monai" if "patch_embedding.patch_embeddings.weight" in state
              else "timm" if "patch_embed.proj.weight" in state else None)
    if layout is None:
        extra = (" (MONAI's proj_type='perceptron' is not supported; use 'conv')"
                 if "patch_embedding.patch_embeddings.1.weight" in state else "")
        raise UserError(f"{where}: not recognised as timm, DINO, MAE or MONAI ViT weights: no "
                        f"patch_embed.proj.weight or patch_embedding.patch_embeddings.weight{extra}")
    if family is None:
        if layout == "monai":
            return "monai"
        if any(k.startswith("decoder_") for k in state):
            return "mae"
        return "dino" if from_dino or "mask_token" in state else "timm"
    if family not in FAMILIES:
        raise UserError(f"family: unknown {family!r}; available: {', '.join(FAMILIES)}")
    if (family == "monai") != (layout == "monai"):
        raise UserError(f"{where}: family {family!r} does not match the names in the weights ({layout}'s layout)")
    return family


def _to_timm_names(state: dict, family: str, where: str) -> tuple[dict, dict, dict]:
    """The state dict in timm's names with layer scale folded and a class position in ``pos_embed``.

    Returns (state, origin: timm name -> the file's name, how: timm name -> adaptation made here)."""
    origin, how, out = {}, {}, {}
    for key, tensor in state.items():
        new = key
        if family == "monai":
            for pattern, repl in MONAI_NAMES:
                new = pattern.sub(repl, new)
        out[new], origin[new] = tensor, key
    pos = out.get("pos_embed")
    if pos is not None and not _has_class_position(pos, out["patch_embed.proj.weight"].ndim - 2, family):
        out["pos_embed"] = torch.cat([pos.new_zeros(1, 1, pos.shape[-1]), pos], dim=1)
        how["pos_embed"] = "class-token position set to zero (the file has none)"
    for key in [k for k in out if LAYER_SCALE.match(k)]:
        block, which = LAYER_SCALE.match(key).groups()
        gamma, layer = out.pop(key), f"blocks.{block}." + ("attn.proj" if which == "1" else "mlp.fc2")
        for kind in ("weight", "bias"):
            name = f"{layer}.{kind}"
            if name in out:
                if out[name].shape[0] != gamma.shape[0]:
                    raise UserError(f"{where}: {key} has shape {list(gamma.shape)}, {origin[name]} "
                                    f"{list(out[name].shape)}")
                out[name] = out[name] * (gamma[:, None] if kind == "weight" else gamma)
                how[name] = f"layer scale {origin[key]} folded in"
    return out, origin, how


def _has_class_position(pos: torch.Tensor, spatial_dims: int, family: str) -> bool:
    """Whether ``pos_embed`` (1, P, D) holds a class position first: never for MONAI; for timm's layout,
    when P - 1 and not P is a square (cube)."""
    return family != "monai" and not _is_power(pos.shape[1], spatial_dims)


def _is_power(n: int, k: int) -> bool:
    """Whether n = r**k for an integer r (float roots checked on their neighbours)."""
    root = round(n ** (1 / k))
    return any((root + d) ** k == n for d in (-1, 0, 1))


def _our_name_in_timm(key: str) -> str:
    """Our state-dict name -> timm's: ``encoder.`` dropped, ``patch_embed.*`` -> ``patch_embed.proj.*``."""
    if key.startswith("encoder."):
        return key.removeprefix("encoder.")
    if key.startswith("patch_embed."):
        return "patch_embed.proj." + key.removeprefix("patch_embed.")
    return key


def _match(model: VisionTransformer, state: dict, origin: dict, how: dict, where: str,
           source_grid: tuple[int, ...] | None, keep: tuple[str, ...] | None = None) -> tuple[dict, dict]:
    """Our name -> the tensor to copy in, and the report's lists; raises before anything is copied.
    With ``keep`` (glob patterns on timm's names) only matching tensors of the file are used."""
    if isinstance(model.patch_embed, (ConvStem, ResidualStem)) and "patch_embed.proj.weight" in state:
        raise UserError(f"{where}: holds a patch embedding, but the model starts with a convolutional stem "
                        f"({type(model.patch_embed).__name__}, as the _small presets do); set model.kwargs.stem=patch "
                        f"to load it")
    own = model.state_dict()
    tensors, used = {}, set()
    report = {"loaded": [], "adapted": [], "new": [], "dropped": [], "not_kept": [], "how": {}}
    left_out = set() if keep is None else {n for n in state if not any(fnmatch.fnmatchcase(n, p) for p in keep)}
    for key, target in own.items():
        name = _our_name_in_timm(key)
        if name in left_out:
            report["new"].append(key)
            report["not_kept"].append(key)
            continue
        if name not in state:
            if name.endswith("attn.qkv.bias") and name.replace("bias", "weight") in state:
                tensors[key] = torch.zeros_like(target)
                report["adapted"].append(key)
                report["how"][key] = "zero (the file's qkv has no bias)"
            elif REQUIRED.match(name):
                raise UserError(f"{where}: has no tensor for the model's {key} ({_depths(state, own)})")
            else:
                report["new"].append(key)
            continue
        tensor, notes = state[name], [how[name]] if name in how else []
        if name == "patch_embed.proj.weight":
            tensor = _adapt_patch_kernel(tensor, tuple(target.shape), origin[name], where)
            notes += _kernel_notes(state[name].shape, target.shape)
        elif name == "pos_embed":
            tensor = _adapt_position_embedding(tensor, model, origin[name], where, source_grid)
            if tensor is not state[name]:
                notes.append(f"interpolated from {list(state[name].shape)} to {list(target.shape)}")
        elif name.startswith("head.") and tensor.shape != target.shape:
            report["new"].append(key)
            continue
        elif tensor.shape != target.shape:
            raise UserError(f"{where}: tensor {origin[name]} has shape {list(tensor.shape)}, the model's {key} "
                            f"expects {list(target.shape)} (set model.kwargs embed_dim, attn_dim, mlp_dim, "
                            f"num_classes to the pretrained model's)")
        used.add(name)
        tensors[key] = tensor
        report["adapted" if notes else "loaded"].append(key)
        if notes:
            report["how"][key] = "; ".join(notes)
    report["dropped"] += [origin[n] for n in state if n in left_out]
    for name in state:
        if name in used or name in left_out:
            continue
        if not DROPPABLE.match(name):
            raise UserError(f"{where}: tensor {origin[name]} has no place in the model ({_depths(state, own)})")
        report["dropped"].append(origin[name])
    return tensors, report


def _depths(state: dict, own: dict) -> str:
    def count(keys, prefix):
        return len({k.split(".")[prefix.count(".")] for k in keys if k.startswith(prefix)})

    return (f"the weights have {count(state, 'blocks.')} blocks, the model {count(own, 'encoder.blocks.')}; "
            f"set model.kwargs.depth to match")


def _adapt_patch_kernel(weight: torch.Tensor, shape: tuple[int, ...], name: str, where: str) -> torch.Tensor:
    """(D, C_file, *p_file) -> ``shape`` = (D, C, *p): channels summed or repeated, kernel resized (module doc)."""
    D, C, *patch = shape
    if weight.ndim != len(shape) or weight.shape[0] != D:
        raise UserError(f"{where}: tensor {name} has shape {list(weight.shape)}, the model's patch_embed.weight "
                        f"expects {list(shape)} (embed_dim and the number of spatial axes must match)")
    c_file, patch_file = weight.shape[1], tuple(weight.shape[2:])
    if c_file != C:
        if C == 1:
            weight = weight.sum(dim=1, keepdim=True)  # (D, 1, *p_file)
        else:
            weight = weight.repeat(1, math.ceil(C / c_file), *(1,) * len(patch))[:, :C] * (c_file / C)
    if patch_file != tuple(patch):
        mode = "bilinear" if len(patch) == 2 else "trilinear"
        resized = F.interpolate(weight.float(), size=tuple(patch), mode=mode, align_corners=False)
        weight = (resized * (math.prod(patch_file) / math.prod(patch))).to(weight.dtype)
    return weight


def _kernel_notes(file_shape: torch.Size, shape: torch.Size) -> list[str]:
    notes = []
    if file_shape[1] != shape[1]:
        notes.append(f"input channels {file_shape[1]} -> {shape[1]} "
                     + ("(kernels summed)" if shape[1] == 1 else f"(repeated, scaled by {file_shape[1]}/{shape[1]})"))
    if file_shape[2:] != shape[2:]:
        notes.append(f"patch {list(file_shape[2:])} -> {list(shape[2:])} (kernel resized, scaled by the area ratio)")
    return notes


def _adapt_position_embedding(pos: torch.Tensor, model: VisionTransformer, name: str, where: str,
                              source_grid: tuple[int, ...] | None) -> torch.Tensor:
    """(1, 1 + N_file, D) -> (1, 1 + N, D) on the model's grid; the file's grid as in the module docstring."""
    dims, n = model.spatial_dims, pos.shape[1] - 1
    if pos.ndim != 3 or pos.shape[-1] != model.embed_dim:
        raise UserError(f"{where}: tensor {name} has shape {list(pos.shape)}, the model's pos_embed expects "
                        f"[1, N, {model.embed_dim}]")
    if source_grid is None:
        side = round(n ** (1 / dims))
        if side**dims != n:
            raise UserError(f"{where}: {name} holds {n} patch positions, not a {'square' if dims == 2 else 'cube'}; "
                            f"give source_grid")
        source_grid = (side,) * dims
    if math.prod(source_grid) != n or len(source_grid) != dims:
        raise UserError(f"{where}: source_grid {list(source_grid)} does not hold the {n} positions of {name}")
    if tuple(source_grid) == model.grid_size:
        return pos
    return resample_position_embedding(pos.float(), tuple(source_grid), model.grid_size).to(pos.dtype)
