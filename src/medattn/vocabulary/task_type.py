"""The base class of the task types (:mod:`medattn.vocabulary.task_types`): every question the code asks about a task
type, with the answer of a task whose outputs are independent 0/1 probabilities (binary, multi-label). A task type
overrides what differs; the registry and the concrete types are :mod:`medattn.vocabulary.task_types`."""

from __future__ import annotations

import importlib
from typing import ClassVar

import numpy as np

from medattn.errors import UserError


class TaskType:
    """A task type: the labels of one sample and what the model's K outputs mean. The base class answers for
    tasks whose outputs are independent 0/1 probabilities (binary, multi-label); subclasses change what differs."""

    name: ClassVar[str] = ""
    #: The type in a sentence ("a multi-class task").
    noun: ClassVar[str] = ""
    #: Labels exist (a supervised objective trains on them); False for the diffusion stages' volumes.
    labelled: ClassVar[bool] = True
    #: A label table (CSV columns) can describe it; segmentation's labels are label maps.
    table: ClassVar[bool] = False
    #: Label cells are real numbers (a follow-up time, a biomarker level), not class numbers.
    numeric: ClassVar[bool] = False
    #: Labels are classes (0/1 per output or one class index): class balance, ROC curves, calibration.
    classes: ClassVar[bool] = False
    #: The label is one class index (an int64 scalar), not 0/1 per output.
    class_index: ClassVar[bool] = False
    #: Each output is a two-class problem decided at a threshold (Youden's on validation; ``--threshold``);
    #: ``train.pos_weight`` weighs its positives.
    thresholds: ClassVar[bool] = False
    #: The outputs are one softmax over the K classes (mutually exclusive classes), not a sigmoid per output.
    exclusive: ClassVar[bool] = False
    #: Labels are ``[time, event]`` (event 1 observed, 0 censored): events per split, event balance, risk groups.
    events: ClassVar[bool] = False
    #: The event cell names the cause 1..K of the event (0 censored), one output per cause (competing risks):
    #: events counted per cause; no Breslow baseline, Brier score or calibration of one risk.
    causes: ClassVar[bool] = False
    #: Labels are label maps, one class per voxel: patches and sliding windows, label maps out, no explain.
    voxel_labels: ClassVar[bool] = False
    #: The model's outputs are probabilities (calibration, operating points, case heatmaps of the top scores).
    outputs_are_probabilities: ClassVar[bool] = False
    #: The model has exactly this many outputs (None: any number from :attr:`min_outputs`).
    fixed_outputs: ClassVar[int | None] = None
    min_outputs: ClassVar[int] = 1
    #: The validation metric: its key in results.json and metrics.csv, and its label in words.
    metric: ClassVar[str | None] = None
    metric_label: ClassVar[str | None] = None
    #: What gives the standard error of a validation score (``module:function``, called ``(score, labels)`` -> the
    #: error, or None where the labels leave it undefined), for the recipe search's one-standard-error rule; None:
    #: the metric has no closed-form error here.
    score_error: ClassVar[str | None] = None
    #: The validation metric a predictor unrelated to the labels centres on (None: judged by another floor).
    chance_score: ClassVar[float | None] = None
    #: The objective that trains it (``module:Class``; its ``create(task, loss, label_smoothing, pos_weight)``).
    objective: ClassVar[str | None] = None
    #: The figure of a scored split beside ``predictions_<split>.csv`` (``roc``: roc_<split>.png), or None.
    figure: ClassVar[str | None] = None
    #: What the figure shows, in a sentence for report.html (None: the page's own, ``train.page.CAPTIONS``).
    figure_caption: ClassVar[str | None] = None
    #: What writes a scored split's files (``module:function``, called ``(pred, task, split, folder, result,
    #: heading, time_label)``, writing through ``folder``, an :class:`~medattn.outputs.OutputFolder`):
    #: ``predictions_<split>.csv`` and the :attr:`figure`.
    writer: ClassVar[str | None] = None
    #: ``train.loss`` names a loss of this type (None: the type's default is the only one).
    losses: ClassVar[tuple[str, ...]] = ()
    #: A DICOM input gets a DICOM result (Structured Report) of the prediction.
    dicom_result: ClassVar[bool] = True
    #: The bag readouts the recipe search tries, the plan's default first, and what the label asks of a bag.
    readouts: ClassVar[tuple[str, ...]] = ("max", "attention", "mean")
    question: ClassVar[str] = "whether a finding is present"
    #: What explain and a slide map's title show per output: ``P({name})``, ``risk``, ``predicted {name}``.
    shows: ClassVar[str] = "P({name})"
    #: The output a report's case map explains (None: the explainer's default, the predicted class).
    case_output: ClassVar[int | None] = None

    # --- outputs ---------------------------------------------------------------------------------------------------
    def activate(self, logits, target_mean=(), target_std=()):
        """Logits (B, K) or per voxel (B, K, *spatial) (float32) -> the task's outputs (a sigmoid per output here)."""
        return logits.sigmoid()

    def columns(self, names: list[str]) -> list[str]:
        """The prediction columns of the outputs, one per output named by ``names``."""
        return [f"prob_{n}" for n in names]

    def decision_columns(self, names: list[str]) -> list[str]:
        """The columns ``medattn predict`` adds to decide from the outputs."""
        return [f"pred_{n}" for n in names] + [f"threshold_{n}" for n in names]

    def decide(self, values, names: list[str], cut) -> list:
        """The cells of :meth:`decision_columns` for one sample's outputs ``values`` (``cut``: the thresholds where
        :attr:`thresholds`, else None): 0/1 per output at its threshold, then the thresholds; none without ``cut``."""
        if cut is None:
            return []
        return [int(v >= t) for v, t in zip(values, cut)] + [f"{t:.6f}" for t in cut]

    def row(self, values, names: list[str]) -> dict[str, str]:
        """A sample's outputs as prediction columns (:meth:`columns`) and their text."""
        values = np.asarray(values, dtype=np.float64).ravel()
        return {column: f"{v:.6f}" for column, v in zip(self.columns(names), values)}

    def summary(self, values, names: list[str]) -> str:
        """A sample's prediction in words, for a map's title: ``slide P(tumour) = 0.87``."""
        values = np.asarray(values, dtype=np.float64).ravel()
        names = list(names) if names else [f"output {k}" for k in range(len(values))]
        return "slide " + ", ".join(f"{self.shows.format(name=n)} = {v:.2f}" for n, v in zip(names, values))

    def case_scores(self, outputs: np.ndarray) -> np.ndarray:
        """(N,) the score by which a report picks its cases to draw: the first output here."""
        return np.asarray(outputs).reshape(len(outputs), -1)[:, 0]

    @property
    def case_ends(self) -> tuple[str, ...]:
        """Which ends of :meth:`case_scores` a report draws ``eval.heatmaps`` test cases from: ``highest`` (the
        highest scored), and ``lowest`` too where both ends say something (a risk, a value); empty: none drawn.
        Here the highest, for outputs that are probabilities (and a segmentation's best and worst by Dice)."""
        return ("highest",) if self.outputs_are_probabilities or self.voxel_labels else ()

    def case_text(self, outputs, label, names: list[str], time_label: str = "time") -> str:
        """A drawn test case's prediction and truth for its map's title (``outputs`` (K,), ``label`` as the report
        gives it, a class label in words here; ``time_label`` the time column's axis label): ``p = 0.87, label
        tumour``."""
        score = self.case_scores(np.asarray(outputs, dtype=np.float64).reshape(1, -1))[0]
        label = np.asarray(label).ravel().tolist()
        return f"p = {score:.2f}, label {label[0] if len(label) == 1 else label}"

    # --- labels ----------------------------------------------------------------------------------------------------
    def problem(self, num_outputs: int, class_names: list[str]) -> str | None:
        """What makes the output count and class names contradict this type (an edited checkpoint), or None."""
        if self.fixed_outputs is not None and num_outputs != self.fixed_outputs:
            return f"{self.noun} has {self.fixed_outputs} output, not {num_outputs}"
        if num_outputs < self.min_outputs:
            return f"{self.noun} has at least {self.min_outputs} outputs, not {num_outputs}"
        if len(class_names) not in self.name_counts(num_outputs):
            return f"{len(class_names)} class name(s) for {num_outputs} output(s) of {self.noun}"
        return None

    def name_counts(self, num_outputs: int) -> tuple[int, ...]:
        """How many class names a task of ``num_outputs`` may have: none, or one per output."""
        return (0, num_outputs)

    def table_spec(self, columns: list[str], classes: list[str] | None, num_classes: int | None,
                   seen: set[float]) -> tuple[list[str], int]:
        """The class names and output count of a table's label ``columns`` (``classes``/``num_classes`` as
        declared, ``seen`` the parsed values); a UserError when the columns do not fit."""
        if len(columns) != 1:
            raise UserError(f"a {self.name} task needs one label column, got {columns}")
        return list(columns), len(columns)

    def tensor(self, values: list[float], num_outputs: int):
        """Parsed label cells -> the label tensor; ValueError when they do not fit (0/1 per output here)."""
        import torch

        if any(v not in (0.0, 1.0) for v in values):
            shown = int(values[0]) if len(values) == 1 else [int(v) for v in values]
            raise ValueError(f"label {shown} is not 0/1, as a {self.name} task needs")
        return torch.tensor(values, dtype=torch.float32)

    def stratum(self, label) -> str:
        """The key splits stratify by: the label itself here."""
        return str(label.tolist())

    def targets(self, labels) -> dict:
        """``TaskInfo`` fields the training labels (N, K) set (regression: the targets' mean and std); none here."""
        return {}

    def placeholder_label(self, num_outputs: int, spatial: tuple[int, ...]):
        """The label of a sample predict reads (it has none): zeros of the label's shape."""
        import torch

        return torch.zeros(num_outputs)

    def label_text(self, values: list[int], names: list[str]) -> str:
        """A class label in words, for a report's case: the names of the outputs that are 1 (multi-label)."""
        present = [names[k] if k < len(names) else str(k) for k, v in enumerate(values) if v]
        return ", ".join(present) if present else "none"

    def objective_class(self):
        """The class :attr:`objective` names (imported here, at run time, by the training code that asks)."""
        return self.component("objective")

    def component(self, attribute: str):
        """What the ``module:name`` path in ``attribute`` (:attr:`objective`, :attr:`writer`, :attr:`score_error`)
        names, imported now."""
        path = getattr(self, attribute)
        if path is None:
            raise UserError(f"{self.noun} has no {attribute}")
        module, _, name = path.partition(":")
        return getattr(importlib.import_module(module), name)
