"""3D vector-quantised absorbing diffusion (BinaryFormer §3.2, App. A.2): a patch-wise VQ-AE with EMA
sub-codebooks, an absorbing-diffusion transformer over the volume's token grid (any registered
attention mechanism), sampling for inpainting and synthesis, PSNR/SSIM, and the two training stages.

>>> from medattn.diffusion import VQAutoencoder3d, AbsorbingTransformer, sample_tokens
See docs/diffusion.md.
"""

from .codebook import SubCodebookEMA
from .inpaint import centre_mask, inpaint, voxel_mask_to_tokens
from .metrics import psnr, ssim
from .sampling import random_fill, sample_tokens
from .transformer import AbsorbingTransformer, absorbing_loss, mask_schedule
from .vqae import VQAutoencoder3d, decode_volume, encode_volume

__all__ = ["AbsorbingTransformer", "SubCodebookEMA", "VQAutoencoder3d", "absorbing_loss", "centre_mask",
           "decode_volume", "encode_volume", "inpaint", "mask_schedule", "psnr", "random_fill", "sample_tokens",
           "ssim", "voxel_mask_to_tokens"]
