"""Self-supervised pretraining on the user's unlabelled images, volumes and bags (``medattn pretrain``).

>>> from medattn.pretrain import MaskedAutoencoder, pretrain
>>> mae = MaskedAutoencoder(create_model("vit2d_small", attention="seqnorm"))
>>> loss, pred, masked = mae(images)          # (B, 1, 64, 64) -> loss on the masked patches only

:mod:`.objectives` lists the objectives (:mod:`.mae` for ViTs, :mod:`.bag_views` for the bag transformer),
:mod:`.data` what is read (the training split without labels, an unlabelled pool),
:mod:`.loop` the resumable run whose ``checkpoints/best`` ``medattn train --init-from`` takes. See
docs/pretraining.md.
"""

from .bag_views import BagViews, nt_xent
from .loop import pretrain
from .mae import MaskedAutoencoder, masked_patch_loss, patchify

__all__ = ["BagViews", "MaskedAutoencoder", "masked_patch_loss", "nt_xent", "patchify", "pretrain"]
