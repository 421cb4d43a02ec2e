"""Task types: what a label is and what a model's outputs mean, one class per type, and the one place that knows them
apart.

A task type (``TaskInfo.task_type``, stored in checkpoints, preprocessing descriptions and exported files by its
name) answers every question the code above asks about it: how label cells become a label tensor and how splits
stratify by it, the output activation (logits -> probabilities, a risk or values), the prediction columns, whether
thresholds apply, the validation metric, the report's figures, where a random scorer's metric lies, what explain
shows, which bag readouts the recipe search tries, and which objective trains it (:attr:`TaskType.objective`, a
``module:Class`` path the training code imports, so that this floor imports no torch, models or training code).

Code elsewhere asks the object, ``task_type(task.task_type).thresholds``, and never compares the name:
``tests/house/test_task_types.py`` fails on a comparison, ``match``, table or look-up by a task type's name
anywhere in ``src/`` outside this package. A new task type is a subclass here, one line in :data:`TASK_TYPES`, and
(where no existing one fits) its objective module and a metric module.
"""

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
    #: The validation metric a predictor unrelated to the labels centres on (None: judged by another floor).
    chance_score: ClassVar[float | None] = None
    #: The objective that trains it (``module:Class``; its ``create(task, loss, label_smoothing, pos_weight)``).
    objective: ClassVar[str | None] = None
    #: The figure of a scored split beside ``predictions_<split>.csv`` (``roc``: roc_<split>.png), or None.
    figure: ClassVar[str | None] = None
    #: What writes a scored split's files (``module:function``, called ``(pred, task, split, out_dir, result,
    #: heading, time_label)``): ``predictions_<split>.csv`` and the :attr:`figure`.
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
        """What the ``module:name`` path in ``attribute`` (:attr:`objective`, :attr:`writer`) names, imported now."""
        path = getattr(self, attribute)
        if path is None:
            raise UserError(f"{self.noun} has no {attribute}")
        module, _, name = path.partition(":")
        return getattr(importlib.import_module(module), name)


class Binary(TaskType):
    """One finding present or absent: one output, the probability of the positive class (a sigmoid); the label is
    0/1; a threshold decides."""

    name, noun = "binary", "a binary task"
    table = classes = thresholds = outputs_are_probabilities = True
    fixed_outputs = 1
    metric, metric_label, chance_score = "auroc", "AUROC", 0.5
    objective, figure = "medattn.train.objectives:Classification", "roc"
    writer = "medattn.train.report:write_classes"

    def name_counts(self, num_outputs: int) -> tuple[int, ...]:
        return (0, 1, 2)  # the positive class, or both classes

    def table_spec(self, columns, classes, num_classes, seen):
        if len(columns) != 1:
            raise UserError(f"a {self.name} task needs one label column, got {columns}")
        return ([classes[1]] if classes is not None else list(columns)), 1

    def label_text(self, values: list[int], names: list[str]) -> str:
        if len(names) == 1:
            return names[0] if values[0] else f"no {names[0]}"
        return names[values[0]] if values[0] < len(names) else str(values[0])


class Multiclass(TaskType):
    """One of K mutually exclusive classes: K outputs, a softmax over them; the label is one class index; the
    prediction is the most probable class (no threshold)."""

    name, noun = "multiclass", "a multiclass task"
    table = classes = class_index = exclusive = outputs_are_probabilities = True
    min_outputs = 2
    metric, metric_label, chance_score = "auroc", "AUROC", 0.5
    objective, figure = "medattn.train.objectives:Classification", "roc"
    writer = "medattn.train.report:write_classes"
    question = "which finding is present"

    def activate(self, logits, target_mean=(), target_std=()):
        return logits.softmax(1)

    def decision_columns(self, names):
        return ["pred_label"]

    def summary(self, values, names):
        values = np.asarray(values, dtype=np.float64).ravel()
        names = list(names) if names else [f"output {k}" for k in range(len(values))]
        best = int(values.argmax())
        return f"slide: {names[best]} (p = {values[best]:.2f})"

    def case_scores(self, outputs):
        return np.asarray(outputs).reshape(len(outputs), -1).max(axis=1)

    def table_spec(self, columns, classes, num_classes, seen):
        if len(columns) != 1:
            raise UserError(f"a {self.name} task needs one label column, got {columns}")
        count = len(classes) if classes is not None else int(num_classes or (max(seen, default=0) + 1))
        return (list(classes) if classes is not None else [str(i) for i in range(count)]), count

    def tensor(self, values, num_outputs):
        import torch

        if values[0] >= num_outputs:
            raise ValueError(f"label {int(values[0])} is out of range for {num_outputs} classes")
        return torch.tensor(int(values[0]), dtype=torch.int64)

    def placeholder_label(self, num_outputs, spatial):
        import torch

        return torch.tensor(0)

    def label_text(self, values, names):
        return names[values[0]] if values[0] < len(names) else str(values[0])


class Multilabel(TaskType):
    """Several findings, each present or absent: one sigmoid output per label column, each with its threshold."""

    name, noun = "multilabel", "a multilabel task"
    table = classes = thresholds = outputs_are_probabilities = True
    metric, metric_label, chance_score = "auroc", "AUROC", 0.5
    objective, figure = "medattn.train.objectives:Classification", "roc"
    writer = "medattn.train.report:write_classes"
    question = "which findings are present"

    def table_spec(self, columns, classes, num_classes, seen):
        return list(columns), len(columns)


class Segmentation(TaskType):
    """A class per voxel: logits per voxel (a softmax over K classes, 0 = background); the label is a label map;
    scored by the mean foreground Dice."""

    name, noun = "segmentation", "a segmentation task"
    exclusive = voxel_labels = True
    min_outputs = 2
    metric, metric_label = "dice", "Dice"
    objective = "medattn.train.objectives:Segmentation"
    writer = "medattn.train.report:write_segmentation"
    losses = ("dice_ce", "dice")

    def activate(self, logits, target_mean=(), target_std=()):
        return logits.softmax(1)

    def stratum(self, label) -> str:
        return ""  # a label map: no stratum

    def placeholder_label(self, num_outputs, spatial):
        import torch

        return torch.zeros(spatial, dtype=torch.int64)


class Survival(TaskType):
    """Time to an event: one output, the risk (the log relative risk of a Cox model, higher = earlier event), not a
    probability; the label is ``[time, event]``; scored by Harrell's C-index."""

    name, noun = "survival", "a survival task"
    table = numeric = events = True
    fixed_outputs = 1
    metric, metric_label, chance_score = "c_index", "C-index", 0.5
    objective, figure = "medattn.train.survival_objective:Survival", "km"
    writer = "medattn.train.report:write_survival"
    losses = ("cox", "discrete_time")
    readouts = ("attention", "max", "mean")
    question = "how large a burden drives the hazard"
    shows = "risk"

    def activate(self, logits, target_mean=(), target_std=()):
        return logits

    def columns(self, names):
        return ["risk"]

    def decision_columns(self, names):
        return []  # a risk score: nothing to decide

    def summary(self, values, names):
        values = np.asarray(values, dtype=np.float64).ravel()
        return f"slide risk = {values[0]:.3g} (log relative risk, higher = earlier event)"

    def problem(self, num_outputs, class_names):
        if num_outputs != 1:
            return f"a survival task has 1 output (the risk), not {num_outputs}"
        return super().problem(num_outputs, class_names)

    def name_counts(self, num_outputs):
        return (0, 1)

    def table_spec(self, columns, classes, num_classes, seen):
        if len(columns) != 2:
            raise UserError(f"a survival task needs a time and an event column, got {columns}")
        return [], 1

    def tensor(self, values, num_outputs):
        import torch

        time, event = values
        if time < 0:
            raise ValueError(f"follow-up time {time:g} is negative")
        if event not in (0.0, 1.0):
            raise ValueError(f"event {event:g} is not 0 (censored) or 1 (event observed); map other codes with "
                             f"data.event_values, e.g. {{2: 1, 1: 0}}")
        return torch.tensor(values, dtype=torch.float32)

    def stratum(self, label):
        return str(int(label[1]))  # the event flag: events spread over the splits


class Regression(TaskType):
    """Continuous targets (a biomarker level, an age): one output per target, the predicted value in the target's
    units (the model predicts standardised targets, mapped back by the training targets' mean and std)."""

    name, noun = "regression", "a regression task"
    table = numeric = True
    metric, metric_label, chance_score = "r2", "R^2", 0.0
    objective, figure = "medattn.train.regression_objective:Regression", "predicted"
    writer = "medattn.train.report:write_regression"
    dicom_result = False
    readouts = ("attention", "max", "mean", "count")
    question = "how much of the bag is positive"
    shows = "predicted {name}"

    def activate(self, logits, target_mean=(), target_std=()):
        if len(target_std) == 0:
            return logits
        std, mean = logits.new_tensor(list(target_std)), logits.new_tensor(list(target_mean))
        return logits * std + mean

    def columns(self, names):
        return [f"pred_{n}" for n in names]

    def decision_columns(self, names):
        return []  # values: nothing to decide

    def summary(self, values, names):
        values = np.asarray(values, dtype=np.float64).ravel()
        names = list(names) if names else [f"output {k}" for k in range(len(values))]
        return "slide " + ", ".join(f"predicted {name} = {value:.4g}" for name, value in zip(names, values))

    def table_spec(self, columns, classes, num_classes, seen):
        return list(columns), len(columns)

    def tensor(self, values, num_outputs):
        import torch

        return torch.tensor(values, dtype=torch.float32)

    def stratum(self, label):
        return ""

    def targets(self, labels) -> dict:
        """Per target over the training labels (N, K): mean and population std (a constant target gets 1, so it is
        only centred)."""
        import torch

        values = labels.double()
        std = values.std(0, correction=0)
        std = torch.where(std > 0, std, torch.ones_like(std))
        return {"target_mean": values.mean(0).tolist(), "target_std": std.tolist()}


class Unlabelled(TaskType):
    """No labels: the volumes the diffusion stages learn from (``catalogue.UNLABELLED_KINDS``); no outputs, nothing
    a supervised objective trains on."""

    name, noun = "unlabelled", "an unlabelled task"
    labelled = dicom_result = False
    min_outputs = 0
    shows = "{name}"

    def activate(self, logits, target_mean=(), target_std=()):
        return logits

    def decision_columns(self, names):
        return []

    def objective_class(self):
        raise UserError("the data kind gives unlabelled volumes, nothing a supervised model learns from: they train "
                        "the diffusion stages (task: diffusion_vqae or diffusion_transformer; docs/diffusion.md)")


#: Every task type by its stored name.
TASK_TYPES: dict[str, TaskType] = {t.name: t() for t in (Binary, Multiclass, Multilabel, Segmentation, Survival,
                                                          Regression, Unlabelled)}
#: The name of the unlabelled type (the data kinds without labels give it).
UNLABELLED = Unlabelled.name


def task_type(name: str) -> TaskType:
    """The task type stored as ``name``; a one-line UserError naming the known ones for any other."""
    found = TASK_TYPES.get(name) if isinstance(name, str) else None
    if found is None:
        raise UserError(f"unknown task type {name!r}; known: {', '.join(TASK_TYPES)}")
    return found


def names_where(question: str) -> tuple[str, ...]:
    """The names of the task types whose ``question`` attribute is true (``names_where("table")``)."""
    return tuple(name for name, t in TASK_TYPES.items() if getattr(t, question))


#: ``task_types.of(name)``: the look-up as code above calls it (cf. ``input_kinds.of``).
of = task_type
