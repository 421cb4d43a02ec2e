"""The contract between data sets, training (:mod:`medattn.train`), inference (:mod:`medattn.runtime`) and the models.

A sample is a dict:

* ``"input"``: float32 tensor: image (C, H, W), volume (C, H, W, D) or feature bag (N, F).
* ``"label"``: float32 tensor (num_outputs,) for binary and multi-label tasks (0/1 per output),
  an int64 scalar for multi-class tasks, an int64 label map (H, W, D) with values in
  [0, num_outputs) for segmentation (class 0 = background), float32 (2,) ``[time, event]`` for survival
  (event 1 = observed, 0 = censored at ``time``) or float32 (num_outputs,) target values for regression.
* ``"id"``: str, the sample's identifier (file name, slide or patient id), used in predictions.
* ``"patient"``: str, the patient id (splits never put one patient in two splits).
* bags only: ``"coords"``: float32 (N, 2) patch coordinates (zeros when the file has none).

A batch (see :func:`collate`) stacks inputs; bags of different lengths are padded with zeros and get
``"mask"`` (B, N_max) bool, True for real instances.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch.utils.data import Dataset

from ..vocabulary.task_types import TASK_TYPES as TYPES
from ..vocabulary.task_types import task_type
from .input_kinds import KINDS

if TYPE_CHECKING:
    from ..vocabulary.preprocessing import Preprocessing

#: The stored names of the task types (:mod:`medattn.vocabulary.task_types`, where each is a class).
TASK_TYPES = tuple(TYPES)
#: The stored names of the input kinds (:mod:`medattn.data.input_kinds`, where each is a class).
INPUT_KINDS = tuple(KINDS)


@dataclass
class TaskInfo:
    """What training and inference need to know about a task.

    ``num_outputs`` is the model's number of logits: 1 for binary, the class count for multi-class,
    the label count for multi-label, the class count including background for segmentation (logits
    per voxel), 1 for survival (the log relative risk of a Cox model), the target count for regression.
    ``class_names`` names the outputs (or the classes; regression: the target columns).
    ``target_mean`` / ``target_std`` (regression only, one per target): the training targets' mean and standard
    deviation; the model predicts standardised targets ``(y - mean) / std`` and its outputs are mapped back
    (:func:`medattn.runtime.predictor.probabilities`), so they travel with every checkpoint and export.
    ``input_shape`` is one sample's input shape without the bag length: (C, H, W), (C, H, W, D) or
    (F,) for bags; :mod:`medattn.runtime.build` sets the model's ``in_chans``/``img_size`` or ``feature_dim`` from it.
    """

    task_type: str
    input_kind: str
    num_outputs: int
    input_shape: tuple[int, ...]
    class_names: list[str] = field(default_factory=list)
    synthetic: bool = False
    target_mean: list[float] = field(default_factory=list)
    target_std: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.task_type not in TASK_TYPES:
            raise ValueError(f"task_type must be one of {TASK_TYPES}, got {self.task_type!r}")
        if self.input_kind not in INPUT_KINDS:
            raise ValueError(f"input_kind must be one of {INPUT_KINDS}, got {self.input_kind!r}")


def task_problem(task_type_name: str, num_outputs: int, class_names: list[str]) -> str | None:
    """What makes a task's type, output count and class names contradict one another (an edited checkpoint or
    exported file), or None (:meth:`~medattn.vocabulary.task_types.TaskType.problem`: binary has 1 output; multi-class
    and segmentation at least 2; class names, when given, name every output (binary: the positive class, or both))."""
    return task_type(task_type_name).problem(num_outputs, class_names)


@dataclass
class DataBundle:
    """The splits of one experiment and its task. ``skipped`` counts samples dropped by ``skip_bad``;
    ``warnings`` are sentences about defaults that may not fit the data (printed and kept in results.json);
    ``defaults`` the values a default chose for keys the config left out (``{"data.augment": "strong"}``),
    recorded with the run; ``preprocessing`` what the builder applied to a file to make an evaluation input
    (:class:`~medattn.vocabulary.preprocessing.Preprocessing`), stored with every checkpoint for predict and export;
    ``features`` the provenance of a bag cohort's training features (:func:`medattn.data.provenance.collect`),
    stored with the checkpoint so that eval, predict and explain refuse bags made otherwise."""

    train: Dataset
    val: Dataset
    test: Dataset
    task: TaskInfo
    skipped: int = 0
    warnings: list[str] = field(default_factory=list)
    defaults: dict = field(default_factory=dict)
    preprocessing: Preprocessing | None = None
    features: dict | None = None


def dataset_labels(dataset: Dataset) -> torch.Tensor:
    """(N, K) float labels (binary / multi-label) or (N,) class indices of a training set: the records'
    labels where the dataset keeps them (tables, bags), else each sample's ``label`` (synthetic data)."""
    records = getattr(dataset, "records", None)
    if records is not None and all(r.label is not None for r in records):
        return torch.stack([torch.as_tensor(r.label) for r in records])
    return torch.stack([torch.as_tensor(dataset[i]["label"]) for i in range(len(dataset))])


def collate(samples: list[dict]) -> dict:
    """Stack samples into a batch; bags of unequal length are zero-padded and get a (B, N_max) mask."""
    batch: dict = {
        "id": [s["id"] for s in samples],
        "patient": [s.get("patient", s["id"]) for s in samples],
        "label": torch.stack([s["label"] for s in samples]),
    }
    if "coords" not in samples[0]:
        batch["input"] = torch.stack([s["input"] for s in samples])
        return batch
    padded, coords, mask = pad_bags(samples)
    batch.update(input=padded, coords=coords, mask=mask)
    return batch


def pad_bags(samples: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Bags (``input`` (N_i, F), ``coords`` (N_i, 2)) zero-padded to the longest -> (features (B, N_max, F),
    coords (B, N_max, 2), mask (B, N_max) bool, True on real tiles)."""
    lengths = torch.tensor([s["input"].shape[0] for s in samples])
    first = samples[0]["input"]
    padded = first.new_zeros(len(samples), int(lengths.max()), first.shape[1])
    coords = first.new_zeros(len(samples), int(lengths.max()), 2)
    for i, sample in enumerate(samples):
        padded[i, : lengths[i]] = sample["input"]
        coords[i, : lengths[i]] = sample["coords"]
    return padded, coords, torch.arange(padded.shape[1])[None, :] < lengths[:, None]
