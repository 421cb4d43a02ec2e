"""Whether the training run of a model learned, for what predict and explain write (the verdict travels).

A run's verdict (:mod:`medattn.train.verdict`) is in its ``results.json``; a checkpoint folder sits in its run folder
as ``<run>/checkpoints/<name>``, so predict and explain of a checkpoint read the verdict there
(:func:`recorded_learning`), and ``medattn export`` copies it into the exported file's metadata (``learning``, read by
:func:`medattn.deploy.format.learning_of`). A model whose run **did not learn** still predicts (its outputs are what
they are), but the terminal says so in a :func:`warning_line` and every row of the CSV carries :data:`COLUMN` =
:func:`column_value`. Where no verdict is recorded (a checkpoint copied out of its run folder, a run stopped before
its test), nothing is claimed either way.
"""

from __future__ import annotations

import json
from pathlib import Path

#: The CSV column of predict and explain that marks a model whose run did not learn (present only then).
COLUMN = "run_verdict"


def recorded_learning(folder: Path) -> dict | None:
    """The ``learning`` verdict of the run holding the checkpoint ``folder`` (``<run>/checkpoints/<name>``), from
    its results.json; None when there is none or it cannot be read."""
    folder = Path(folder)
    results = folder.parent.parent / "results.json" if folder.parent.name == "checkpoints" else None
    if results is None or not results.is_file():
        return None
    try:
        learning = json.loads(results.read_text()).get("learning")
    except (OSError, ValueError, AttributeError):
        return None
    return learning if isinstance(learning, dict) else None


def not_learned(learning: dict | None) -> list[str] | None:
    """The reasons the run did not learn, or None when it learned or nothing is recorded."""
    if not isinstance(learning, dict) or learning.get("learned", True) is not False:
        return None
    reasons = learning.get("reasons")
    return [str(r) for r in reasons] if isinstance(reasons, list) and reasons else ["did not learn"]


def column_value(reasons: list[str]) -> str:
    """The :data:`COLUMN` cell of every row: ``DID NOT LEARN: <reasons>``."""
    return "DID NOT LEARN: " + "; ".join(reasons)


def warning_line(reasons: list[str]) -> str:
    """The terminal line of predict and explain for a model whose run did not learn."""
    return (f"WARNING: this model's training run did not learn ({'; '.join(reasons)}): its outputs are not a "
            f"result; every row says so in the {COLUMN} column")
