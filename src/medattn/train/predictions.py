"""One split's predictions: a model's over a loader, every rank scoring its share and all gathered in dataset order
(:func:`predict`), and the per-sample record they fill (:class:`Predictions`), which every objective scores
(:mod:`medattn.train.objectives`).

The loop scores validation (every epoch) and test (the kept checkpoint) with :func:`predict`; ``medattn eval``
(:mod:`medattn.train.evaluate`) scores a trained model with it too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from medattn.data import input_kinds
from medattn.runtime import distributed
from medattn.runtime.predictor import Predictor
from medattn.text import bars_off


@dataclass
class Predictions:
    """One split's per-sample results in dataset order (see the objective's :meth:`outputs`).

    Classification: ``outputs`` = probabilities (N, K), ``labels`` (N, K) or (N,) class indices.
    Segmentation: ``outputs`` = per-class Dice (N, K), ``labels`` = label voxels per class (N, K).
    Survival: ``outputs`` = risk scores (N, 1), ``labels`` = ``[time, event]`` (N, 2).
    Regression: ``outputs`` = predicted values in the targets' units (N, K), ``labels`` = the targets (N, K).
    """

    ids: list[str]
    patients: list[str]
    outputs: np.ndarray
    labels: np.ndarray
    loss: float
    statistic: np.ndarray | None = None  # (N,) a trivial statistic per sample (image mean, bag size), or None


def refuse_classification_options(task, loss: str | None, label_smoothing: float, pos_weight) -> None:
    """A UserError when ``train.loss`` names no loss of the task's type (:attr:`TaskType.losses`, null always fits) or
    ``train.label_smoothing``/``train.pos_weight`` are set: the options of a task without classes (survival,
    regression) checked by its objective's ``create``."""
    from medattn.errors import UserError
    from medattn.vocabulary import task_types

    losses = task_types.of(task.task_type).losses
    if loss not in (None, *losses) or label_smoothing or pos_weight is not None:
        raise UserError(f"train.label_smoothing and train.pos_weight do not apply to a {task.task_type} task "
                        f"(leave them null / 0); train.loss: null" + (f", {' or '.join(losses)}" if losses else ""))


@torch.no_grad()
def predict(predictor: Predictor, loader: DataLoader, objective, desc: str = "eval", progress: bool = True) -> \
        Predictions:
    """Run ``predictor`` (:class:`medattn.runtime.predictor.Predictor`: precision, sliding window) over a loader,
    every rank its share, and gather all predictions in dataset order; ``objective`` gives the per-sample loss
    and outputs (:func:`objective_for`)."""
    indices, outputs, labels, losses, ids, patients, statistics = [], [], [], [], [], [], []
    for batch in tqdm(loader, desc=desc, leave=False, disable=bars_off(progress and distributed.is_main())):
        batch = predictor.to_device(batch)
        logits = predictor.logits(batch)
        losses.append(objective.loss(logits, batch["label"], per_sample=True).float().cpu())
        indices.append(batch["index"].cpu())
        output, label = objective.outputs(logits, batch["label"])
        outputs.append(output.cpu())
        labels.append(label.cpu())
        statistics.append(input_kinds.of(predictor.input_kind).statistic(batch).cpu())  # what a model should not follow
        ids += batch["id"]
        patients += batch["patient"]
    index = distributed.all_gather_rows(torch.cat(indices))
    output = distributed.all_gather_rows(torch.cat(outputs))
    label = distributed.all_gather_rows(torch.cat(labels))
    ids = distributed.all_gather_strings(ids)
    patients = distributed.all_gather_strings(patients)
    loss = distributed.all_gather_rows(torch.cat(losses))
    statistic = distributed.all_gather_rows(torch.cat(statistics))
    # DistributedSampler pads the last ranks with repeats: keep each sample once, in dataset order.
    order = np.argsort(index.numpy(), kind="stable").tolist()
    first = [i for n, i in enumerate(order) if n == 0 or index[i] != index[order[n - 1]]]
    return Predictions(ids=[ids[i] for i in first], patients=[patients[i] for i in first],
                       outputs=output[first].numpy(), labels=label[first].numpy(), loss=float(loss[first].mean()),
                       statistic=statistic[first].numpy())
