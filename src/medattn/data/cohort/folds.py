"""k-fold cross-validation for data kinds that draw their samples from a seed (the synthetic generators).

Table kinds split their rows by patient themselves (``folds``/``fold`` in :mod:`medattn.data.cohort.splits`).
A synthetic kind has fixed train/val/test sizes instead; with ``folds`` set, :func:`build_datasets`
builds it as usual and :func:`pooled_folds` pools the three splits (``num_samples`` train + val + test
cases) and splits the pool again by patient with :func:`~medattn.data.cohort.splits.assign_splits`, exactly
as a table is split: fold ``fold`` of ``folds`` (scikit-learn's ``StratifiedGroupKFold``, shuffled
with the run seed, stratified by the label for classification) is the test set, and ``val_fraction``
(default 0.15) of the remaining patients, drawn with seed + 1, is the validation set that picks the
best epoch; the rest trains. Every case is rendered once here to read its patient and label (kept in
the generator's cache, which training reuses). Samples keep the processing of the role they take in
the fold: training augmentation (the train split's ``finish``) for the training part, the plain
processing for validation and test.
"""

from __future__ import annotations

import copy

from torch.utils.data import ConcatDataset, Dataset, Subset

from ...errors import UserError
from ...vocabulary import task_types
from ..base import DataBundle
from ..seeded import SyntheticDataset
from .splits import SPLIT_KEYS, assign_splits


class _Finished(Dataset):
    """``dataset``'s samples passed through ``finish`` (or unchanged when it is None)."""

    def __init__(self, dataset: Dataset, finish) -> None:
        self.dataset, self.finish = dataset, finish

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict:
        sample = self.dataset[index]
        return sample if self.finish is None else self.finish(sample)


def pooled_folds(bundle: DataBundle, split_cfg: dict, seed: int, kind: str) -> DataBundle:
    """The fold of ``split_cfg`` (``folds``, ``fold``, ``val_fraction``) over the pooled splits of ``bundle``."""
    unknown = sorted(set(split_cfg) - (SPLIT_KEYS - {"test_fraction"}))
    if unknown:
        raise UserError(f"data kind {kind!r} with folds takes fold and val_fraction, not {', '.join(unknown)}")
    parts = (bundle.train, bundle.val, bundle.test)
    if not all(isinstance(part, SyntheticDataset) for part in parts):
        raise UserError(f"data kind {kind!r} has fixed splits and takes no folds")
    raw = []
    for part in parts:
        plain = copy.copy(part)  # shares the cache; the role's processing is applied below
        plain.finish = None
        raw.append(plain)
    pool = ConcatDataset(raw)
    patients, keys = [], []
    for i in range(len(pool)):
        sample = pool[i]
        patients.append(sample.get("patient", sample["id"]))
        keys.append("" if task_types.of(bundle.task.task_type).voxel_labels else str(sample["label"].tolist()))
    names = assign_splits(patients, keys, {"val_fraction": 0.15, **split_cfg}, seed)
    roles = {name: [i for i, n in enumerate(names) if n == name] for name in ("train", "val", "test")}
    if not roles["val"]:
        raise UserError(f"data kind {kind!r} with folds: the validation part is empty (val_fraction "
                        f"{split_cfg.get('val_fraction')}); the best epoch is chosen on it")
    views = [_Finished(Subset(pool, roles[name]), part.finish) for name, part in zip(("train", "val", "test"), parts)]
    return DataBundle(*views, task=bundle.task, skipped=bundle.skipped, defaults=bundle.defaults,
                      preprocessing=bundle.preprocessing)
