"""Running a deployed model: a checkpoint in PyTorch or an exported file (ONNX in onnxruntime, a ``torch.export``
``.pt2`` program in torch), one interface.

:func:`open_model` takes a checkpoint (run folder, checkpoint folder, ``model.safetensors``) or an
``.onnx`` / ``.pt2`` file and gives a :class:`Runner` whose :meth:`Runner.probabilities` maps a collated batch to
probabilities: a checkpoint through :class:`medattn.runtime.predictor.Predictor` (as eval predicts), an ONNX
file through the exported graph (:class:`~medattn.deploy.export.Deployable`, the same function), so both
give the same numbers (checked to 1e-4 relative in the tests). onnxruntime is optional (the ``onnx``
extra); without it an ONNX file is a one-line UserError. A checkpoint runs on the device asked for (``auto``: the best
this machine has), whatever ``train.device`` it was trained with; an exported file runs on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from medattn.data import input_kinds
from medattn.data.preprocessing import Preprocessing, from_dict
from medattn.errors import UserError
from medattn.runtime.threshold import checked_thresholds

from .format import onnx_session, read_metadata


@dataclass
class Runner:
    """A model ready to predict: its preprocessing, stored thresholds, provenance and a probability function."""

    preprocessing: Preprocessing
    thresholds: list[float | None] | None
    model_id: str
    checkpoint_sha256: str
    source: str
    run: object  # batch dict -> np.ndarray probabilities
    features: dict | None = None  # what made a bag model's training features (medattn.data.provenance), if recorded
    device: str = "cpu"  # where it runs
    trained_device: str | None = None  # a checkpoint's train.device: recorded, not obeyed
    window: tuple | None = None  # a patch-trained checkpoint's own sliding window (window, overlap): any input size

    def probabilities(self, batch: dict) -> np.ndarray:
        """Collated batch (``input``; bags also ``mask``, ``coords``) -> probabilities (B, K) or (B, K, H, W, D)."""
        return self.run(batch)


def _torch_runner(path: str | Path, device: str) -> Runner:
    from medattn.runtime.device import inference_device
    from medattn.runtime.trained import load_checkpoint

    where = inference_device(device)  # a device this machine lacks: before the checkpoint is read
    trained = load_checkpoint(path)
    prep = trained.file_preprocessing("predict")
    predictor = trained.predictor(where)  # as eval predicts

    @torch.no_grad()
    def run(batch: dict) -> np.ndarray:
        return predictor.probabilities(batch).cpu().numpy()

    return Runner(prep, trained.thresholds, trained.model_id, trained.checkpoint_sha256, str(trained.folder), run,
                  trained.meta.get("features"), str(where), trained.config["train"]["device"], predictor.window)


def _graph_session(path: Path, expected: list[str]) -> tuple[list[str], object]:
    """(input names, feed dict -> first output) of an exported graph: onnxruntime for ``.onnx``, the
    ``torch.export`` program for ``.pt2`` (whose inputs are positional: named ``expected`` when their count fits)."""
    if path.suffix.lower() == ".onnx":
        session = onnx_session(path)
        return [i.name for i in session.get_inputs()], lambda feed: session.run(None, feed)[0]
    try:
        program = torch.export.load(str(path))
    except Exception as error:  # torch.export raises many types for foreign or damaged archives
        raise UserError(f"{path}: not a torch.export program torch can load ({type(error).__name__})") from None
    names = [spec.arg.name for spec in program.graph_signature.input_specs if spec.kind.name == "USER_INPUT"]
    names = expected if len(names) == len(expected) else names
    module = program.module()

    def run(feed: dict):
        with torch.no_grad():
            return module(*[torch.from_numpy(feed[name]) for name in names]).numpy()

    return names, run


def _exported_runner(path: Path) -> Runner:
    """An exported ``.onnx`` or ``.pt2`` file. Nothing in it is trusted: its metadata is checked (types,
    thresholds, the graph's inputs against the input kind), and a graph that refuses the prepared inputs is a
    one-line UserError, not a traceback."""
    meta = read_metadata(path)
    source = f"{path} metadata"
    if not isinstance(meta, dict):
        raise UserError(f"{source}: must be a JSON object, got {type(meta).__name__}")
    prep = from_dict(meta.get("preprocessing"), source)
    thresholds = meta.get("threshold")
    if thresholds is not None:
        thresholds = checked_thresholds(thresholds, prep.num_outputs, f"{source}: threshold")
    if prep.unpredictable:
        raise UserError(f"{source}: {prep.unpredictable}")
    features = meta.get("features")
    if features is not None:
        from medattn.data.provenance import check_recorded

        check_recorded(features, source)
    kind = input_kinds.of(prep.input_kind)
    expected = list(kind.input_names)
    names, graph = _graph_session(path, expected)
    if names != expected:
        raise UserError(f"{path}: the graph's inputs {names} are not those of a {prep.input_kind} model "
                        f"{expected}: the metadata does not describe this graph")

    def session_run(feed: dict) -> np.ndarray:
        try:
            out = graph(feed)
        except Exception as error:  # the runtimes' own exception types: the graph refuses these inputs
            shapes = {name: list(value.shape) for name, value in feed.items()}
            reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
            raise UserError(f"{path}: the graph refuses inputs {shapes} prepared as its metadata says ({reason})") \
                from None
        return np.asarray(out, dtype=np.float32)

    def run(batch: dict) -> np.ndarray:
        inputs = kind.graph_inputs(batch)
        if prep.slice_axis is not None and inputs[0].ndim == 5:  # a volume for a 2D graph: its slices as a batch
            volume = inputs[0]  # (1, 1, h, w, S)
            slices = session_run({names[0]: volume[0].permute(3, 0, 1, 2).numpy()})  # (S, K, h, w)
            return np.ascontiguousarray(slices.transpose(1, 2, 3, 0)[None])
        return session_run({n: t.numpy() for n, t in zip(names, inputs)})

    return Runner(prep, thresholds, str(meta.get("model_id", "")), str(meta.get("checkpoint_sha256", "")), str(path),
                  run, features)


def open_model(path: str | Path, device: str = "auto") -> Runner:
    """A :class:`Runner` for a checkpoint or an exported ``.onnx`` / ``.pt2`` file. ``device`` (``auto``, ``cpu``,
    ``mps``, ``cuda`` or ``cuda:N``; ``auto``: the best this machine has) is where a checkpoint runs, whatever
    ``train.device`` it was trained with; an exported file runs on the CPU (``auto`` or ``cpu``)."""
    path = Path(path)
    if path.suffix.lower() in (".onnx", ".pt2"):
        if device not in ("auto", "cpu"):
            raise UserError(f"--device={device}: an exported {path.suffix.lower()} file runs on the CPU here; use "
                            f"--device=auto or cpu, or predict from the checkpoint")
        if not path.is_file():
            raise UserError(f"{path}: no such file")
        return _exported_runner(path)
    return _torch_runner(path, device)
