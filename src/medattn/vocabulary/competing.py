"""The competing-risks task type (registered in :data:`medattn.vocabulary.task_types.TASK_TYPES`): a follow-up that
ends with the first of K causes (death from cancer, death from another cause) or is censored.

Labels are ``[time, cause]``: ``data.time_column`` and ``data.event_column``, whose cells are 0 (censored) or the
cause 1..K of the event that ended follow-up; ``data.cause_names`` names the causes in order (cause 1 first: the
cause of interest), else they are named ``1``..``K`` (K the largest cause in the table). The model has K outputs,
one log cause-specific hazard ratio per cause (column k - 1 for cause k), trained by the cause-specific Cox loss
(:func:`medattn.train.competing_loss.cause_specific_cox`); the objective and writer are
:mod:`medattn.train.competing_objective`, the metrics :mod:`medattn.metrics_competing`.
"""

from __future__ import annotations

import numpy as np

from medattn.errors import UserError

from .task_type import TaskType


class CompetingRisks(TaskType):
    """Time to the first of K competing events: K outputs, one log cause-specific hazard ratio per cause (higher =
    earlier event of that cause), not probabilities; the label is ``[time, cause]`` (cause 0 censored); scored by the
    cause-specific C-index of cause 1, the cause of interest."""

    name, noun = "competing_risks", "a competing_risks task"
    table = numeric = events = causes = True
    metric, metric_label, chance_score = "cause_c_index", "cause-1 C-index", 0.5
    objective, figure = "medattn.train.competing_objective:CompetingRisks", "cif"
    figure_caption = ("Cumulative incidence (Aalen-Johansen) of cause 1 in the test cases whose cause-1 risk lies "
                      "above and below the training split's median: the share who had cause 1 by each time, a patient "
                      "who died of another cause no longer at risk of it (docs/survival.md, Competing risks).")
    writer = "medattn.train.competing_objective:write_competing"
    losses = ("cox",)
    readouts = ("attention", "max", "mean")
    question = "how large a burden drives the hazard of cause 1"
    shows = "risk of {name}"
    case_ends, case_output = ("highest", "lowest"), 0  # the highest and lowest cause-1 risks; the map: what raises it

    def activate(self, logits, target_mean=(), target_std=()):
        return logits

    def columns(self, names):
        return [f"risk_{n}" for n in names]

    def decision_columns(self, names):
        return []  # risk scores: nothing to decide

    def summary(self, values, names):
        values = np.asarray(values, dtype=np.float64).ravel()
        names = list(names) if names else [str(k + 1) for k in range(len(values))]
        return "slide " + ", ".join(f"risk of {n} = {v:.3g}" for n, v in zip(names, values)) + \
            " (log cause-specific hazard ratio)"

    def name_counts(self, num_outputs):
        return (0, num_outputs)

    def table_spec(self, columns, classes, num_classes, seen):
        """``classes`` are the cause names (``data.cause_names``); without them K is the largest cause in ``seen``
        (the event column's values)."""
        if len(columns) != 2:
            raise UserError(f"a {self.name} task needs a time and an event column, got {columns}")
        if classes is not None:
            return list(classes), len(classes)
        count = int(max((v for v in seen if np.isfinite(v) and v == int(v)), default=1))
        return [str(k) for k in range(1, max(count, 1) + 1)], max(count, 1)

    def tensor(self, values, num_outputs):
        import torch

        time, cause = values
        if time < 0:
            raise ValueError(f"follow-up time {time:g} is negative")
        if cause != int(cause) or not 0 <= cause <= num_outputs:
            raise ValueError(f"event {cause:g} is not 0 (censored) or a cause 1..{num_outputs} (data.cause_names "
                             f"declares the causes)")
        return torch.tensor(values, dtype=torch.float32)

    def stratum(self, label):
        return str(int(label[1]))  # the cause: each cause spread over the splits

    def placeholder_label(self, num_outputs, spatial):
        import torch

        return torch.zeros(2)  # [time, cause]

    def case_scores(self, outputs):
        return np.asarray(outputs).reshape(len(outputs), -1)[:, 0]  # the risk of cause 1

    def case_text(self, outputs, label, names, time_label="time"):
        risks, (time, cause) = np.ravel(outputs), np.asarray(label, dtype=np.float64).ravel()[:2]
        names = list(names) if len(names) == len(risks) else [str(k + 1) for k in range(len(risks))]
        ended = "censored" if cause == 0 else f"event of {names[int(cause) - 1] if cause <= len(names) else cause}"
        return (f"risk of {names[0]} = {risks[0]:.2f} (log cause-specific hazard ratio), observed {time_label} = "
                f"{time:.4g}, {ended}")

    def label_text(self, values, names):
        cause = int(values[1]) if len(values) > 1 else int(values[0])
        return "censored" if cause == 0 else (names[cause - 1] if cause <= len(names) else f"cause {cause}")
