"""The tile encoders, one card each: every fact about an encoder is here and nowhere else.

A card (:class:`Encoder`, timm's ``pretrained_cfg`` habit) says which module builds the encoder, its architecture
(for the ViTs: width, depth and patch, checked against the weight file, and the rest of the layout: registers, MLP,
LayerScale, position embedding), its input (side, normalisation, the magnification it was trained at), how its
embedding is pooled, its output width, the precisions ``wsi extract`` runs it in and the timm architecture the
publisher's file is built with. Values come from the publishers' model cards.

Derived from :data:`ENCODERS`, never written again: the ``--extractor NAME:FILE`` kinds
(:mod:`medattn.slides.extractors`) and the option's help (``medattn wsi extract --help``), the encoders ``medattn
bench extract`` times, and the parametrisation of ``tests/slides/test_vit_encoders.py`` and
``tests/slides/test_encoders.py``.

Each card's ``module`` (in ``medattn.slides``) defines ``build(card)``, the encoder with fresh weights, and
``load(card, path)``, the encoder from a weight file read strictly (:func:`medattn.models.weights.load_strictly`);
both return the module in eval mode. The ViTs' (``vit_encoder``) take ``attention`` too: the mechanism their blocks
run (a registry name of :func:`medattn.attention.build_attention`; softmax, the publishers', by default). This module
imports no torch, so the command line's help stays fast.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

#: Heads per width, as the published ViTs choose them (the shapes do not say).
HEADS = {384: 6, 768: 12, 1024: 16, 1280: 16, 1536: 24}
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
#: What ``wsi extract --precision`` offers (:func:`medattn.slides.extractors.with_precision`).
PRECISIONS = ("fp32", "bf16", "int8")


@dataclass(frozen=True)
class Architecture:
    """A timm-layout ViT, as :func:`medattn.slides.vit_encoder.infer_architecture` reads it from a state dict."""

    dim: int
    depth: int
    heads: int
    patch: int
    grid: int
    registers: int
    embed_prefix: bool  # pos_embed covers the class and register tokens (timm's no_embed_class=False)
    mlp_hidden: int
    swiglu: bool
    layer_scale: bool

    @property
    def input_px(self) -> int:
        return self.grid * self.patch


@dataclass(frozen=True)
class Encoder:
    """One tile encoder's card (module docstring).

    ``dim``, ``depth``, ``patch`` and ``input_px`` are checked against a ViT's file (None: any, the file's).
    ``mean``/``std`` normalise x / 255 (None: ``--input-norm`` decides, ImageNet's by default); ``mpp`` is the
    microns per pixel of its training tiles (None: unknown); ``pooling`` is ``"cls"`` or ``"cls+mean"`` (the class
    token beside the mean of the patch tokens); ``features`` the output width (None: the file's).
    ``kind``: an ``--extractor NAME:FILE`` kind; False for a reference layout that is only timed and tested."""

    name: str
    module: str  # in medattn.slides: defines build(card) and load(card, path)
    about: str  # one line for the help: the model and its source
    features: int | None
    dim: int | None = None
    depth: int | None = None
    patch: int | None = None
    registers: int = 0
    mlp_hidden: int | None = None  # fc2's input width (the half of fc1's output for a packed SwiGLU)
    swiglu: bool = False
    layer_scale: bool = False
    embed_prefix: bool = True
    input_px: int | None = 224
    mean: tuple[float, float, float] | None = IMAGENET[0]
    std: tuple[float, float, float] | None = IMAGENET[1]
    mpp: float | None = 0.5
    pooling: str = "cls"
    precisions: tuple[str, ...] = PRECISIONS
    timm: str | None = None  # timm's architecture of the publisher's file (its model card)
    kind: bool = True

    @property
    def architecture(self) -> Architecture | None:
        """The full ViT layout (bench, tests); None for another module or a card that leaves the shape open."""
        if self.module != "vit_encoder" or None in (self.dim, self.depth, self.patch, self.mlp_hidden, self.input_px):
            return None
        return Architecture(self.dim, self.depth, HEADS[self.dim], self.patch, self.input_px // self.patch,
                            self.registers, self.embed_prefix, self.mlp_hidden, self.swiglu, self.layer_scale)

    @property
    def buildable(self) -> bool:
        """Whether :meth:`build` knows the whole architecture (a ViT card that leaves its shape open does not)."""
        return self.module != "vit_encoder" or self.architecture is not None

    def build(self, attention: str = "softmax"):
        """The encoder with fresh (random) weights, in eval mode; a ViT's blocks attend by ``attention``."""
        return importlib.import_module(f"medattn.slides.{self.module}").build(self, **self._attention(attention))

    def load(self, path, attention: str = "softmax"):
        """The encoder from the weight file ``path``, strictly, in eval mode; a ViT's blocks attend by ``attention``
        (:func:`medattn.slides.vit_encoder.load_tile_vit`); UserError naming ``path``."""
        return importlib.import_module(f"medattn.slides.{self.module}").load(self, path, **self._attention(attention))

    def _attention(self, attention: str) -> dict:
        """The ``attention`` keyword for the module's build/load: only the ViTs choose; the others run softmax."""
        if self.module == "vit_encoder":
            return {"attention": attention}
        if attention != "softmax":
            raise ValueError(f"the {self.name} encoder runs its own softmax attention, not {attention!r}")
        return {}


def _vit(name: str, about: str, dim: int, depth: int, patch: int, mlp_hidden: int, timm: str, **facts) -> Encoder:
    pooling = facts.get("pooling", "cls")
    return Encoder(name, "vit_encoder", about, dim * (2 if pooling == "cls+mean" else 1), dim, depth, patch,
                   mlp_hidden=mlp_hidden, timm=timm, **facts)


_SWIGLU = {"swiglu": True, "layer_scale": True}

#: name -> card. Order: the help's and the bench's.
ENCODERS: dict[str, Encoder] = {card.name: card for card in (
    Encoder("vit", "vit_encoder", "any timm-layout ViT, its shape read from the file", None, input_px=None, mpp=None),
    _vit("vit-b16", "ViT-B/16, timm's layout: the reference of vit:FILE, timed and tested only", 768, 12, 16, 3072,
         "vit_base_patch16_224", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), mpp=None, kind=False),
    _vit("uni", "UNI, Chen et al. 2024, ViT-L/16", 1024, 24, 16, 4096, "vit_large_patch16_224", layer_scale=True),
    _vit("uni2-h", "UNI2-h, ViT-H/14, 8 registers, SwiGLU", 1536, 24, 14, 4096, "vit_giant_patch14_224",
         registers=8, embed_prefix=False, **_SWIGLU),
    _vit("virchow2", "Virchow2, Zimmermann et al. 2024, ViT-H/14, 4 registers, SwiGLU", 1280, 32, 14, 3416,
         "vit_huge_patch14_224", registers=4, pooling="cls+mean", **_SWIGLU),
    _vit("h-optimus-0", "H-optimus-0, ViT-g/14, 4 registers", 1536, 40, 14, 4096, "vit_giant_patch14_reg4_dinov2",
         registers=4, embed_prefix=False, mean=(0.707223, 0.578729, 0.703617), std=(0.211883, 0.230117, 0.177517),
         **_SWIGLU),
    _vit("prov-gigapath", "Prov-GigaPath's tile encoder, Xu et al. 2024, ViT-g/14", 1536, 40, 14, 4096,
         "vit_giant_patch14_dinov2", **_SWIGLU),
    # STAMP cuts CTransPath's tiles at 256 um per 224 px; its paper states 20x.
    Encoder("ctranspath", "ctranspath", "CTransPath, Wang et al. 2022, Swin-T with a convolutional stem", 768,
            mpp=256 / 224),
    Encoder("resnet50", "resnet", "ResNet-50 in torchvision's layout: ImageNet, RetCCL", 2048, input_px=None,
            mean=None, std=None, mpp=None, precisions=("fp32",)),
)}


def extractor_kinds() -> list[str]:
    """The encoders ``--extractor NAME:FILE`` takes, in the registry's order."""
    return [name for name, card in ENCODERS.items() if card.kind]


def transformers() -> list[str]:
    """The extractor kinds that run in lower precisions (bf16, int8) too."""
    return [name for name in extractor_kinds() if len(ENCODERS[name].precisions) > 1]


def extractor_help() -> str:
    """The help of ``wsi extract --extractor``, from the cards."""
    encoders = ", ".join(f"{name}:FILE ({ENCODERS[name].about})" for name in extractor_kinds())
    return ("descriptor (default), a FILE (state dict, TorchScript, .onnx; its kind detected), torchscript:FILE, "
            f"onnx:FILE, timm:MODEL_NAME:FILE (where timm is installed), or a tile encoder: {encoders}")
