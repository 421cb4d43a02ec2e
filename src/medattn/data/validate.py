"""Every file of every split decoded once before compute is spent on it.

A table's files are checked cheaply when the data are built (headers, sizes; with ``skip_bad`` decoded too);
damage past what a header shows (a PNG whose data stream breaks, a NIfTI cut short inside its data) would
otherwise surface in the test split after hours of training. :func:`decode_all` reads every sample of every
split that loads from files (:class:`~medattn.data.tables.RecordDataset`) once, with a progress bar on a
terminal, and stops at the first that fails with the one-line error naming its file and table row. Generated
data (the synthetic kinds) come from memory and are not read again.
"""

from __future__ import annotations

from tqdm import tqdm

from .base import DataBundle
from .tables import RecordDataset


def file_backed(bundle: DataBundle) -> list[tuple[str, RecordDataset]]:
    """(split name, dataset) for the splits whose samples are read from files."""
    return [(name, getattr(bundle, name)) for name in ("train", "val", "test")
            if isinstance(getattr(bundle, name), RecordDataset)]


def decode_all(bundle: DataBundle, progress: bool = True) -> int:
    """Load every sample of every file-backed split once (see the module docstring); -> samples read. A bad file
    raises its one-line :class:`~medattn.errors.UserError` (rerun with ``--skip-bad`` to leave such files out)."""
    splits = file_backed(bundle)
    total = sum(len(dataset) for _, dataset in splits)
    with tqdm(total=total, desc="checking files", leave=False, disable=not progress or total == 0) as bar:
        for _, dataset in splits:
            for index in range(len(dataset)):
                dataset[index]  # decodes: a bad file raises its one-line error naming file and row
                bar.update()
    return total
