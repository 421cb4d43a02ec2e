"""One split's per-sample results, as every objective gathers them (:mod:`medattn.train.objectives`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Predictions:
    """One split's per-sample results in dataset order (see the objective's :meth:`outputs`).

    Classification: ``outputs`` = probabilities (N, K), ``labels`` (N, K) or (N,) class indices.
    Segmentation: ``outputs`` = per-class Dice (N, K), ``labels`` = label voxels per class (N, K).
    Survival: ``outputs`` = risk scores (N, 1), ``labels`` = ``[time, event]`` (N, 2).
    Regression: ``outputs`` = predicted values in the targets' units (N, K), ``labels`` = the targets (N, K).
    """

    ids: list[str]
    patients: list[str]
    outputs: np.ndarray
    labels: np.ndarray
    loss: float
    statistic: np.ndarray | None = None  # (N,) a trivial statistic per sample (image mean, bag size), or None
