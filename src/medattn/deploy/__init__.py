"""Deployment: a trained model as a file a clinic runs (ONNX, torch.export), and predictions from files.

>>> from medattn.deploy import export_checkpoint
>>> export_checkpoint("runs/duke", "onnx", "duke.onnx")   # doctest: +SKIP

See ``docs/deploy.md``: what the exported file carries (preprocessing, class names, threshold, model id,
checkpoint hash), predicting from a checkpoint or an ONNX file, thresholds, ``--skip-bad`` and
segmentation label maps.
"""

from medattn.runtime.trained import Trained, load_checkpoint, weights_sha256

from .export import Deployable, export_checkpoint, export_model
from .format import FORMATS, read_metadata

__all__ = ["FORMATS", "Deployable", "Trained", "export_checkpoint", "export_model", "load_checkpoint",
           "read_metadata", "weights_sha256"]
