"""Heatmaps of a run's highest-scored test cases, for its report page (``eval.heatmaps``).

After the test, the kept model explains the ``count`` test cases it scores highest (binary and multi-label: the
first output's probability; multiclass: the predicted class's) with the default method
(:func:`~medattn.explain.core.default_method`), each drawn as ``medattn explain`` draws a file: 2D images beside
the map over them, volumes as three orthogonal slices, bags as their tiles at their coordinates; each with a colour
bar and a title naming run, method, case, probability and label. The cases are the prepared test tensors (after
resizing and normalisation; shown rescaled to their own range), not the files, so a report needs no data folder.
How a case is shown is its input kind's choice (:meth:`~medattn.data.input_kinds.InputKind.show_case` calls a method
of :class:`CasePictures`). Training does not import this module: the commands that train hand
:func:`case_heatmaps` to :func:`medattn.train.fit` (``case_pictures``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..data import input_kinds
from ..runtime.outputs import save_image
from . import outputs
from .core import explain


@dataclass
class CasePictures:
    """One case's figure, by how its kind draws the map (:class:`~medattn.data.input_kinds.Heatmaps`), with a colour
    bar and ``title``."""

    title: str
    method: str
    synthetic: bool

    def image(self, image: np.ndarray, relevance) -> Image.Image:
        """The image (C, H, W) beside the map (H, W) over it."""
        return outputs.readable_overlay(image, np.asarray(relevance), self.title, self.method, self.synthetic)

    def volume(self, volume: np.ndarray, relevance) -> Image.Image:
        """Three slices of the volume (H, W, D) and map through the voxel of largest relevance."""
        return outputs.volume_preview(volume, np.asarray(relevance), self.title, self.method, self.synthetic)

    def tiles(self, coords: np.ndarray, relevance) -> Image.Image:
        """The tiles' scores (N,) drawn at their coordinates (N, 2)."""
        relevance = np.asarray(relevance)
        return outputs.slide_map_figure(outputs.tile_map(coords, relevance, outputs.tile_size(coords)), relevance,
                                        self.title, self.method, self.synthetic)


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
    kind = input_kinds.of(task.input_kind)
    names = []
    for index in np.argsort(-scores, kind="stable")[:count]:
        sample = dataset[int(index)]
        x, kwargs = kind.one(sample, device)
        result = explain(model, x, "auto", **kwargs)
        label = np.asarray(labels[index]).ravel().tolist()
        heading = (f"{title} | {result.method} | test case {ids[index]}: p = {scores[index]:.2f}, "
                   f"label {label[0] if len(label) == 1 else label}")
        picture = kind.show_case(CasePictures(heading, result.method, task.synthetic), sample,
                                 result.relevance[0].detach().cpu())
        if picture is not None:
            name = f"heatmaps/{len(names) + 1}.png"
            save_image(out_dir / name, picture, format="PNG")
            names.append(name)
    return names
