"""``build_datasets``: one entry point from a data config to a :class:`~medattn.data.base.DataBundle`."""

from __future__ import annotations

import importlib

from ..catalogue import DATA_KINDS
from ..errors import UserError
from .base import DataBundle


def available_data_kinds() -> list[str]:
    """The values ``data_cfg["kind"]`` may take, sorted."""
    return sorted(DATA_KINDS)


def build_datasets(data_cfg: dict, seed: int = 0, skip_bad: bool = False) -> DataBundle:
    """Build the train/val/test datasets and the task of ``data_cfg`` (see ``docs/data.md`` for every key).

    ``seed`` drives patient-level splits and the synthetic generators (unless the config sets its own
    ``seed``). With ``skip_bad`` samples whose files are missing, unreadable or invalid are dropped and
    counted in ``DataBundle.skipped``; without it the first one raises :class:`~medattn.errors.UserError`.
    ``folds``/``fold`` (k-fold cross-validation by patient) work for every kind: table kinds split their
    rows, the synthetic kinds pool their splits first (:mod:`medattn.data.cohort.folds`).
    """
    if not isinstance(data_cfg, dict):
        raise UserError(f"the data config must be a mapping with a 'kind' key, got {type(data_cfg).__name__}")
    kind = data_cfg.get("kind")
    if kind not in DATA_KINDS:
        raise UserError(f"unknown data kind {kind!r}; available: {', '.join(available_data_kinds())}")
    module_name, function = DATA_KINDS[kind]
    module = importlib.import_module(module_name)
    builder = getattr(module, function)
    if data_cfg.get("folds") is not None and "folds" not in getattr(module, "KEYS", ()):
        from .cohort.folds import pooled_folds  # a kind without a patient table: its splits are pooled, then folded
        from .cohort.splits import SPLIT_KEYS

        split_cfg = {k: v for k, v in data_cfg.items() if k in SPLIT_KEYS}
        rest = {k: v for k, v in data_cfg.items() if k not in SPLIT_KEYS}
        return pooled_folds(builder(rest, seed=seed, skip_bad=skip_bad), split_cfg, seed, kind)
    return builder(data_cfg, seed=seed, skip_bad=skip_bad)
