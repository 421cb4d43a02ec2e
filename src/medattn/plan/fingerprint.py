"""A data set's fingerprint (nnU-Net's habit): the numbers a training plan is derived from, read from the built
data, deterministic for a given data set and config.

=====================  ====================================================================================
``cases``              training / validation / test cases
``positive_share``     binary and multi-label tasks: the share of positive training labels per output
``input_kind``         ``image2d``, ``volume3d`` or ``bag``; ``input_shape`` the model's input (C, *S) or (F,)
``intensity``          images and volumes: min, max, mean and std of the first ``SAMPLE`` training inputs as
                       the model sees them (after the reader's scaling and normalisation)
``bag_sizes``          bags: min, median and max instances per training bag (the whole bag, as stored)
``survival``           survival tasks, per split: cases, events, censored and the C-index's comparable pairs
                       (:func:`medattn.metrics_survival.comparable_pairs`)
=====================  ====================================================================================
"""

from __future__ import annotations

import math

import numpy as np
import torch

from medattn.data import input_kinds
from medattn.data.base import DataBundle, dataset_labels
from medattn.vocabulary import task_types

SAMPLE = 32  # training inputs read for the intensity summary


def _bag_size(dataset, index: int) -> int:
    """Instances of training bag ``index`` as stored (the record's file when the dataset keeps records)."""
    records = getattr(dataset, "records", None)
    if records is not None:  # wsi_bags: read from the HDF5 headers, whatever max_instances keeps
        from medattn.data.kinds.bags import slide_shape

        return sum(slide_shape(path)[0] for path in records[index].paths)
    return int(dataset[index]["input"].shape[0])


#: The fingerprint's section of the event counts per split, for a task whose labels are ``[time, event]``.
EVENTS = "survival"


def survival_counts(dataset, causes: list[str] | None = None) -> dict:
    """Cases, events, censored cases and comparable pairs of a survival split (labels ``[time, event]``); with the
    names of ``causes`` (competing risks: the event is a cause 1..K) also the events per cause."""
    from medattn.metrics_survival import comparable_pairs

    if len(dataset) == 0:
        return {"cases": 0, "events": 0, "censored": 0, "pairs": 0, **({"by_cause": {}} if causes else {})}
    labels = dataset_labels(dataset).reshape(len(dataset), -1).double().numpy()
    events = int((labels[:, 1] > 0).sum())
    found = {"cases": len(labels), "events": events, "censored": len(labels) - events,
             "pairs": comparable_pairs(labels[:, 0], labels[:, 1] > 0)}
    if causes:
        found["by_cause"] = {name: int((labels[:, 1] == k).sum()) for k, name in enumerate(causes, 1)}
    return found


def fingerprint(bundle: DataBundle) -> dict:
    """The fingerprint of ``bundle`` (module docstring); JSON-able."""
    task, train = bundle.task, bundle.train
    found = {"cases": {"train": len(train), "val": len(bundle.val), "test": len(bundle.test)},
             "task_type": task.task_type, "input_kind": task.input_kind, "input_shape": list(task.input_shape)}
    kind = task_types.of(task.task_type)
    if kind.thresholds and len(train):  # 0/1 per output
        labels = dataset_labels(train).reshape(len(train), -1).float()
        found["positive_share"] = [round(float(v), 4) for v in labels.mean(0)]
    if kind.events:
        causes = list(task.class_names) or [str(k) for k in range(1, task.num_outputs + 1)] if kind.causes else None
        found[EVENTS] = {name: survival_counts(split, causes) for name, split in
                             (("train", train), ("val", bundle.val), ("test", bundle.test))}
    if input_kinds.of(task.input_kind).instances:
        sizes = np.array([_bag_size(train, i) for i in range(len(train))])
        found["bag_sizes"] = {"min": int(sizes.min()), "median": int(np.median(sizes)), "max": int(sizes.max())}
    elif len(train):
        with torch.random.fork_rng():  # augmentation draws: the training order stays as seeded
            torch.manual_seed(0)
            values = torch.stack([train[i]["input"].float() for i in range(min(SAMPLE, len(train)))])
        found["intensity"] = {"min": float(values.min()), "max": float(values.max()),
                              "mean": float(values.mean()), "std": float(values.std())}
        found["voxels"] = math.prod(task.input_shape[1:])
    return found
