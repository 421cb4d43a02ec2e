"""One sample before loading (:class:`Record`): a leaf data type that the label parsers, the table readers, the
readers of one file and the kind builders all name, so it sits on the vocabulary floor below every one of them (in
``data/tables.py`` it closed a circle: the labels annotate with it, the tables import the labels).

``medattn.data.tables.Record`` is this class too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass
class Record:
    """One sample before loading: where it comes from (``where`` = "file.csv row N") and its label."""

    id: str
    patient: str
    where: str
    paths: tuple[Path, ...]
    label: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)
