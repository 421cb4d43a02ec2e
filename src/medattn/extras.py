"""Optional dependencies by extra: a missing one is one line naming what to install, never a traceback.

medattn's base install runs training, evaluation and prediction from checkpoints. What needs more is an
extra of ``pyproject.toml``; :func:`require` imports a module of one and, when it is absent (or its native
library does not load), raises a :class:`~medattn.errors.UserError` saying what needed it and the ``pip
install 'medattn[<extra>]'`` that brings it. :data:`EXTRAS` is the one list; a test hides each module in turn.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from medattn.errors import UserError

#: top-level module -> the extra that installs it
EXTRAS = {
    "openslide": "slides", "tifffile": "slides",
    "onnx": "onnx", "onnxscript": "onnx", "onnxruntime": "onnx",
    "nilearn": "realistic", "skimage": "realistic",
    "monai": "swin", "einops": "swin",
    "tensorboard": "tensorboard",
}


def require(module: str, purpose: str) -> ModuleType:
    """``importlib.import_module(module)``; a one-line UserError ``"<purpose> needs <top module>: pip install
    'medattn[<extra>]'"`` when it (or a module it needs) is missing or its native library fails to load."""
    top = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as error:  # ModuleNotFoundError, or OpenSlide's missing C library
        missing = getattr(error, "name", None) or top
        extra = EXTRAS.get(missing.split(".")[0], EXTRAS.get(top))
        hint = f"pip install 'medattn[{extra}]'" if extra else f"pip install {missing.split('.')[0]}"
        detail = "" if isinstance(error, ModuleNotFoundError) else f" ({str(error).splitlines()[0]})"
        raise UserError(f"{purpose} needs {missing.split('.')[0]}: {hint}{detail}") from None
