"""Export a trained model to ONNX or a ``torch.export`` program, carrying what prediction needs.

The exported graph is :class:`Deployable`: the model followed by its output activation, so the file
maps preprocessed inputs to **probabilities** (sigmoid per output for binary/multi-label, softmax over
classes for multi-class, softmax over classes per voxel for segmentation):

* images and volumes: input ``x`` (B, C, H, W) or (B, C, H, W, D) -> (B, K) (segmentation (B, K, H, W, D));
* feature bags: inputs ``features`` (B, N, F) float32, ``mask`` (B, N) bool (True = real tile),
  ``coords`` (B, N, 2) float32 -> (B, K).

Dynamic axes: the batch always; the token count N for bags; H and W for the pixel transformer (one token
per pixel, any size; a model declares this with ``any_input_size = True`` or by taking no ``img_size``).
ViTs, CNNs and segmentation networks keep the training input size (the preprocessing resizes to it).

ONNX: opset 18 (``torch.onnx.export(dynamo=True)``). Metadata: the ONNX ``metadata_props`` key
``medattn`` holds one JSON object (:func:`~medattn.deploy.format.metadata`); a ``.pt2`` program holds the same
JSON as the extra file ``medattn.json`` inside its archive (``torch.export.save(extra_files=...)``), so neither
format needs a side-car file. :func:`~medattn.deploy.format.read_metadata` reads both (:mod:`medattn.deploy.format`,
which the runner shares). The training run's verdict, where its results.json records one, travels as ``learning``
(``learned``, ``reasons``): predict from the file marks a model whose run did not learn
(:mod:`medattn.runtime.learned`).

Mechanisms whose eager path leaves PyTorch or chooses its route from the data take their plain PyTorch
form while exported (:func:`medattn.attention.base.is_traced`, :func:`~medattn.attention.base.is_exporting`): the
fused SeqNorm operator its explicit form, and
the binary mechanisms (BinaryFormer) their **float path**: sign bits held as float +-1 and multiplied as
float matrices instead of the packed-bit XNOR/popcount kernel (outputs agree to 1e-4 relative, tested
for every binary mechanism); ONNX has no bit-packed matrix product, so an exported binary model runs at
float speed. The permutohedral attention module (``upamnet``,
``dilated_fcn_pam``) builds data-dependent sparse lattices that neither format can express: exporting
it is refused with a one-line error.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import warnings
from pathlib import Path

import torch
from torch import nn

from medattn.data import input_kinds
from medattn.data.preprocessing import Preprocessing
from medattn.errors import UserError
from medattn.extras import require
from medattn.outputs import OutputFolder
from medattn.runtime.predictor import forward, probabilities

from .format import FORMATS, METADATA_KEY, OPSET, PT2_EXTRA, metadata, onnx_session, read_metadata


class Deployable(nn.Module):
    """``model`` followed by its output activation: inputs -> probabilities (see the module docstring)."""

    def __init__(self, model: nn.Module, task_type: str, input_kind: str, target_scale=((), ())) -> None:
        super().__init__()
        self.model, self.task_type, self.input_kind = model, task_type, input_kind
        self.target_scale = target_scale  # regression: (target_mean, target_std), constants of the graph

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, coords: torch.Tensor | None = None) -> \
            torch.Tensor:
        """x: images/volumes, or bag features with ``mask`` and ``coords`` -> probabilities."""
        logits = forward(self.model, {"input": x, "mask": mask, "coords": coords}, self.input_kind)
        return probabilities(logits, self.task_type, *self.target_scale)


def any_input_size(model: nn.Module) -> bool:
    """Whether the model takes images of any size (it declares ``any_input_size = True``: the pixel transformer)."""
    return bool(getattr(model, "any_input_size", False))


def example_inputs(prep: Preprocessing, model: nn.Module, batch: int = 2, tokens: int = 10,
                   generator: torch.Generator | None = None) -> tuple[tuple[torch.Tensor, ...], tuple, list[str]]:
    """-> (random example inputs, their dynamic shapes for ``torch.export``, input names), as the input kind
    makes them (:meth:`~medattn.data.input_kinds.InputKind.example_inputs`: batch 2, 10 tokens, a 6 x 9 image for
    any-size models, so no dynamic axis is mistaken for another or specialised to 1)."""
    return input_kinds.of(prep.input_kind).example_inputs(prep.input_shape, any_input_size(model), batch, tokens,
                                                          generator)


@contextlib.contextmanager
def _quiet():
    """The exporters' chatter off for the duration: warnings, logs, and whatever they print to the standard
    output and error streams (a failed capture prints its whole FX graph, with colour codes, to fd 2)."""
    level = logging.root.manager.disable
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with warnings.catch_warnings(), open(os.devnull, "w") as null:
            warnings.simplefilter("ignore")
            logging.disable(logging.WARNING)
            os.dup2(null.fileno(), 1)
            os.dup2(null.fileno(), 2)
            with contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
                yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        logging.disable(level)


def export_refusal(model: nn.Module) -> str | None:
    """Why ``model`` cannot be exported, from the first of its modules that declares an ``export_refusal``
    (a module that builds data-dependent structures, like the permutohedral lattice); None when none does."""
    return next((f"{type(m).__name__}: {m.export_refusal}" for m in model.modules()
                 if getattr(m, "export_refusal", None)), None)


def export_model(model: nn.Module, prep: Preprocessing, fmt: str, out: str | Path, meta: dict,
                 overwrite: bool = False, inputs: tuple[Path, ...] = ()) -> Path:
    """Export ``model`` (eval mode, float32, CPU) wrapped in :class:`Deployable` to ``out`` in ``fmt``
    (onnx or pt2) with ``meta`` embedded; -> the written path. A model the exporter cannot capture is a
    one-line UserError naming the first reason. ``out`` follows :class:`~medattn.outputs.OutputFolder`
    (checked before the export; never one of ``inputs``; an existing file only with ``overwrite``; written
    atomically)."""
    if fmt not in FORMATS:
        raise UserError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    out = Path(out)
    folder = OutputFolder(out.parent, inputs, overwrite)
    folder.path(out.name)
    refusal = export_refusal(model)
    if refusal:
        raise UserError(f"cannot export this model to {fmt}: {refusal}")
    wrapper = Deployable(model.float().cpu().eval(), prep.task_type, prep.input_kind,
                         (prep.target_mean, prep.target_std)).eval()
    if fmt == "onnx":  # torch's ONNX exporter imports both on use
        require("onnx", "exporting to ONNX")
        require("onnxscript", "exporting to ONNX")
    args, dynamic, names = example_inputs(prep, model, generator=torch.Generator().manual_seed(0))
    text = json.dumps({**meta, "inputs": names})
    try:
        with _quiet(), torch.no_grad():
            if fmt == "onnx":
                program = torch.onnx.export(wrapper, args, dynamo=True, opset_version=OPSET, dynamic_shapes=dynamic,
                                            input_names=names, output_names=["probabilities"], verbose=False)
                program.model.metadata_props[METADATA_KEY] = text
            else:
                program = torch.export.export(wrapper, args, dynamic_shapes=dynamic)
    except Exception as error:  # the exporters raise many types; one line of their message says why
        raise UserError(f"cannot export this model to {fmt}: {_reason(error)}") from None
    with folder.write(out.name) as tmp:
        if fmt == "onnx":
            program.save(str(tmp))
        else:
            torch.export.save(program, str(tmp), extra_files={PT2_EXTRA: text})
    return out


def _reason(error: Exception) -> str:
    """One line from an exporter's error: its exception summary when it has one, else its first line."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(error).splitlines()]
    lines = [line for line in lines if line]
    summary = next((i for i, line in enumerate(lines) if "Exception summary" in line), None)
    reason = lines[summary + 1] if summary is not None and summary + 1 < len(lines) else (lines or [""])[0]
    return (reason or type(error).__name__)[:300]


def export_checkpoint(checkpoint: str | Path, fmt: str, out: str | Path, overwrite: bool = False) -> dict:
    """Export the checkpoint at ``checkpoint`` (run folder, checkpoint folder or weights file) -> its metadata.
    ``out`` is never one of the checkpoint's files; an existing one is replaced only with ``overwrite``."""
    from medattn.runtime.learned import recorded_learning
    from medattn.runtime.sliding import inference_window
    from medattn.runtime.trained import load_checkpoint

    trained = load_checkpoint(checkpoint)
    prep = trained.file_preprocessing("export")
    if inference_window(trained.config, trained.task) is not None:
        raise UserError(f"{checkpoint}: this model was trained on patches and predicts whole volumes by sliding "
                        f"windows, which an exported graph does not hold yet; predict from the checkpoint")
    meta = metadata(prep, trained.thresholds, trained.model_id, trained.checkpoint_sha256, [])
    if trained.meta.get("features"):  # what made a bag model's training features: predict from the file checks them
        meta["features"] = trained.meta["features"]
    if (learning := recorded_learning(trained.folder)) is not None:  # the run's verdict travels with the file
        meta["learning"] = {"learned": learning.get("learned", True), "reasons": learning.get("reasons", [])}
    checkpoint_files = tuple(trained.folder.iterdir())
    export_model(trained.model, prep, fmt, out, meta, overwrite, checkpoint_files)
    return read_metadata(out)


def check_onnx(checkpoint: str | Path, path: str | Path, tolerance: float = 1e-4) -> float | None:
    """Largest relative difference between the ONNX file (onnxruntime) and the checkpoint (eager PyTorch) on
    random inputs of batch 3 (17 tokens for bags); None when onnxruntime is not installed. A difference
    above ``tolerance`` is a UserError."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return None
    from medattn.runtime.trained import load_checkpoint

    trained = load_checkpoint(checkpoint)
    prep = trained.preprocessing
    args, _, names = example_inputs(prep, trained.model, batch=3, tokens=17, generator=torch.Generator().manual_seed(1))
    session = onnx_session(path)
    (actual,) = session.run(None, {n: t.numpy() for n, t in zip(names, args)})
    with torch.no_grad():
        expected = Deployable(trained.model, prep.task_type, prep.input_kind,
                              (prep.target_mean, prep.target_std))(*args).numpy()
    error = float((abs(actual - expected) / abs(expected).clip(min=1e-6)).max())
    if error > tolerance:
        raise UserError(f"{path}: onnxruntime differs from the checkpoint by {error:.2e} relative (> {tolerance})")
    return error


