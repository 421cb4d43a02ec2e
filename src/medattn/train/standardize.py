"""Fitting the bag models' feature standardisation (:class:`medattn.models.layers.FeatureStandardizer`) on the
training split, before the first step: per-feature mean and standard deviation over every training instance."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset

from medattn.models.layers import FeatureStandardizer


def feature_statistics(dataset: Dataset) -> tuple[torch.Tensor, torch.Tensor, int]:
    """-> (mean (F,), std (F,), instances): over every instance of every bag of ``dataset`` (its ``"input"``
    (N, F)), accumulated in float64; the population std (ddof 0). Bags are read as training reads them
    (``max_instances`` subsampling included) under a forked RNG, so the training order stays as seeded."""
    total, squares, count = None, None, 0
    with torch.random.fork_rng():
        for index in range(len(dataset)):
            features = dataset[index]["input"].double()  # (N, F)
            total = features.sum(0) if total is None else total + features.sum(0)
            squares = features.square().sum(0) if squares is None else squares + features.square().sum(0)
            count += features.shape[0]
    mean = total / count
    return mean, (squares / count - mean.square()).clamp_min(0).sqrt(), count


def fit_feature_norm(model: nn.Module, train_set: Dataset) -> dict | None:
    """Set every :class:`FeatureStandardizer` of ``model`` to the training split's statistics; -> what was
    fitted (for results.json), or None when the model has none (images, or ``standardize_features=False``)."""
    layers = [m for m in model.modules() if isinstance(m, FeatureStandardizer)]
    if not layers:
        return None
    mean, std, count = feature_statistics(train_set)
    for layer in layers:
        layer.set_statistics(mean.to(layer.mean), std.to(layer.std))
    return {"instances": count, "bags": len(train_set), "mean_range": [float(mean.min()), float(mean.max())],
            "std_range": [float(std.min()), float(std.max())]}
