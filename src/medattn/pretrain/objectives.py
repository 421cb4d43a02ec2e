"""The pretraining objectives, one per model family: what ``medattn pretrain`` trains a config's model with.

* ``masked autoencoding`` (:mod:`.mae`): ViT presets on images and volumes;
* ``two views of a bag`` (:mod:`.bag_views`): the bag-of-features transformer on unlabelled bags.

Each names the model class it pretrains, wraps a model (its weights trained in place, the wrapper's ``encoder``)
with the config's ``pretrain.*`` settings, turns a batch of samples into the wrapper's inputs and says in a few words
what it does. The loop (:mod:`.loop`) asks :func:`objective_for` and branches on nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from medattn.data.base import pad_bags
from medattn.models.vit import VisionTransformer
from medattn.models.wsi import WSITransformer

from .bag_views import BagViews
from .mae import MaskedAutoencoder


@dataclass(frozen=True)
class Objective:
    name: str  # recorded in pretrain.json and the checkpoint (``pretrained.objective``)
    model_type: type  # the model class it pretrains
    wrap: Callable[[nn.Module, dict], nn.Module]  # (model, pretrain settings) -> the wrapper; ValueError if unfit
    inputs: Callable[[list[dict]], tuple[torch.Tensor | None, ...]]  # samples -> the wrapper's positional inputs
    describe: Callable[[dict], str]  # pretrain settings -> the log's words
    min_batch: int = 1  # samples a step needs


def _images(samples: list[dict]) -> tuple[torch.Tensor]:
    return (torch.stack([s["input"] for s in samples]),)


def _bags(samples: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (features (B, N_max, F), mask (B, N_max), coords (B, N_max, 2)), zero-padded (:func:`pad_bags`)."""
    features, coords, mask = pad_bags(samples)
    return features, mask, coords


OBJECTIVES = (
    Objective("masked autoencoding", VisionTransformer,
              lambda model, p: MaskedAutoencoder(model, p["mask_ratio"], p["decoder_dim"], p["decoder_depth"],
                                                 p["decoder_heads"], p["norm_pix_loss"]),
              _images, lambda p: f"as a masked autoencoder (mask ratio {p['mask_ratio']})"),
    Objective("two views of a bag", WSITransformer,
              lambda model, p: BagViews(model, p["view_share"], p["view_tiles"]),
              _bags, lambda p: f"on two views of each bag ({p['view_share']:g} of its tiles, at most "
                               f"{p['view_tiles']}, each)", min_batch=2),
)


def objective_for(model: nn.Module) -> Objective | None:
    """The objective that pretrains ``model``, or None."""
    return next((o for o in OBJECTIVES if isinstance(model, o.model_type)), None)
