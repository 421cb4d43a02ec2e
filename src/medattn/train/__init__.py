"""Training and evaluation: the engine, safe atomic checkpoints and multi-process (DDP) helpers."""

from .engine import Predictions, build_model, fit, make_loader, predict, score_split

__all__ = ["Predictions", "build_model", "fit", "make_loader", "predict", "score_split"]
