"""3D segmentation networks with and without the Permutohedral Attention Module, and Dice losses."""

from .dilated import DilatedFCN3D
from .losses import dice_per_class, soft_dice_loss
from .unet import UNet3D

__all__ = ["DilatedFCN3D", "UNet3D", "dice_per_class", "soft_dice_loss"]
