"""Foundation-class ViT tile encoders in medattn's own module, from the publisher's weight file, strict, no timm.

The published pathology encoders are timm ``VisionTransformer`` state dicts; :class:`TileViT` has the same parameter
names and shapes, so their files load strictly without timm (which cannot be imported beside a CPU torch), and
the architecture is read from the tensors (:func:`infer_architecture`):

=================  ===========================================================================================
``patch_embed``    ``proj.weight`` (D, 3, p, p): width D and patch side p
``cls_token``      (1, 1, D); ``reg_token`` (1, R, D): R register tokens (Darcet et al. 2024), if present
``pos_embed``      (1, L, D): L = G^2 (the grid only: timm's ``no_embed_class``) or G^2 + 1 + R (the class
                   and register tokens embedded too); the input side is G p
``blocks.i``       depth = the number of blocks; ``attn.qkv`` (3D, D), ``attn.proj``; ``ls1.gamma``,
                   ``ls2.gamma`` (LayerScale) if present; ``mlp.fc1`` (M, D), ``mlp.fc2`` (D, M'): a GELU MLP
                   when M = M', a packed SwiGLU (``silu(x1) * x2`` of fc1's two halves) when M = 2 M'
``norm``           the final LayerNorm (eps 1e-6); a classifier ``head.*`` in the file is dropped
=================  ===========================================================================================

The head count cannot be read from the shapes; it follows the width (:data:`HEADS`: 768 -> 12, 1024 -> 16,
1280 -> 16, 1536 -> 24, the published models' choices). The blocks are medattn's own
(:class:`medattn.models.layers.Block`: LayerNorms at eps 1e-6, LayerScale starting at 1, a GELU or packed SwiGLU
MLP), so any registered mechanism can attend (``attention=``, a name of :func:`medattn.attention.build_attention`).
Every mechanism has timm's ``attn.qkv`` and ``attn.proj`` (q | k | v, heads contiguous in each, as timm splits
them); the default, ``"softmax"``, is timm's attention (PyTorch's fused ``scaled_dot_product_attention``), so the
publisher's embedding comes out. Another mechanism loads the same file: its own tensors (SeqNorm's ``q_norm``,
``k_norm``, ``v_norm``, :meth:`TileViT.mechanism_tensors`) are taken from the file where it has them, else they keep
their initial values (SeqNorm's affines: weight 1, bias 0) and :func:`load_tile_vit` warns, naming them (a softmax
ViT's weights initialising another mechanism, as :func:`medattn.models.convert.convert_attention` does). The output is
the class token after the final norm, or for Virchow2 the class token beside the mean of the patch tokens (registers
left out), as the publishers compute their embeddings.

:data:`~medattn.slides.encoders.ENCODERS` holds the publishers' models, one card each, with what each expects:
width, depth and patch (checked against the file), input side, normalisation, magnification and pooling. This module
is tested against timm's own ``VisionTransformer`` built in each card's layout with random weights, never against
the weights themselves (nothing downloads).
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import torch
from torch import nn

from ..errors import UserError
from ..models.layers import Block
from .encoders import ENCODERS, HEADS, IMAGENET, Architecture, Encoder

__all__ = ["ENCODERS", "HEADS", "IMAGENET", "Architecture", "Encoder", "TileViT", "build", "check_layout",
           "infer_architecture", "load", "load_tile_vit"]


class _PatchEmbed(nn.Module):
    def __init__(self, dim: int, patch: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, dim, patch, stride=patch)


class TileViT(nn.Module):
    """A timm-layout ViT encoder (module docstring): images (B, 3, G p, G p), normalised -> embeddings (B, F),
    F = D (``pooling="cls"``) or 2 D (``"cls+mean"``); its blocks attend by ``attention`` (a registry name of
    :func:`medattn.attention.build_attention`; ``"softmax"``: timm's, the publisher's)."""

    def __init__(self, arch: Architecture, pooling: str = "cls", attention: str = "softmax") -> None:
        super().__init__()
        if pooling not in ("cls", "cls+mean"):
            raise ValueError(f"pooling must be 'cls' or 'cls+mean', got {pooling!r}")
        self.arch, self.pooling, self.attention = arch, pooling, attention
        self.patch_embed = _PatchEmbed(arch.dim, arch.patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, arch.dim))
        if arch.registers:
            self.reg_token = nn.Parameter(torch.zeros(1, arch.registers, arch.dim))
        prefix = 1 + arch.registers
        self.pos_embed = nn.Parameter(torch.zeros(1, arch.grid**2 + (prefix if arch.embed_prefix else 0), arch.dim))
        layer_scale = 1.0 if arch.layer_scale else None
        self.blocks = nn.ModuleList(Block(arch.dim, arch.heads, arch.dim, arch.mlp_hidden, attention,
                                          init_values=layer_scale, norm_eps=1e-6, swiglu=arch.swiglu)
                                    for _ in range(arch.depth))
        self.norm = nn.LayerNorm(arch.dim, eps=1e-6)

    @property
    def input_px(self) -> int:
        return self.arch.input_px

    @property
    def features(self) -> int:
        return self.arch.dim * (2 if self.pooling == "cls+mean" else 1)

    def mechanism_tensors(self) -> list[str]:
        """The state-dict names beyond timm's layout: each block's attention tensors other than ``qkv`` and ``proj``
        (SeqNorm's ``blocks.{i}.attn.{q,k,v}_norm.{weight,bias}``; none for softmax)."""
        return [f"blocks.{i}.attn.{key}" for i, block in enumerate(self.blocks) for key in block.attn.state_dict()
                if not key.startswith(("qkv.", "proj."))]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if tuple(images.shape[-2:]) != (self.arch.input_px,) * 2:
            raise UserError(f"the encoder takes {self.arch.input_px} x {self.arch.input_px} px tiles, got "
                            f"{tuple(images.shape[-2:])}")
        x = self.patch_embed.proj(images).flatten(2).transpose(1, 2)  # (B, G^2, D)
        prefix = [self.cls_token.expand(len(x), -1, -1)]
        if self.arch.registers:
            prefix.append(self.reg_token.expand(len(x), -1, -1))
        if self.arch.embed_prefix:
            x = torch.cat([*prefix, x], dim=1) + self.pos_embed
        else:
            x = torch.cat([*prefix, x + self.pos_embed], dim=1)
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        if self.pooling == "cls":
            return x[:, 0]
        return torch.cat([x[:, 0], x[:, 1 + self.arch.registers:].mean(dim=1)], dim=-1)


def infer_architecture(state: dict[str, torch.Tensor]) -> Architecture:
    """The :class:`Architecture` of a timm-layout ViT state dict (module docstring); UserError when it is not one."""
    try:
        dim, _, patch, _ = state["patch_embed.proj.weight"].shape
        length = state["pos_embed"].shape[1]
        registers = state["reg_token"].shape[1] if "reg_token" in state else 0
        depth = len({key.split(".")[1] for key in state if key.startswith("blocks.")})
        hidden_in, hidden_out = state["blocks.0.mlp.fc1.weight"].shape[0], state["blocks.0.mlp.fc2.weight"].shape[1]
    except (KeyError, ValueError) as error:
        raise UserError(f"not a ViT in timm's layout ({type(error).__name__}: {error})") from None
    if dim not in HEADS:
        raise UserError(f"a ViT of width {dim}: its head count is not known (widths {', '.join(map(str, HEADS))})")
    squares = [prefix for prefix in (0, 1 + registers) if math.isqrt(length - prefix) ** 2 == length - prefix]
    if not squares:
        raise UserError(f"pos_embed of {length} positions is no square grid with or without the "
                        f"{1 + registers} class and register tokens")
    grid, embedded = math.isqrt(length - squares[0]), squares[0] > 0
    if hidden_in not in (hidden_out, 2 * hidden_out):
        raise UserError(f"mlp.fc1 gives {hidden_in} and mlp.fc2 takes {hidden_out}: neither a GELU MLP nor SwiGLU")
    return Architecture(int(dim), depth, HEADS[dim], int(patch), grid, int(registers), embedded, int(hidden_out),
                        hidden_in == 2 * hidden_out, "blocks.0.ls1.gamma" in state)


def check_layout(encoder: Encoder, arch: Architecture, where) -> None:
    """UserError naming ``where`` unless ``arch`` has the card's width, depth, patch and input side (None: any)."""
    expected = {"width": (encoder.dim, arch.dim), "depth": (encoder.depth, arch.depth),
                "patch": (encoder.patch, arch.patch), "input": (encoder.input_px, arch.input_px)}
    wrong = [f"{what} {got} (expected {want})" for what, (want, got) in expected.items() if want not in (None, got)]
    if wrong:
        raise UserError(f"{where}: not the {encoder.name} encoder: {', '.join(wrong)}")


def load_tile_vit(path: Path, name: str | Encoder = "vit", attention: str = "softmax") -> tuple[TileViT, Encoder]:
    """The encoder ``name`` (a card of :data:`ENCODERS` or its name) from its weight file, strictly (classifier tensors
    dropped); its width, depth, patch and input side checked against the card; its blocks attend by ``attention``.
    -> (module in eval mode, its card). A mechanism's own tensors that the file lacks keep their initial values,
    with a warning naming them (module docstring); every tensor of timm's layout must be in the file."""
    from ..models.weights import load_strictly, read_state_dict

    encoder = ENCODERS[name] if isinstance(name, str) else name
    state = {k.removeprefix("module."): v for k, v in read_state_dict(path).items()}
    try:
        arch = infer_architecture(state)
    except UserError as error:
        raise UserError(f"{path}: {error}") from None
    check_layout(encoder, arch, path)
    model = TileViT(arch, encoder.pooling, attention)
    initial = model.state_dict()
    new = [key for key in model.mechanism_tensors() if key not in state]
    load_strictly(model, {**state, **{key: initial[key] for key in new}}, path,
                  f"not a {encoder.name} encoder in timm's layout", drop=("head.", "fc_norm.", "head_drop."))
    if new:
        warnings.warn(f"{path}: {len(new)} tensor(s) of the {attention} attention are not in the file and keep their "
                      f"initial values (e.g. {', '.join(new[:3])})", stacklevel=2)
    return model.eval(), encoder


def build(card: Encoder, attention: str = "softmax") -> TileViT:
    """The card's ViT with fresh weights (:attr:`Encoder.architecture`), its blocks attending by ``attention``, in
    eval mode."""
    if card.architecture is None:
        raise ValueError(f"the {card.name} card leaves the ViT's shape open: nothing to build")
    return TileViT(card.architecture, card.pooling, attention).eval()


def load(card: Encoder, path: Path, attention: str = "softmax") -> TileViT:
    """The card's ViT from ``path``, its blocks attending by ``attention`` (:func:`load_tile_vit`)."""
    return load_tile_vit(path, card, attention)[0]
