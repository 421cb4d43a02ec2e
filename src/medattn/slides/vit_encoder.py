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
1280 -> 16, 1536 -> 24, the published models' choices). Attention runs in PyTorch's fused
``scaled_dot_product_attention``. The output is the class token after the final norm, or for Virchow2 the class
token beside the mean of the patch tokens (registers left out), as the publishers compute their embeddings.

:data:`~medattn.slides.encoders.ENCODERS` holds the publishers' models, one card each, with what each expects:
width, depth and patch (checked against the file), input side, normalisation, magnification and pooling. This module
is tested against timm's own ``VisionTransformer`` built in each card's layout with random weights, never against
the weights themselves (nothing downloads).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UserError
from .encoders import ENCODERS, HEADS, IMAGENET, Architecture, Encoder

__all__ = ["ENCODERS", "HEADS", "IMAGENET", "Architecture", "Encoder", "TileViT", "build", "check_layout",
           "infer_architecture", "load", "load_tile_vit"]

class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, D))


class _LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class _Mlp(nn.Module):
    """GELU MLP, or timm's packed SwiGLU: ``fc2(silu(x1) * x2)`` with ``x1, x2`` the halves of ``fc1(x)``."""

    def __init__(self, dim: int, hidden: int, swiglu: bool) -> None:
        super().__init__()
        self.swiglu = swiglu
        self.fc1 = nn.Linear(dim, 2 * hidden if swiglu else hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc1(x)
        if self.swiglu:
            gate, value = x.chunk(2, dim=-1)
            return self.fc2(F.silu(gate) * value)
        return self.fc2(F.gelu(x))


class _Block(nn.Module):
    def __init__(self, arch: Architecture) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(arch.dim, eps=1e-6)
        self.attn = _Attention(arch.dim, arch.heads)
        self.ls1 = _LayerScale(arch.dim) if arch.layer_scale else nn.Identity()
        self.norm2 = nn.LayerNorm(arch.dim, eps=1e-6)
        self.mlp = _Mlp(arch.dim, arch.mlp_hidden, arch.swiglu)
        self.ls2 = _LayerScale(arch.dim) if arch.layer_scale else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.ls1(self.attn(self.norm1(x)))
        return x + self.ls2(self.mlp(self.norm2(x)))


class _PatchEmbed(nn.Module):
    def __init__(self, dim: int, patch: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, dim, patch, stride=patch)


class TileViT(nn.Module):
    """A timm-layout ViT encoder (module docstring): images (B, 3, G p, G p), normalised -> embeddings (B, F),
    F = D (``pooling="cls"``) or 2 D (``"cls+mean"``)."""

    def __init__(self, arch: Architecture, pooling: str = "cls") -> None:
        super().__init__()
        if pooling not in ("cls", "cls+mean"):
            raise ValueError(f"pooling must be 'cls' or 'cls+mean', got {pooling!r}")
        self.arch, self.pooling = arch, pooling
        self.patch_embed = _PatchEmbed(arch.dim, arch.patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, arch.dim))
        if arch.registers:
            self.reg_token = nn.Parameter(torch.zeros(1, arch.registers, arch.dim))
        prefix = 1 + arch.registers
        self.pos_embed = nn.Parameter(torch.zeros(1, arch.grid**2 + (prefix if arch.embed_prefix else 0), arch.dim))
        self.blocks = nn.ModuleList(_Block(arch) for _ in range(arch.depth))
        self.norm = nn.LayerNorm(arch.dim, eps=1e-6)

    @property
    def input_px(self) -> int:
        return self.arch.input_px

    @property
    def features(self) -> int:
        return self.arch.dim * (2 if self.pooling == "cls+mean" else 1)

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


def load_tile_vit(path: Path, name: str | Encoder = "vit") -> tuple[TileViT, Encoder]:
    """The encoder ``name`` (a card of :data:`ENCODERS` or its name) from its weight file, strictly (classifier tensors
    dropped); its width, depth, patch and input side checked against the card. -> (module in eval mode, its card)."""
    from ..models.weights import load_strictly, read_state_dict

    encoder = ENCODERS[name] if isinstance(name, str) else name
    state = {k.removeprefix("module."): v for k, v in read_state_dict(path).items()}
    try:
        arch = infer_architecture(state)
    except UserError as error:
        raise UserError(f"{path}: {error}") from None
    check_layout(encoder, arch, path)
    model = TileViT(arch, encoder.pooling)
    load_strictly(model, state, path, f"not a {encoder.name} encoder in timm's layout",
                  drop=("head.", "fc_norm.", "head_drop."))
    return model.eval(), encoder


def build(card: Encoder) -> TileViT:
    """The card's ViT with fresh weights (:attr:`Encoder.architecture`), in eval mode."""
    if card.architecture is None:
        raise ValueError(f"the {card.name} card leaves the ViT's shape open: nothing to build")
    return TileViT(card.architecture, card.pooling).eval()


def load(card: Encoder, path: Path) -> TileViT:
    """The card's ViT from ``path`` (:func:`load_tile_vit`)."""
    return load_tile_vit(path, card)[0]
