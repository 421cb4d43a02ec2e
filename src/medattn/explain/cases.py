"""Heatmaps of a run's highest-scored test cases, for its report page (``eval.heatmaps``).

After the test, the kept model explains the ``count`` test cases it scores highest (binary and multi-label: the
first output's probability; multiclass: the predicted class's; survival and regression: the ``count`` highest and
the ``count`` lowest risks or first target's values, the risk or value explained, as the task type's ``case_ends``,
``case_output`` and ``case_text`` say) with the default method
(:func:`~medattn.explain.core.default_method`), each drawn as ``medattn explain`` draws a file: 2D images beside
the map over them, volumes as three orthogonal slices, bags as their tiles at their coordinates; each with a colour
bar and a title naming run, method, case, probability and label. The cases are the prepared test tensors (after
resizing and normalisation; shown rescaled to their own range), not the files, so a report needs no data folder.
How a case is shown is its input kind's choice (:meth:`~medattn.data.input_kinds.InputKind.show_case` calls a method
of :class:`CasePictures`). A bag of one slide is drawn over that slide's thumbnail, as ``medattn explain --slides``
draws it, when the run's ``data.slides_dir`` holds the slide (:func:`case_pictures_for`); a slide not there is a
warning and its case is drawn on a blank canvas. Training does not import this module: the commands that train hand
:func:`case_heatmaps` (:func:`case_pictures_for` of the run's config) to :func:`medattn.train.fit`
(``case_pictures``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..data import input_kinds
from ..outputs import OutputFolder
from ..survival_plots import time_axis_label
from ..vocabulary import task_types
from . import outputs, tile_scores
from .core import explain
from .files import find_slide


@dataclass
class CasePictures:
    """One case's figure, by how its kind draws the map (:class:`~medattn.data.input_kinds.Heatmaps`), with a colour
    bar and ``title``; a bag's tiles over the thumbnail of ``slide`` (its scanner file, the bag's HDF5 attributes
    ``attrs``) when given."""

    title: str
    method: str
    synthetic: bool
    slide: Path | None = None
    attrs: dict = field(default_factory=dict)

    def image(self, image: np.ndarray, relevance) -> Image.Image:
        """The image (C, H, W) beside the map (H, W) over it."""
        return outputs.readable_overlay(image, np.asarray(relevance), self.title, self.method, self.synthetic)

    def volume(self, volume: np.ndarray, relevance) -> Image.Image:
        """Three slices of the volume (H, W, D) and map through the voxel of largest relevance."""
        return outputs.volume_preview(volume, np.asarray(relevance), self.title, self.method, self.synthetic)

    def tiles(self, coords: np.ndarray, relevance) -> Image.Image:
        """The tiles' scores (N,) drawn at their coordinates (N, 2): over the thumbnail of ``slide`` when given
        (:func:`~medattn.explain.tile_scores.slide_picture`, as ``medattn explain --slides``), else on a blank
        canvas."""
        relevance = np.asarray(relevance)
        if self.slide is None:
            picture, title = tile_scores.tile_map(coords, relevance, tile_scores.tile_size(coords)), self.title
        else:
            picture = tile_scores.slide_picture(self.slide, coords, relevance, self.attrs)
            title = f"{self.title} | on {self.slide.name}"
        return outputs.slide_map_figure(picture, relevance, title, self.method, self.synthetic)


def case_slide(dataset, index: int, kind: input_kinds.InputKind, slides: str | Path) -> tuple[Path | None, dict, str]:
    """(the scanner file of case ``index``'s bag in the folder ``slides``, the bag's HDF5 attributes, "") when its
    tiles can be drawn on it (:func:`~medattn.explain.files.find_slide`), else (None, {}, why not, in words): the bag
    of a patient of several slides joins their tiles, drawn on none of them. ``dataset``: a table's (its ``records``
    name each case's files), ``kind`` the bags' input kind."""
    paths = dataset.records[index].paths
    if len(paths) > 1:
        return None, {}, f"its bag joins {len(paths)} slides ({', '.join(p.name for p in paths)})"
    attrs = kind.header(paths[0])[1]
    slide, why = find_slide(attrs, slides)
    return slide, attrs, why


def case_heatmaps(model: torch.nn.Module, dataset, probabilities: np.ndarray, labels: np.ndarray, ids: list[str],
                  task, out_dir: Path, title: str, count: int,
                  slides: str | Path | None = None, config: dict | None = None) -> tuple[list[str], list[str]]:
    """Write ``heatmaps/<rank>.png`` for the ``count`` highest-scored cases of ``dataset`` (``probabilities``
    (N, K), the test's outputs, and ``labels`` in dataset order, as the test's predictions) into ``out_dir``; ->
    (the paths written, relative to ``out_dir``; warnings). A task type that draws both ends of its scores
    (:attr:`~medattn.vocabulary.task_type.TaskType.case_ends`: a survival run's risks, a regression's values) gets
    ``heatmaps/highest_<k>.png`` and ``heatmaps/lowest_<k>.png``, each map explaining the type's
    ``case_output`` (the risk, the first target: red raises it) and titled by its ``case_text``. ``slides``: the
    folder of the scanner files of a bag data set's slides (:func:`case_slide`); a case whose slide is not drawn
    there gets a warning saying why and is drawn on a blank canvas. Nothing for ``count`` 0. Segmentation
    (``probabilities``: the test's Dice per case and class): the best and worst cases' label maps over their inputs
    (:mod:`medattn.explain.segmentation_cases`; with the run's ``config``)."""
    kind = task_types.of(task.task_type)
    if kind.voxel_labels and config is not None:
        from .segmentation_cases import segmentation_cases

        return segmentation_cases(model, dataset, probabilities, ids, task, out_dir, title, count, config)
    if count <= 0 or kind.voxel_labels or not kind.case_ends or len(probabilities) == 0:
        return [], []
    probabilities = np.asarray(probabilities).reshape(len(probabilities), -1)
    scores = kind.case_scores(probabilities)
    time_label = time_axis_label((config or {}).get("data", {}).get("time_column"))
    drawn: list[int] = []
    names, warnings = [], []
    folder = OutputFolder.within(Path(out_dir) / "heatmaps")  # inside the run folder, whose policy train applied
    for end in kind.case_ends:
        order = np.argsort(-scores if end == "highest" else scores, kind="stable")
        chosen = [int(i) for i in order if int(i) not in drawn][:count]
        for k, index in enumerate(chosen, start=1):
            both = len(kind.case_ends) > 1
            text = kind.case_text(probabilities[index], labels[index], list(task.class_names), time_label)
            heading = f"{end + ' ' if both else ''}test case {ids[index]}: {text}"
            name = f"{end}_{k}.png" if both else f"{len(names) + 1}.png"
            if _draw_case(model, dataset, index, task, kind.case_output, (title, heading), (folder, name), slides,
                          warnings, ids[index]):
                names.append(f"heatmaps/{name}")
            drawn.append(index)
    return names, warnings


def _draw_case(model: torch.nn.Module, dataset, index: int, task, target: int | None, heading: tuple[str, str],
               where: tuple[OutputFolder, str], slides: str | Path | None, warnings: list[str], case_id: str) -> bool:
    """Explain case ``index`` of ``dataset`` (logit ``target``; None: the predicted class) with the default method
    and save its picture as ``where`` (a folder, a name) as its input kind shows a case, titled ``run | method |
    case`` (``heading``: the run's title and the case's words); -> whether a picture was written. A bag whose slide is
    not drawn adds a warning to ``warnings``."""
    kind = input_kinds.of(task.input_kind)
    sample = dataset[index]
    x, kwargs = kind.one(sample, next(model.parameters()).device)
    result = explain(model, x, "auto", target=target, **kwargs)
    slide, attrs, why = (None, {}, "") if slides is None or not kind.instances else \
        case_slide(dataset, index, kind, slides)
    if why:
        warnings.append(f"report.html: test case {case_id}: {why}; its heatmap is drawn at the tile "
                        f"coordinates on a blank canvas")
    title = f"{heading[0]} | {result.method} | {heading[1]}"
    picture = kind.show_case(CasePictures(title, result.method, task.synthetic, slide, attrs), sample,
                             result.relevance[0].detach().cpu())
    if picture is None:
        return False
    folder, name = where
    folder.save_image(name, picture, format="PNG")
    return True


def case_pictures_for(config: dict) -> Callable[..., tuple[list[str], list[str]]]:
    """:func:`case_heatmaps` for a run of ``config``: bags drawn over their slides in ``data.slides_dir`` (null: on
    a blank canvas); a segmentation run's best and worst cases predicted as its test was."""
    return functools.partial(case_heatmaps, slides=config["data"].get("slides_dir"), config=config)
