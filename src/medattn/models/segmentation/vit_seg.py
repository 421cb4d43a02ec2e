"""ViT-S/8 with a convolutional decoder for 2D semantic segmentation (Heinrich, BinaryFormer, §3.1 and App. A.1).

Encoder: the ViT of :class:`medattn.models.vit.VisionTransformer` (patch embedding, class token, learned
positions, ``depth`` pre-norm blocks with any registered attention, final LayerNorm); the paper's setting
is DINO's ViT-S/8: 12 blocks, D = 384, 6 heads, 8 x 8 patches, MLP 1536, with the value width narrowed
from 64 to 16 per head (``value_dim=16``, the mechanism's ``value_dim``). The class token is dropped after
the encoder; the N = (H/8)(W/8) patch tokens form a (B, D, H/8, W/8) map.

Decoder (App. A.1; the layer details are our reading, see docs/decisions.md), with ``w = decoder_dim``
(1024 in the paper) and one up-sampling block per factor 2 of the patch size (three for 8 x 8 patches)::

    expand   1x1 conv D -> w, GELU                                                  (B, w, H/8, W/8)
    up_i     h = GELU(BN(ConvTranspose(c -> c/2, kernel 2, stride 2)(x)))           (B, c/2, 2 h_i, 2 w_i)
             h + PixelShuffle(1x1 conv (2c -> 2c)(PixelUnshuffle(h)))               same shape
    refine   3x3 conv w/8 -> w/8, BatchNorm, GELU; 3x3 conv w/8 -> num_classes      (B, K, H, W)

The residual part of each up-sampling block mixes channels only inside each non-overlapping 2 x 2 cell
(unshuffle, 1 x 1 convolution, shuffle back), so the decoder learns local patch detail while the
long-range work stays in the transformer; the two 3 x 3 convolutions at full resolution reduce block
artefacts. With the paper's widths this gives 19.3M encoder (at 320 x 320; 19.0M at 224) and 8.8M
decoder parameters (4 classes; :func:`parameter_counts`; the paper: "19M and 8M").

Which pretrained tensors an initialisation keeps is ``pretrained_keep`` (read by
:func:`medattn.models.pretrained.load_pretrained`): ``"binaryformer"`` keeps the patch embedding, the
positions and the MLPs of blocks 0-3 and re-initialises every attention and the MLPs of blocks 4-11,
as the paper does; ``"all"`` keeps every tensor that fits; a list gives glob patterns on timm's names.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..pretrained import check_keep
from ..vit import VisionTransformer


class CellMix(nn.Module):
    """``h + PixelShuffle(conv1x1(PixelUnshuffle(h)))``: (B, C, H, W) -> (B, C, H, W), H and W even.

    The 1 x 1 convolution acts on the 4C channels of each 2 x 2 cell, so every output pixel depends only
    on the pixels of its own cell.
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.unshuffle = nn.PixelUnshuffle(2)
        self.mix = nn.Conv2d(4 * channels, 4 * channels, kernel_size=1)
        self.shuffle = nn.PixelShuffle(2)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.shuffle(self.mix(self.unshuffle(h)))  # (B, C, H, W)


class UpBlock(nn.Module):
    """Stride-2 transposed convolution ``in -> out`` channels, BatchNorm, GELU, then :class:`CellMix`:
    (B, in, H, W) -> (B, out, 2H, 2W)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(in_channels, out_channels, kernel_size=2, stride=2, bias=False)
        self.norm = nn.BatchNorm2d(out_channels)
        self.act = nn.GELU()
        self.cells = CellMix(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cells(self.act(self.norm(self.up(x))))


class ConvDecoder(nn.Module):
    """(B, embed_dim, h, w) token map -> (B, num_classes, 2^n h, 2^n w) logits, n = ``num_up`` blocks.

    Widths: ``width`` after the 1 x 1 expansion, halved by each up-sampling block (module docstring).
    """

    def __init__(self, embed_dim: int, num_classes: int, width: int = 1024, num_up: int = 3) -> None:
        super().__init__()
        if width % 2**num_up:
            raise ValueError(f"decoder_dim {width} must be divisible by 2^{num_up} (halved at each up-sampling)")
        # no norm here: it would cancel the encoder's final LayerNorm shift, leaving that bias without a gradient
        self.expand = nn.Sequential(nn.Conv2d(embed_dim, width, kernel_size=1), nn.GELU())
        self.ups = nn.Sequential(*[UpBlock(width // 2**i, width // 2 ** (i + 1)) for i in range(num_up)])
        last = width // 2**num_up
        self.refine = nn.Sequential(nn.Conv2d(last, last, kernel_size=3, padding=1, bias=False), nn.BatchNorm2d(last),
                                    nn.GELU(), nn.Conv2d(last, num_classes, kernel_size=3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.refine(self.ups(self.expand(x)))


class SegmentationViT(VisionTransformer):
    """2D ViT encoder + convolutional decoder: (B, C, H, W) -> (B, num_classes, H, W) logits; volumes
    (B, C, H, W, S) are segmented slice by slice along their last axis (how 2D-trained models are scored
    per patient, :mod:`medattn.data.kinds.slices`).

    H and W must be multiples of the patch size (positions are interpolated for sizes other than
    ``img_size``). ``num_classes`` counts the background.

    Args (besides :class:`VisionTransformer`'s ``img_size``, ``in_chans``, ``embed_dim``, ``depth``,
    ``num_heads``, ``attn_dim``, ``mlp_dim``, ``attention``, ``attention_kwargs``, ``qkv_bias``,
    ``drop_rate``, ``attn_drop_rate``):
        patch_size: square patch side, a power of two (one up-sampling block per factor 2).
        value_dim: per-head value width D_v of the attention (None: the head width); the paper: 16.
        decoder_dim: channels after the decoder's expansion (the paper: 1024).
        pretrained_keep: which pretrained tensors an initialisation keeps (module docstring).

    No classification head is built. The model never looks at the mechanism's name: any registered
    attention (binary ones included) plugs in through ``attention``.
    """

    def __init__(self, img_size=224, patch_size: int = 8, in_chans: int = 1, num_classes: int = 2,
                 embed_dim: int = 384, depth: int = 12, num_heads: int = 6, attn_dim: int | None = None,
                 mlp_dim: int = 1536, value_dim: int | None = None, attention: str = "softmax",
                 attention_kwargs: dict | None = None, qkv_bias: bool = True, drop_rate: float = 0.0,
                 attn_drop_rate: float = 0.0, decoder_dim: int = 1024,
                 pretrained_keep: str | list[str] | None = "all") -> None:
        if not isinstance(patch_size, int) or patch_size < 2 or patch_size & (patch_size - 1):
            raise ValueError(f"patch_size must be a power of two >= 2 (one up-sampling per factor 2), "
                             f"got {patch_size!r}")
        if num_classes < 2:
            raise ValueError(f"num_classes counts the background and must be at least 2, got {num_classes}")
        kwargs = dict(attention_kwargs or {})
        if value_dim is not None:
            if kwargs.get("value_dim", value_dim) != value_dim:
                raise ValueError(f"value_dim={value_dim} and attention_kwargs value_dim={kwargs['value_dim']} differ")
            kwargs["value_dim"] = value_dim
        super().__init__(img_size=img_size, patch_size=patch_size, in_chans=in_chans, num_classes=num_classes,
                         embed_dim=embed_dim, depth=depth, num_heads=num_heads, attn_dim=attn_dim, mlp_dim=mlp_dim,
                         attention=attention, attention_kwargs=kwargs, spatial_dims=2, qkv_bias=qkv_bias,
                         drop_rate=drop_rate, attn_drop_rate=attn_drop_rate)
        del self.head  # the class token's linear head: a segmenter has the decoder instead
        self.pretrained_keep = check_keep(pretrained_keep)
        self.decoder = ConvDecoder(embed_dim, num_classes, decoder_dim, int(math.log2(patch_size)))
        self.slice_chunk = 16  # slices of a volume per forward pass (bounds the memory of volume inference)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, num_classes, H, W); a volume (B, C, H, W, S) is segmented slice by slice along its
        last axis, ``slice_chunk`` slices at a time: -> (B, num_classes, H, W, S)."""
        if x.ndim == 5:
            B, C, H, W, S = x.shape
            slices = x.movedim(-1, 1).reshape(B * S, C, H, W)  # (B S, C, H, W)
            logits = torch.cat([self(chunk) for chunk in slices.split(self.slice_chunk)])  # (B S, K, H, W)
            return logits.unflatten(0, (B, S)).movedim(1, -1)  # (B, K, H, W, S)
        tokens = self.forward_features(x)[:, 1:]  # (B, N, D), class token dropped
        h, w = (s // p for s, p in zip(x.shape[2:], self.patch_size))
        grid = tokens.transpose(1, 2).unflatten(2, (h, w))  # (B, D, H/p, W/p)
        return self.decoder(grid)


def parameter_counts(model: SegmentationViT) -> dict[str, int]:
    """Parameters of the encoder (patch embedding, class token, positions, blocks, final norm) and the decoder."""
    decoder = sum(p.numel() for p in model.decoder.parameters())
    return {"encoder": sum(p.numel() for p in model.parameters()) - decoder, "decoder": decoder}
