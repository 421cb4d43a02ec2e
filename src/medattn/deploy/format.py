"""The exported file's format, shared by the exporter (:mod:`medattn.deploy.export`) and the runner
(:mod:`medattn.deploy.runtime`): the formats, the ONNX opset, where the metadata lives and what it holds.

An ONNX file holds its metadata as one JSON object under the ``metadata_props`` key ``medattn``
(:data:`METADATA_KEY`); a ``.pt2`` program holds the same JSON as the extra file ``medattn.json``
(:data:`PT2_EXTRA`) inside its archive, so neither format needs a side-car file. :func:`metadata` makes the
object, :func:`read_metadata` reads it back from either format, :func:`onnx_session` opens an ONNX file in
onnxruntime.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from medattn import __version__
from medattn.errors import UserError
from medattn.extras import require

if TYPE_CHECKING:
    from medattn.data.preprocessing import Preprocessing

FORMATS = ("onnx", "pt2")
OPSET = 18
METADATA_KEY = "medattn"
PT2_EXTRA = "medattn.json"


def metadata(prep: Preprocessing, thresholds: list[float | None] | None, model_id: str, checkpoint_sha256: str,
             input_names: list[str]) -> dict:
    """What the exported file carries (JSON): the preprocessing description, class names, thresholds,
    model id, checkpoint hash, the graph's inputs and what its output holds."""
    return {"format": 1, "medattn_version": __version__, "preprocessing": prep.to_dict(),
            "class_names": prep.output_names, "threshold": thresholds, "model_id": model_id,
            "checkpoint_sha256": checkpoint_sha256, "inputs": input_names,
            "output": "probabilities (sigmoid per output; softmax over classes for multiclass and segmentation)",
            "opset": OPSET}


def read_metadata(path: str | Path) -> dict:
    """The medattn metadata of an exported ``.onnx`` or ``.pt2`` file; a one-line UserError if it has none."""
    path = Path(path)
    try:
        if path.suffix.lower() == ".onnx":
            onnx = require("onnx", f"{path}: reading an ONNX model's metadata")
            props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
            text = props.get(METADATA_KEY)
        else:
            import zipfile

            with zipfile.ZipFile(path) as archive:
                name = next((n for n in archive.namelist() if n.endswith(f"extra/{PT2_EXTRA}")), None)
                text = archive.read(name).decode() if name else None
    except Exception as error:  # onnx and zipfile raise their own types for foreign files
        raise UserError(f"{path}: not a readable exported model ({type(error).__name__}: {error})") from None
    if text is None:
        raise UserError(f"{path}: holds no medattn metadata (export it with medattn export)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise UserError(f"{path}: unreadable medattn metadata ({error})") from None


def onnx_session(path: str | Path):
    """An onnxruntime session on the CPU; UserError when onnxruntime is missing or the file does not load."""
    onnxruntime = require("onnxruntime", f"{path}: running an ONNX model")
    try:
        return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own exception types for malformed models
        raise UserError(f"{path}: not an ONNX model onnxruntime can load ({type(error).__name__})") from None


def learning_of(source: str | Path) -> dict | None:
    """The training run's verdict a model carries (:mod:`medattn.runtime.learned`): an exported ``.onnx``/``.pt2``
    file's metadata ``learning``, else that recorded in the run holding the checkpoint folder ``source``."""
    from medattn.runtime.learned import recorded_learning

    source = Path(source)
    if source.suffix.lower() in (".onnx", ".pt2"):
        learning = read_metadata(source).get("learning")
        return learning if isinstance(learning, dict) else None
    return recorded_learning(source)
