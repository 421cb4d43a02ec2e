"""Heatmaps of a run's highest-scored test cases, for its report page (``eval.heatmaps``).

After the test, the kept model explains the ``count`` test cases it scores highest (binary and multi-label: the
first output's probability; multiclass: the predicted class's) with the default method
(:func:`~medattn.explain.core.default_method`), each drawn as ``medattn explain`` draws a file: 2D images beside
the map over them, volumes as three orthogonal slices, bags as their tiles at their coordinates; each with a colour
bar and a title naming run, method, case, probability and label. The cases are the prepared test tensors (after
resizing and normalisation; shown rescaled to their own range), not the files, so a report needs no data folder.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..errors import writing
from . import outputs
from .core import explain


def _picture(input_kind: str, sample: dict, relevance: np.ndarray, title: str, method: str,
             synthetic: bool) -> Image.Image | None:
    """One case's figure, or None where there is nothing to draw (a bag without distinct coordinates)."""
    if input_kind == "bag":
        coords = sample["coords"].numpy()
        if not np.ptp(coords, axis=0).any():
            return None
        return outputs.slide_map_figure(outputs.tile_map(coords, relevance, outputs.tile_size(coords)), relevance,
                                        title, method, synthetic)
    shown = sample["input"].float().numpy()
    shown = (shown - shown.min()) / max(float(np.ptp(shown)), 1e-12)  # the prepared tensor, rescaled to [0, 1]
    if input_kind == "volume3d":
        return outputs.volume_preview(shown[0], relevance, title, method, synthetic)
    return outputs.readable_overlay(shown[:3] if shown.shape[0] >= 3 else shown[:1], relevance, title, method,
                                    synthetic)


def case_heatmaps(model: torch.nn.Module, dataset, probabilities: np.ndarray, labels: np.ndarray, ids: list[str],
                  task, out_dir: Path, title: str, count: int) -> list[str]:
    """Write ``heatmaps/<rank>.png`` for the ``count`` highest-scored cases of ``dataset`` (``probabilities``
    (N, K) and ``labels`` in dataset order, as the test's predictions) into ``out_dir``; -> the paths written,
    relative to ``out_dir``.
    Nothing for segmentation (explain explains class predictions) or ``count`` 0."""
    if count <= 0 or task.task_type == "segmentation" or len(probabilities) == 0:
        return []
    probabilities = np.asarray(probabilities).reshape(len(probabilities), -1)
    scores = probabilities.max(axis=1) if task.task_type == "multiclass" else probabilities[:, 0]
    device = next(model.parameters()).device
    names = []
    for index in np.argsort(-scores, kind="stable")[:count]:
        sample = dataset[int(index)]
        kwargs = {"coords": sample["coords"][None].to(device)} if task.input_kind == "bag" else {}
        result = explain(model, sample["input"][None].to(device), "auto", **kwargs)
        label = np.asarray(labels[index]).ravel().tolist()
        heading = (f"{title} | {result.method} | test case {ids[index]}: p = {scores[index]:.2f}, "
                   f"label {label[0] if len(label) == 1 else label}")
        picture = _picture(task.input_kind, sample, result.relevance[0].detach().cpu().numpy(), heading,
                           result.method, task.synthetic)
        if picture is not None:
            name = f"heatmaps/{len(names) + 1}.png"
            with writing(out_dir / name):
                (out_dir / "heatmaps").mkdir(exist_ok=True)
                picture.save(out_dir / name, format="PNG")
            names.append(name)
    return names
