"""A model's predictions over a loader: every rank scores its share, all are gathered in dataset order.

The loop scores validation (every epoch) and test (the kept checkpoint) with :func:`predict`; ``medattn eval``
(:mod:`medattn.train.evaluate`) scores a trained model with it too.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from medattn.data import input_kinds
from medattn.runtime import distributed
from medattn.runtime.predictor import Predictor
from medattn.text import bars_off

from .objectives import Predictions


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
