"""The preprocessing description, one per trained model: how a file becomes the model's input (:class:`Preprocessing`).

A leaf data type on the vocabulary floor: the data builders make it (:meth:`Preprocessing.of`), the data layer's
task (``data.base.DataBundle``) and input kinds (``data.input_kinds``) name it, and the data layer reads files as it
says (:mod:`medattn.data.preprocessing`: checking a stored one, the inference reader). Here it imports nothing of
medattn, so nothing that names it closes a circle.

Fields (JSON, :meth:`Preprocessing.to_dict`):

* ``data_kind``, ``input_kind`` (image2d, volume3d, bag), ``task_type``, ``num_outputs``, ``class_names``,
  ``input_shape`` ((C, H, W), (1, H, W, D) or (F,)), ``synthetic``;
* images: ``mean``, ``std`` (per channel, applied to the [0, 1] image after channel matching and the
  antialiased bilinear resize to ``input_shape``);
* volumes: ``spacing`` (mm, or null: no resampling), ``normalize`` (zscore, percentile, none),
  ``subtract`` (a sample is two volumes, the second subtracted from the first: DUKE's
  ``subtract_column``), ``split_sides`` (each volume gives a left and a right sample);
* 2D models trained on slices of volumes (``nifti_slices``, ``synthetic_mri_slices``): ``slice_axis``
  (0, 1, 2 of the RAS+ grid). A volume file is resampled (``spacing``), normalised as a whole, cropped or
  padded in-plane to ``input_shape[1:]`` and given to the model with the slicing axis last, (1, h, w, S),
  as validation volumes were; a 2D image file is one slice (grey, [0, 1], normalised as a whole, cropped
  or padded to ``input_shape[1:]``);
* bags: the feature dimension is ``input_shape[0]``;
* ``unpredictable``: when no single file is prepared as training's inputs were (MedMNIST arrays are scaled
  over their split), the one-line reason predict and export give; empty otherwise.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol


class Task(Protocol):
    """The task fields a description copies (a :class:`~medattn.data.base.TaskInfo`)."""

    task_type: str
    input_kind: str
    num_outputs: int
    input_shape: tuple[int, ...]
    class_names: list[str]
    synthetic: bool
    target_mean: list[float]
    target_std: list[float]


VERSION = 1


@dataclass(frozen=True)
class Preprocessing:
    """What turns a file into the model's input (see the module docstring)."""

    data_kind: str
    input_kind: str
    task_type: str
    num_outputs: int
    class_names: tuple[str, ...]
    input_shape: tuple[int, ...]
    synthetic: bool = False
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    spacing: tuple[float, ...] | None = None
    normalize: str = "none"
    subtract: bool = False
    split_sides: bool = False
    slice_axis: int | None = None
    unpredictable: str = ""
    target_mean: tuple[float, ...] = ()
    target_std: tuple[float, ...] = ()

    @classmethod
    def of(cls, data_kind: str, task: Task, **steps) -> Preprocessing:
        """The description of a builder's data: its kind, its task's fields and the ``steps`` it applies
        (``mean``/``std``, ``spacing``, ``normalize``, ...; sequences become tuples)."""
        steps = {k: tuple(float(x) for x in v) if isinstance(v, (list, tuple)) else v for k, v in steps.items()}
        return cls(data_kind=data_kind, input_kind=task.input_kind, task_type=task.task_type,
                   num_outputs=task.num_outputs, class_names=tuple(task.class_names),
                   input_shape=tuple(task.input_shape), synthetic=task.synthetic,
                   target_mean=tuple(task.target_mean), target_std=tuple(task.target_std), **steps)

    @property
    def inputs_per_sample(self) -> int:
        """Files per sample: 2 with ``subtract`` (the second is subtracted from the first), else 1."""
        return 2 if self.subtract else 1

    @property
    def output_names(self) -> list[str]:
        """One name per output: the class names when there is one per output, else "0", "1", ..."""
        names = list(self.class_names)
        return names if len(names) == self.num_outputs else [str(i) for i in range(self.num_outputs)]

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        return {"version": VERSION, **{k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}}
