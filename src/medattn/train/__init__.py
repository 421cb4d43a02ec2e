"""Training and evaluation: the loop, objectives, reports, run folders, safe atomic checkpoints and DDP helpers."""

from .loop import fit
from .predictions import Predictions, predict
from .report import score_split
from .sampling import make_loader

__all__ = ["Predictions", "fit", "make_loader", "predict", "score_split"]
