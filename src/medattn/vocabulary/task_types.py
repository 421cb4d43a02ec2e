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

import numpy as np

from medattn.errors import UserError

from .competing import CompetingRisks
from .task_type import TaskType

__all__ = ["TASK_TYPES", "UNLABELLED", "TaskType", "names_where", "of", "task_type"]


class Binary(TaskType):
    """One finding present or absent: one output, the probability of the positive class (a sigmoid); the label is
    0/1; a threshold decides."""

    name, noun = "binary", "a binary task"
    table = classes = thresholds = outputs_are_probabilities = True
    fixed_outputs = 1
    metric, metric_label, chance_score = "auroc", "AUROC", 0.5
    objective, figure = "medattn.train.objectives:Classification", "roc"
    writer = "medattn.train.report:write_classes"
    score_error = "medattn.metrics:auroc_error_of_labels"

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

    def decide(self, values, names, cut):
        return [names[int(np.argmax(values))]]

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


class Ordinal(Multiclass):
    """One of K ordered classes (ISUP or Gleason grade groups, a tumour grade), read as a multi-class label is; a
    rank-consistent cumulative-link head: output 0 is one score s, outputs 1..K-1 the thresholds' parameters z, ordered
    by construction (t_1 = z_1, t_k = t_(k-1) + softplus(z_k)); P(y > k) = sigmoid(s - t_(k+1)), k = 0..K-2, falls in
    k for every input, and the outputs are the class probabilities, its differences. Scored by the quadratic weighted
    kappa of the most probable grade (docs/ordinal.md)."""

    name, noun = "ordinal", "an ordinal task"
    metric, metric_label, chance_score = "qwk", "QWK", 0.0
    objective, figure = "medattn.train.ordinal_objective:Ordinal", "confusion"
    figure_caption = ("Confusion counts on the test split: each true grade (row) against the most probable predicted "
                      "grade (column); the title gives the quadratic weighted kappa with its 95% interval and n.")
    writer = "medattn.train.ordinal_objective:write_ordinal"
    question = "how advanced the finding is"

    @staticmethod
    def cumulative_logits(logits):
        """Logits (B, K, ...) -> the K-1 logits of P(y > k), k = 0..K-2 (B, K-1, ...), falling in k."""
        import torch
        import torch.nn.functional as F

        return logits[:, :1] - torch.cat([logits[:, 1:2], F.softplus(logits[:, 2:])], 1).cumsum(1)

    def activate(self, logits, target_mean=(), target_std=()):
        """P(y = k) = P(y > k-1) - P(y > k) = sigmoid(a) sigmoid(-b) (1 - e^-g), g = a - b = softplus(z) >= 0: no
        difference of two probabilities near 1, and each factor from exp, log and where, which onnxruntime computes
        to float32's precision where its Sigmoid, Softplus and Tanh do not (an exported graph agrees to 1e-4
        relative down to probabilities of 1e-6)."""
        import torch

        def sigmoid(x):
            e = (-x.abs()).exp()
            return torch.where(x >= 0, 1 / (1 + e), e / (1 + e))

        def series(x, log):  # 1 - e^-x (log False) or log(1 + x) (log True), a series where x is small
            small = x * (1 - x / 2 + x * x / 3) if log else x * (1 - x / 2 + x * x / 6)
            return torch.where(x < 1e-2, small, (1 + x).log() if log else 1 - (-x).exp())

        z = logits[:, 2:]
        gap = z.clamp_min(0) + series((-z.abs()).exp(), True)  # softplus(z)
        cumulative = self.cumulative_logits(logits)
        middle = sigmoid(cumulative[:, :-1]) * sigmoid(-cumulative[:, 1:]) * series(gap, False)
        return torch.cat([sigmoid(-cumulative[:, :1]), middle, sigmoid(cumulative[:, -1:])], 1)

    def decision_columns(self, names):
        return ["pred_label", "expected_grade"]

    def decide(self, values, names, cut):
        values = np.asarray(values, dtype=np.float64).ravel()
        return [names[int(values.argmax())], f"{float(values @ np.arange(len(values))):.6f}"]

    def summary(self, values, names):
        values = np.asarray(values, dtype=np.float64).ravel()
        return f"{super().summary(values, names)}, expected grade {values @ np.arange(len(values)):.2f} (0 = first)"


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
    case_ends, case_output = ("highest", "lowest"), 0  # the highest and lowest risks, the map: what raises it

    def activate(self, logits, target_mean=(), target_std=()):
        return logits

    def columns(self, names):
        return ["risk"]

    def decision_columns(self, names):
        return []  # a risk score: nothing to decide

    def summary(self, values, names):
        values = np.asarray(values, dtype=np.float64).ravel()
        return f"slide risk = {values[0]:.3g} (log relative risk, higher = earlier event)"

    def case_text(self, outputs, label, names, time_label="time"):
        risk, (time, event) = float(np.ravel(outputs)[0]), np.asarray(label, dtype=np.float64).ravel()[:2]
        return (f"risk = {risk:.2f} (log relative risk, higher = earlier event), observed {time_label} = "
                f"{time:.4g}, {'event' if event else 'censored'}")

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
    case_ends, case_output = ("highest", "lowest"), 0  # the first target's highest and lowest predictions

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

    def case_text(self, outputs, label, names, time_label="time"):
        values, truth = np.ravel(outputs), np.asarray(label, dtype=np.float64).ravel()
        names = list(names) if names else [f"output {k}" for k in range(len(values))]
        return ", ".join(f"predicted {name} = {value:.4g} (true {true:.4g}; column {name}, in its unit)"
                         for name, value, true in zip(names, values, truth))

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
                                                          Regression, CompetingRisks, Unlabelled, Ordinal)}
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
