"""The model presets of :mod:`medattn.catalogue` with their classes, and the training settings each is known to
train with. Any keyword given to :func:`medattn.models.create_model` overrides the preset's value.
"""

from __future__ import annotations

from medattn.catalogue import PRESETS as PRESET_TABLE

from .mil import AttentionMIL
from .pixel import PixelTransformer
from .resnet import ResNet
from .segmentation import DilatedFCN3D, UNet3D
from .segmentation.vit_seg import SegmentationViT
from .swin import SwinClassifier
from .transmil import TransMIL
from .vit import VisionTransformer
from .wsi import WSITransformer

_CLASSES = {cls.__name__: cls for cls in (AttentionMIL, PixelTransformer, ResNet, DilatedFCN3D, UNet3D,
                                          SegmentationViT, SwinClassifier, TransMIL, VisionTransformer,
                                          WSITransformer)}
#: preset -> (model class, keyword arguments)
PRESETS: dict[str, tuple[type, dict]] = {name: (_CLASSES[cls], kwargs) for name, (cls, kwargs) in PRESET_TABLE.items()}

#: Training settings a preset is known to train with, for ``train.*`` keys the config leaves null
#: (:mod:`medattn.train.defaults`; every other model: AdamW, lr 1e-4, weight decay 0.05, 1 warm-up epoch, cosine
#: decay, gradient norm clipped at 1).
#: Attention-MIL: lr 2e-4, constant rate, no warm-up, no clipping (Lu et al., CLAM, 2021), with AdamW's decoupled
#: weight decay 1e-4 where CLAM has Adam's L2 term 1e-5: a weight decay the user sets for every arm of a compare (a
#: ViT's 0.05) then keeps its meaning, where under Adam 0.05 became an L2 penalty on every gradient and stopped the
#: model learning (issue 40); TransMIL: the same (its code wraps RAdam in Lookahead).
#: CPU ViT and Swin presets trained from scratch on a few hundred cases: lr 5e-4, the rate their packaged configs use
#: and the realistic benchmark was run with (docs/realistic.md); the CPU bag transformer: attention-MIL's settings.
_MIL_TRAINING = {"optimizer": "adamw", "lr": 2e-4, "weight_decay": 1e-4, "warmup_epochs": 0.0, "schedule": "constant",
                 "grad_clip": 0.0}
#: ResNets: lr 1e-3, weight decay 1e-4, the usual CNN recipe; on the realistic brain-MRI slices the small ResNet
#: went from 0.64 (ViT settings: lr 5e-4, weight decay 0.05) to the independent CNN's 0.73 with it (docs/realistic.md).
_CNN_TRAINING = {"lr": 1e-3, "weight_decay": 1e-4}
TRAINING: dict[str, dict] = {
    **{name: _MIL_TRAINING for name in ("abmil", "abmil_small", "abmil_tiny", "transmil", "transmil_small",
                                        "transmil_tiny")},
    **{name: {"lr": 5e-4} for name in ("vit2d_small", "vit3d_small", "swin2d_small", "swin3d_small")},
    **{name: _CNN_TRAINING for name in ("resnet2d", "resnet3d", "resnet2d_small", "resnet3d_small", "resnet2d_tiny",
                                        "resnet3d_tiny")},
    # the CPU bag transformer (max-pooling readout) trains as attention-MIL does: under the ViTs' settings (weight
    # decay 0.05, warm-up, cosine, clipping) its train loss rose above ln 2 on the realistic IHC bags (issue 40)
    "vitwsi_small": _MIL_TRAINING,
}
