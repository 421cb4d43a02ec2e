"""Patient-level train/val/test splits: stratified and seeded, from a split column, or k-fold.

No patient ever appears in two splits. Stratification is by patient: a patient's stratum is the
largest label key among its samples (so a patient with any positive sample counts as positive); if a
stratum is too small to stratify (fewer than two patients), the split falls back to a plain seeded
patient-level shuffle split.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ...errors import UserError

if TYPE_CHECKING:
    import torch

SPLIT_NAMES = {"train": "train", "training": "train", "val": "val", "valid": "val", "validation": "val",
               "test": "test", "testing": "test"}
SPLIT_KEYS = frozenset({"val_fraction", "test_fraction", "folds", "fold"})


def parse_split(value: str, where: str) -> str:
    """A split column's cell -> "train", "val" or "test"."""
    name = SPLIT_NAMES.get(value.strip().lower())
    if name is None:
        raise UserError(f"{where}: split {value!r} is not one of train, val, test")
    return name


def _fractions(cfg: dict) -> tuple[float, float]:
    """(val_fraction, test_fraction); ``test_fraction: 1`` (with ``val_fraction: 0``) makes every patient a test
    patient: an external cohort for ``medattn eval``; null is the default, 0.15."""
    val, test = (cfg.get(key) for key in ("val_fraction", "test_fraction"))
    if not all(value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))
               for value in (val, test)):
        raise UserError(f"val_fraction and test_fraction must be numbers, got {val!r} and {test!r}")
    val, test = 0.15 if val is None else float(val), 0.15 if test is None else float(test)
    if test == 1 and val == 0:
        return val, test
    if val < 0 or test < 0 or val + test >= 1:
        raise UserError(f"need val_fraction >= 0, test_fraction >= 0 and their sum < 1 (or test_fraction 1 and "
                        f"val_fraction 0: an all-test cohort for medattn eval), got {val}, {test}")
    return val, test


def _split_patients(patients: list[str], strata: list[str], fraction: float, seed: int) -> tuple[set, set]:
    """Split patient ids into (rest, held out) with ``fraction`` held out, stratified when possible."""
    from sklearn.model_selection import train_test_split

    if fraction == 0 or len(patients) < 2:
        return set(patients), set()
    n_out = max(1, round(fraction * len(patients)))
    if n_out >= len(patients):
        raise UserError(f"cannot hold out {fraction:.0%} of {len(patients)} patients and keep any for training")
    try:
        rest, out = train_test_split(patients, test_size=n_out, random_state=seed, stratify=strata)
    except ValueError:  # a stratum with one patient, or fewer held-out patients than strata
        rest, out = train_test_split(patients, test_size=n_out, random_state=seed)
    return set(rest), set(out)


def patient_strata(patients: Sequence[str], keys: Sequence[str]) -> dict[str, str]:
    """patient -> its stratum (the largest label key among its samples)."""
    strata: dict[str, str] = {}
    for patient, key in zip(patients, keys):
        strata[patient] = max(strata.get(patient, key), key)
    return strata


def assign_splits(patients: Sequence[str], keys: Sequence[str], cfg: dict, seed: int) -> list[str]:
    """One split name per sample, from patient ids and label keys (strings, for stratification).

    ``cfg`` keys: ``val_fraction`` and ``test_fraction`` (of the patients; default 0.15 each), or
    ``folds`` (k) and ``fold`` (0..k-1): k-fold cross-validation by patient (scikit-learn's
    ``StratifiedGroupKFold``, shuffled with ``seed``) where fold ``fold`` is the test set and the rest
    is split into train and val by ``val_fraction``.
    """
    val_fraction, test_fraction = _fractions(cfg)
    strata = patient_strata(patients, keys)
    unique = sorted(strata)
    if test_fraction == 1:
        return ["test"] * len(patients)
    if cfg.get("folds") is not None:
        test = _fold_patients(patients, keys, cfg, seed)
    else:
        _, test = _split_patients(unique, [strata[p] for p in unique], test_fraction, seed)
    rest = [p for p in unique if p not in test]
    val_share = val_fraction / (1 - (0 if cfg.get("folds") is not None else test_fraction))
    _, val = _split_patients(rest, [strata[p] for p in rest], min(val_share, 0.9), seed + 1)
    return ["test" if p in test else "val" if p in val else "train" for p in patients]


def _fold_patients(patients: Sequence[str], keys: Sequence[str], cfg: dict, seed: int) -> set[str]:
    from sklearn.model_selection import StratifiedGroupKFold

    folds, fold = cfg.get("folds"), cfg.get("fold", 0)
    n_patients = len(set(patients))
    if not isinstance(folds, int) or not 2 <= folds <= n_patients:
        raise UserError(f"folds must be an int from 2 to the number of patients ({n_patients}), got {folds!r}")
    if not isinstance(fold, int) or not 0 <= fold < folds:
        raise UserError(f"fold must be an int from 0 to {folds - 1}, got {fold!r}")
    counts = Counter(keys)
    rarest, smallest = min(counts.items(), key=lambda item: item[1])
    if smallest < folds:  # each fold's test set needs a case of every class
        raise UserError(f"folds={folds}: the rarest class ({rarest!r}) has {smallest} case(s), so it cannot appear in "
                        f"every fold's test set; use at most {smallest} folds")
    splitter = StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=seed)
    _, test_index = list(splitter.split(list(patients), list(keys), groups=list(patients)))[fold]
    return {patients[i] for i in test_index}


def splits_from_column(patients: Sequence[str], names: Sequence[str], wheres: Sequence[str]) -> list[str]:
    """Check that no patient is in two splits of a given split column; -> the names."""
    first: dict[str, tuple[str, str]] = {}
    for patient, name, where in zip(patients, names, wheres):
        seen = first.setdefault(patient, (name, where))
        if seen[0] != name:
            raise UserError(f"{where}: patient {patient!r} is in split {name!r} here and in {seen[0]!r} at "
                            f"{seen[1]}; a patient must stay in one split")
    return list(names)


def split_records(records: Sequence, cfg: dict, seed: int, column: Sequence[str] | None = None,
                  stratum: Callable[[torch.Tensor], str] | None = None) -> dict[str, list]:
    """Records (with ``.patient``, ``.label``, ``.where``) -> {"train": [...], "val": [...], "test": [...]}.

    ``column``: the split of each record from the table's split column; else :func:`assign_splits`, stratified by
    ``stratum(label)`` (:meth:`medattn.data.cohort.labels.LabelSpec.stratum`; default the label itself).
    """
    if column is not None:
        if cfg.get("folds") is not None:
            raise UserError("give either a split column or folds, not both")
        names = splits_from_column([r.patient for r in records], column, [r.where for r in records])
    else:
        keys = [str(r.label.tolist()) if stratum is None else stratum(r.label) for r in records]
        names = assign_splits([r.patient for r in records], keys, cfg, seed)
    out: dict[str, list] = {"train": [], "val": [], "test": []}
    for record, name in zip(records, names):
        out[name].append(record)
    return out  # an empty training split is fine for evaluation; training refuses it (medattn.train.fit)
