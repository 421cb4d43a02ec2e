"""Training tasks (a config's ``task``: ``supervised``, ``diffusion_*``): one list,
:data:`medattn.catalogue.TRAINING_TASKS`.

The config's rule, the diffusion stages' table and the loop's look-up are read from it; the scan reads every module of
``src/medattn`` with :mod:`ast` and fails on any other tuple, list, set or dict literal that names two training tasks
(a second list that could drift from the first).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from medattn.catalogue import DIFFUSION_STAGES, TRAINING_TASKS
from medattn.config.keys import DIFFUSION_TASKS, KEYS, TASK_SECTIONS
from medattn.errors import UserError

SRC = Path(__file__).resolve().parents[2] / "src" / "medattn"


def _lists_of_tasks() -> list[str]:
    """``path:line`` of every literal collection in ``src/medattn`` holding two or more training-task names."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            items = node.keys if isinstance(node, ast.Dict) else \
                node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else []
            names = {i.value for i in items if isinstance(i, ast.Constant) and i.value in TRAINING_TASKS}
            if len(names) >= 2:
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    return found


def test_one_list_of_training_tasks():
    assert _lists_of_tasks() == [f"catalogue.py:{_registry_line()}"]


def _registry_line() -> int:
    tree = ast.parse((SRC / "catalogue.py").read_text(encoding="utf-8"))
    return next(node.value.lineno for node in tree.body
                if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "TRAINING_TASKS")


def test_the_others_read_it():
    from medattn.diffusion.model import STAGES

    assert set(DIFFUSION_TASKS) == set(DIFFUSION_STAGES) == set(STAGES) == set(TASK_SECTIONS["diffusion"])
    assert set(DIFFUSION_STAGES) < set(TRAINING_TASKS)
    rule = KEYS["task"].rule
    assert all(rule.test(name) for name in TRAINING_TASKS) and not rule.test("diffusion")


def test_every_training_task_resolves():
    from medattn.train.training_tasks import training_task

    for name in TRAINING_TASKS:
        cls = training_task(name)
        assert all(callable(getattr(cls, hook)) for hook in ("check", "plan", "build", "batches", "batch_loss",
                                                               "validate", "results", "test")), name
    with pytest.raises(UserError, match="task must be one of"):
        training_task("binary")  # a task type, not a training task
