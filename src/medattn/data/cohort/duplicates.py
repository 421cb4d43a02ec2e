"""The same input file in several table rows: refuse conflicts, drop repeats, keep every file in one split.

Two rows use the same file when their paths hold the same content (:func:`medattn.data.files.content_keys`:
the same real path, or equal bytes). For rows that share an input file (and the side, for left/right
halves):

* different labels (a segmentation row's label is its label map's content): a bad sample, reported
  with both rows (an error, or with ``skip_bad`` both rows are dropped);
* different values in the split column: a bad sample in the same way (one file cannot be in two
  splits);
* otherwise a warning, and their patients become one: every record of those patients takes the
  patient id of the earliest row, so the split, the per-patient bootstrap and the predictions treat
  them as one patient (the same image under two ids is most often one person registered twice);
* a row whose inputs are all the same as an earlier row's (a repeat) is dropped with a warning: it
  adds no information and would be counted twice in training and in the test metrics.

One sample whose inputs hold one file twice (a slide listed twice for a patient, a volume subtracted
from itself) is a bad sample.
"""

from __future__ import annotations

import logging

from ..files import content_keys
from ..tables import BadSamples, Record

log = logging.getLogger("medattn.data")


def _find(parent: dict[str, str], patient: str) -> str:
    while parent.setdefault(patient, patient) != patient:
        patient = parent[patient]
    return patient


def resolve_duplicates(records: list[Record], column: list[str] | None, bad: BadSamples, inputs: int | None = None
                       ) -> tuple[list[Record], list[str] | None]:
    """-> (records without repeats and conflicts, the split column aligned with them); see the module
    docstring. ``inputs``: how many leading paths of a record are inputs (default all); the paths after
    them are label files (a segmentation pair's label map), compared by content like the label tensor."""
    keys = content_keys(p for r in records for p in r.paths)
    splits = column or [None] * len(records)

    def files(record: Record) -> list[tuple[str, object]]:
        return [(keys[p], record.extra.get("side")) for p in record.paths[:inputs]]

    def label(record: Record) -> tuple:
        return tuple(record.label.flatten().tolist()), tuple(keys[p] for p in record.paths[len(files(record)):])

    first: dict[tuple, int] = {}  # (file key, side) -> index of the first record using it
    conflicted: set[tuple] = set()
    dropped: set[int] = set()
    parent: dict[str, str] = {}
    for i, record in enumerate(records):
        own = [key for key, _ in files(record)]
        if len(set(own)) < len(own):
            twice = next(p for p, key in zip(record.paths, own) if own.count(key) > 1)
            bad.report(f"{record.where}: {twice} is the same file as another input of this sample; fix the table")
            dropped.add(i)
            continue
        for file, path in zip(files(record), record.paths):
            j = first.setdefault(file, i)
            if j == i:
                continue
            other = records[j]
            what = "labels" if label(record) != label(other) else "splits" if splits[i] != splits[j] else None
            if what is None and file not in conflicted:
                parent[_find(parent, record.patient)] = _find(parent, other.patient)
                continue
            bad.report(f"{record.where} and {other.where}: {path} is the same file in both rows, with different "
                       f"{what or 'labels or splits in other rows'}; fix the rows")
            conflicted.add(file)
            dropped |= {i, j}
            break
    repeats: dict[tuple, int] = {}
    for i, record in enumerate(records):
        if i in dropped:
            continue
        j = repeats.setdefault(tuple(files(record)), i)
        if j != i:
            log.warning("%s repeats %s (the same file%s): the repeat is dropped", record.where, records[j].where,
                        "s" if len(files(record)) > 1 else "")
            dropped.add(i)
    merged = {r.patient: _find(parent, r.patient) for r in records if _find(parent, r.patient) != r.patient}
    for patient, group in merged.items():
        log.warning("patient %r shares a file with patient %r: they are split as one patient, %r", patient, group,
                    group)
    for record in records:
        record.patient = merged.get(record.patient, record.patient)
    kept = [i for i in range(len(records)) if i not in dropped]
    return [records[i] for i in kept], None if column is None else [column[i] for i in kept]
