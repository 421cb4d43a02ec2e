"""Task types (:mod:`medattn.vocabulary.task_types`): every registered type answers every question, an unknown name is
refused, and no code outside the vocabulary branches on a type's name.

Generated from :data:`~medattn.vocabulary.task_types.TASK_TYPES`: each type is asked each question of
:data:`QUESTIONS` (parametrised over both) with inputs derived from the type itself (its output count, its label
form), so a new type is checked without a row here. The scan reads every module of ``src/medattn`` with :mod:`ast`
and fails on a comparison (``==``, ``!=``, ``in``, ``not in``, with a literal or a tuple, list or set of them), a
``match`` case, a table keyed by a type's name (``{"survival": ...}``) or a look-up with one (``T["survival"]``,
``T.get("survival")``) anywhere outside ``src/medattn/vocabulary/``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from name_scan import name_branches

from medattn.errors import UserError
from medattn.vocabulary.task_types import TASK_TYPES, TaskType, names_where, task_type

SRC = Path(__file__).resolve().parents[2] / "src" / "medattn"
VOCABULARY = SRC / "vocabulary"
#: Words that are a task type's name but mean something else where they stand: path -> the source text of the line.
NOT_TASK_TYPES = {"cli.py": ['"binary": "medattn.bench.binary"']}  # the bench named binary (BinaryFormer)

BOOLS = ("labelled", "table", "numeric", "classes", "class_index", "thresholds", "exclusive", "events", "causes",
         "voxel_labels", "outputs_are_probabilities", "dicom_result")


def _outputs(kind: TaskType) -> int:
    return kind.fixed_outputs or max(kind.min_outputs, 2)


def _label_cells(kind: TaskType) -> list[float]:
    """Parsed label cells that fit ``kind``: ``[time, event]``, one class index, or one value per output."""
    if kind.events:
        return [3.5, 1.0]
    return [1.0] if kind.class_index else [1.0] * _outputs(kind)


def _resolves(kind: TaskType, attribute: str) -> bool:
    if not kind.labelled:
        return getattr(kind, attribute) is None
    return callable(kind.component(attribute))


def _objective(kind: TaskType) -> bool:
    """The objective it names exists, is created through ``create`` and agrees with the type on the metric."""
    if not kind.labelled:
        with pytest.raises(UserError, match="unlabelled"):
            kind.objective_class()
        return True
    cls = kind.objective_class()
    return (all(callable(getattr(cls, name, None)) for name in ("create", "metric_of", "score", "outputs", "loss"))
            and (cls.metric, cls.metric_label, cls.outputs_are_probabilities)
            == (kind.metric, kind.metric_label, kind.outputs_are_probabilities))


def _columns(kind: TaskType) -> bool:
    names = [f"c{k}" for k in range(_outputs(kind))]
    columns, decisions = kind.columns(names), kind.decision_columns(names)
    row = kind.row(np.linspace(0.1, 0.9, _outputs(kind)), names)
    return (all(isinstance(c, str) and c for c in [*columns, *decisions]) and len(set(columns)) == len(columns)
            and list(row) == columns[:len(row)] and all(isinstance(v, str) for v in row.values())
            and (not kind.thresholds or any(c.startswith("threshold_") for c in decisions)))


def _decide(kind: TaskType) -> bool:
    """``predict``'s decision cells of a sample: one per decision column (with thresholds where the type has them;
    a segmentation's predict writes label maps instead)."""
    names, values = [f"c{k}" for k in range(_outputs(kind))], np.linspace(0.1, 0.9, _outputs(kind))
    values = values / values.sum() if kind.exclusive else values
    cut = [0.5] * len(names) if kind.thresholds else None
    return kind.voxel_labels or len(kind.decide(values, names, cut)) == len(kind.decision_columns(names))


def _activate(kind: TaskType) -> bool:
    logits = torch.randn(3, _outputs(kind))
    out = kind.activate(logits, [1.0] * _outputs(kind), [2.0] * _outputs(kind))
    if kind.outputs_are_probabilities or kind.exclusive:
        inside = bool(((out >= 0) & (out <= 1)).all())
        sums = not kind.exclusive or torch.allclose(out.sum(1), torch.ones(3))
        return out.shape == logits.shape and inside and sums
    return out.shape == logits.shape and bool(torch.isfinite(out).all())


def _labels(kind: TaskType) -> bool:
    """A label that fits becomes a tensor with a stratum, one that does not is a ValueError; the placeholder label
    has the label's form; a valid task has no problem, a wrong output count one."""
    k = _outputs(kind)
    ok = kind.problem(k, []) is None and (kind.fixed_outputs is None or isinstance(kind.problem(k + 1, []), str))
    placeholder = kind.placeholder_label(k, (4, 4))
    ok &= torch.is_tensor(placeholder)
    if not kind.table:
        return ok
    label = kind.tensor(_label_cells(kind), k)
    ok &= torch.is_tensor(label) and isinstance(kind.stratum(label), str)
    ok &= placeholder.dtype == label.dtype  # predict's placeholder: the label's dtype (its outputs only)
    if not kind.numeric:
        with pytest.raises(ValueError):
            kind.tensor([7.0] * len(_label_cells(kind)), k)
    names, count = kind.table_spec(["a", "b"] if kind.events else ["a"], None, None, {0.0, 1.0})
    return ok and isinstance(names, list) and count == (1 if kind.events else count) and count >= 1


def _words(kind: TaskType) -> bool:
    """What explain, a map's title, a report's case and the plan say."""
    names = [f"c{k}" for k in range(_outputs(kind))]
    values = np.linspace(0.1, 0.9, _outputs(kind))
    return (isinstance(kind.summary(values, names), str) and kind.summary(values, names)
            and kind.shows.format(name="x") and isinstance(kind.question, str) and kind.question
            and isinstance(kind.label_text([1] + [0] * (_outputs(kind) - 1), names), str)
            and kind.noun.startswith(("a ", "an ")) and kind.name in kind.noun)


def _readouts(kind: TaskType) -> bool:
    from medattn.models.wsi import READOUTS

    return bool(kind.readouts) and set(kind.readouts) <= set(READOUTS)


def _metric(kind: TaskType) -> bool:
    if not kind.labelled:
        return kind.metric is None
    return (isinstance(kind.metric, str) and isinstance(kind.metric_label, str)
            and (kind.chance_score is None or isinstance(kind.chance_score, float)))


def _case_scores(kind: TaskType) -> bool:
    scores = kind.case_scores(np.random.default_rng(0).random((5, _outputs(kind))))
    return scores.shape == (5,)


def _cases(kind: TaskType) -> bool:
    """Which ends of its scores a report draws, the output a case's map explains, and a case's words."""
    k = _outputs(kind)
    label = _label_cells(kind) if kind.table else [1.0] * k
    text = kind.case_text(np.linspace(0.1, 0.9, k), label, [f"c{j}" for j in range(k)], "os_months (months)")
    return (set(kind.case_ends) <= {"highest", "lowest"} and isinstance(text, str) and bool(text)
            and (kind.case_output is None or 0 <= kind.case_output < k))


def _score_error(kind) -> bool:
    """None, or a function of (score, labels) that is 0 for a perfect score, grows as the score leaves it, and is
    None where the labels hold one class (the recipe search's one-standard-error rule)."""
    if kind.score_error is None:
        return True
    error = kind.component("score_error")
    labels = np.array([0, 1] * 15)
    return (error(1.0, labels) == 0.0 and 0 < error(0.9, labels) < error(0.7, labels)
            and error(0.8, np.ones(30)) is None)


#: Each question a task type answers -> a check that the answer has the right kind.
QUESTIONS = {
    "flags": lambda kind: all(isinstance(getattr(kind, name), bool) for name in BOOLS),
    "name": lambda kind: TASK_TYPES[kind.name] is kind and task_type(kind.name) is kind,
    "outputs": lambda kind: kind.fixed_outputs is None or kind.fixed_outputs >= kind.min_outputs,
    "objective": _objective,
    "writer": lambda kind: _resolves(kind, "writer"),
    "score_error": _score_error,
    "losses": lambda kind: isinstance(kind.losses, tuple) and all(isinstance(x, str) for x in kind.losses),
    "metric": _metric,
    "columns": _columns,
    "decide": _decide,
    "activation": _activate,
    "labels": _labels,
    "words": _words,
    "readouts": _readouts,
    "case_scores": _case_scores,
    "cases": _cases,
}


@pytest.mark.parametrize("question", QUESTIONS)
@pytest.mark.parametrize("name", TASK_TYPES)
def test_every_task_type_answers_every_question(name, question):
    assert QUESTIONS[question](TASK_TYPES[name]), f"{name}: {question}"


def test_the_flags_name_the_types_they_did():
    assert names_where("table") == ("binary", "multiclass", "multilabel", "survival", "regression", "competing_risks",
                                          "ordinal")
    assert names_where("causes") == ("competing_risks",)
    assert names_where("thresholds") == ("binary", "multilabel")
    assert names_where("classes") == ("binary", "multiclass", "multilabel", "ordinal")
    assert [n for n, t in TASK_TYPES.items() if not t.labelled] == ["unlabelled"]


def test_an_unknown_task_type_is_refused_not_run_through_a_sigmoid():
    from medattn.data.base import task_problem
    from medattn.runtime.predictor import Predictor, probabilities

    with pytest.raises(UserError, match=r"unknown task type 'ranking'; known: binary, multiclass"):
        task_type("ranking")
    with pytest.raises(UserError, match="unknown task type"):
        probabilities(torch.zeros(2, 3), "ranking")
    with pytest.raises(UserError, match="unknown task type"):
        Predictor(torch.nn.Linear(3, 3), "ranking", "image2d")
    with pytest.raises(UserError, match="unknown task type"):
        task_problem("ranking", 3, [])


# --- no branch on a task type's name outside the vocabulary -------------------------------------------------------

def type_branches(code: str, names=tuple(TASK_TYPES)) -> list[int]:
    """The lines of ``code`` that decide by a task type's name (:func:`name_scan.name_branches`)."""
    return name_branches(code, names)


def test_the_scanner_finds_each_way_of_branching_on_a_name():
    branches = {
        'if task.task_type == "survival":\n    pass': 1,
        'x = a if prep.task_type != "regression" else b': 1,
        'ok = task_type in ("binary", "multilabel")': 1,
        'ok = task_type not in ["multiclass"]': 1,
        'ok = t in {"segmentation", "survival"}': 1,
        'ok = "binary" == t': 1,
        'TABLE = {"binary": 1, "survival": 2}\nx = TABLE[task_type]': 2,
        'x = COLUMNS["regression"]': 1,
        'x = found.get("survival", {})': 1,
        'match task_type:\n    case "multiclass":\n        pass': 1,
        'match t:\n    case "binary" | "multilabel":\n        pass': 2,
        'a = k == "binary"\nb = "unlabelled" != k': 2,
    }
    for code, count in branches.items():
        assert len(type_branches(code)) == count, code
    clean = ('task = TaskInfo("binary", "bag", 1, (16,))\ncfg = {"task_type": "survival"}\nif kind == "cosine":\n'
             '    pass\nkind = task_types.of(task.task_type)\nif kind.thresholds:\n    pass\nNAMES = {"x": 1}\n'
             'name = "regression" if numeric else "binary"')
    assert type_branches(clean) == []


def test_no_code_outside_the_vocabulary_branches_on_a_task_type_name():
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        if VOCABULARY in path.parents:
            continue
        relative = path.relative_to(SRC).as_posix()
        lines = path.read_text(encoding="utf-8").splitlines()
        hits = [n for n in type_branches("\n".join(lines))
                if not any(text in lines[n - 1] for text in NOT_TASK_TYPES.get(relative, []))]
        if hits:
            found[relative] = hits
    assert found == {}, (
        f"branches on a task type's name outside medattn/vocabulary/: {found}; ask the task type instead (an "
        f"attribute or method of TaskType, medattn.vocabulary.task_types, docs/architecture.md 'A task type')")
