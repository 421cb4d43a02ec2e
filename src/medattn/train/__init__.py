"""Training and evaluation: the loop, objectives, reports, run folders, safe atomic checkpoints and DDP helpers."""

from .loaders import make_loader
from .loop import fit, predict
from .objectives import Predictions
from .report import score_split

__all__ = ["Predictions", "fit", "make_loader", "predict", "score_split"]
