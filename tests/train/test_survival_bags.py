"""Survival losses for bags (issue 51): the Cox loss over a batch of whole bags run one at a time, event-balanced
batches, the discrete-time (logistic-hazard) likelihood of a proportional-odds head, each against a slow or
hand-computed reference."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
import yaml

from medattn.cli import main
from medattn.data.base import TaskInfo, collate
from medattn.errors import UserError
from medattn.models import create_model
from medattn.runtime.predictor import forward
from medattn.train.objectives import objective_for
from medattn.train.survival_bags import EventBalancedSampler, forward_each
from medattn.train.survival_loss import (
    baseline_logits,
    cox_partial_likelihood,
    discrete_time_nll,
    logistic_hazard_loss,
    survival_curves,
    time_bin_index,
    time_bins,
)

KIND = "bag"


def _slow_cox(risk, time, event):
    """Breslow's negative partial log-likelihood by its definition, one risk set at a time."""
    terms = [risk[i] - torch.log(sum(torch.exp(risk[j]) for j in range(len(risk)) if time[j] >= time[i]))
             for i in range(len(risk)) if event[i]]
    return -sum(terms) / len(terms)


def _task(task_type="survival"):
    return TaskInfo(task_type=task_type, num_outputs=1, input_kind=KIND, input_shape=(8,),
                    class_names=["risk"])


def test_cox_loss_and_its_gradient_match_the_definition_in_float64():
    generator = torch.Generator().manual_seed(0)
    risk = torch.randn(9, dtype=torch.float64, generator=generator, requires_grad=True)
    time = torch.tensor([5.0, 3.0, 3.0, 8.0, 1.0, 3.0, 9.0, 2.0, 5.0], dtype=torch.float64)  # ties at 3 and 5
    event = torch.tensor([1, 1, 0, 1, 1, 1, 0, 0, 1])
    assert cox_partial_likelihood(risk, time, event).item() == pytest.approx(_slow_cox(risk, time, event).item(),
                                                                             rel=1e-12)
    assert torch.autograd.gradcheck(lambda r: cox_partial_likelihood(r, time, event), (risk,))
    fast = torch.autograd.grad(cox_partial_likelihood(risk, time, event), risk)[0]
    slow = torch.autograd.grad(_slow_cox(risk, time, event), risk)[0]
    assert torch.allclose(fast, slow, atol=1e-12)


def _bags(n=6, seed=0):
    generator = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(n):
        size = 3 + 4 * i  # 3 to 23 instances: very different sizes
        samples.append({"id": f"s{i}", "input": torch.randn(size, 8, generator=generator),
                        "coords": torch.rand(size, 2, generator=generator) * 1000,
                        "label": torch.tensor([float(10 - i), float(i % 2 == 0)])})
    return collate(samples)


@pytest.mark.parametrize("name,attention", [("abmil_small", None), ("vitwsi_small", "seqnorm")])
def test_a_batch_of_bags_run_one_at_a_time_is_the_batchs_cox_loss(name, attention):
    torch.manual_seed(0)
    model = create_model(name, attention=attention, num_classes=1, feature_dim=8).double().eval()
    batch = _bags()
    batch = {**batch, "input": batch["input"].double(), "coords": batch["coords"].double()}
    labels = batch["label"].double()
    # the risks of every bag alone, computed at once: the reference
    alone = torch.cat([forward(model, {"input": batch["input"][b:b + 1, :int(batch["mask"][b].sum())],
                                       "coords": batch["coords"][b:b + 1, :int(batch["mask"][b].sum())],
                                       "mask": batch["mask"][b:b + 1, :int(batch["mask"][b].sum())]}, KIND)
                       for b in range(len(labels))])[:, 0]
    reference = cox_partial_likelihood(alone, labels[:, 0], labels[:, 1])
    each = forward_each(model, batch, KIND)[:, 0]
    loss = cox_partial_likelihood(each, labels[:, 0], labels[:, 1])
    assert loss.item() == pytest.approx(reference.item(), rel=1e-10)
    # one backward through the bags run one at a time = the gradient of the batch's loss through the padded batch
    model.zero_grad()
    loss.backward()
    accumulated = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    padded = forward(model, batch, KIND)[:, 0]
    assert torch.allclose(padded, each.detach(), atol=1e-9)
    cox_partial_likelihood(padded, labels[:, 0], labels[:, 1]).backward()
    together = [p.grad for p in model.parameters() if p.grad is not None]
    assert len(accumulated) == len(together) > 0
    assert all(torch.allclose(a, t, atol=1e-9) for a, t in zip(accumulated, together))


def test_the_discrete_time_likelihood_is_the_hand_computed_one_with_censoring():
    logits = torch.tensor([[0.0, 1.0, -1.0], [2.0, 0.0, 0.5], [-0.5, 0.3, 0.0]], dtype=torch.float64)
    time_bin, event = torch.tensor([1, 2, 0]), torch.tensor([1, 0, 0])
    h = torch.sigmoid(logits)
    # sample 0: survived bin 0, event in bin 1; sample 1: survived 0 and 1, censored in 2 (no credit for 2);
    # sample 2: censored in bin 0: no term at all
    hand = -(math.log(1 - h[0, 0]) + math.log(h[0, 1]) + math.log(1 - h[1, 0]) + math.log(1 - h[1, 1]) + 0.0) / 3
    assert float(discrete_time_nll(logits, time_bin, event)) == pytest.approx(hand, rel=1e-12)
    risk = torch.tensor([0.3, -0.2, 1.1], dtype=torch.float64, requires_grad=True)
    baseline = torch.tensor([-1.0, 0.0, 0.5], dtype=torch.float64)
    shifted = logistic_hazard_loss(risk, time_bin, event, baseline)
    assert shifted.item() == pytest.approx(discrete_time_nll(baseline + risk[:, None], time_bin, event).item())
    assert torch.autograd.gradcheck(lambda r: logistic_hazard_loss(r, time_bin, event, baseline), (risk,))


def test_the_baseline_is_the_constant_risk_optimum_and_curves_fall_with_risk():
    time = np.array([1.0, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])
    event = np.array([1, 1, 0, 1, 0, 1, 1, 0, 1, 0], dtype=bool)
    edges = time_bins(time, event, 3)
    bins = torch.from_numpy(time_bin_index(time, edges))
    baseline = baseline_logits(bins, torch.from_numpy(event), 3).double().requires_grad_()
    # d_k / n_k by hand: n_k = cases past interval k + events in it
    for k in range(3):
        d = int(((bins == k) & torch.from_numpy(event)).sum())
        n = int((bins > k).sum()) + d
        assert torch.sigmoid(baseline[k]).item() == pytest.approx(min(max(d / n, 1e-4), 1 - 1e-4), rel=1e-5)
    loss = logistic_hazard_loss(torch.zeros(10, dtype=torch.float64), bins, torch.from_numpy(event), baseline)
    assert torch.autograd.grad(loss, baseline)[0].abs().max() < 1e-4  # stationary (up to the clip of an empty bin)
    curves = survival_curves(torch.tensor([-1.0, 0.0, 1.0]), baseline.detach().float())
    assert curves.shape == (3, 3) and (curves.diff(dim=1) <= 0).all() and (curves.diff(dim=0) < 0).all()


def test_event_balanced_batches_hold_the_splits_share_of_events():
    event = torch.tensor([1] * 120 + [0] * 60)
    sampler = EventBalancedSampler(event, seed=3)
    sampler.set_epoch(2)
    order = list(sampler)
    assert sorted(order) == list(range(180)) and order == list(sampler)  # a permutation, fixed by seed and epoch
    sampler.set_epoch(3)
    assert list(sampler) != order
    for start in range(0, 176, 16):
        assert int(event[order[start:start + 16]].sum()) in (10, 11)  # 16 * 120 / 180 = 10.7
    rare = EventBalancedSampler(torch.tensor([1] * 10 + [0] * 150), seed=0)
    rare_order = list(rare)
    assert all(int(torch.tensor([i < 10 for i in rare_order[s:s + 16]]).sum()) == 1 for s in range(0, 160, 16))


def test_survival_losses_are_options_of_survival_tasks_only():
    cox, discrete = objective_for(_task(), "cox"), objective_for(_task(), "discrete_time")
    assert cox.min_batch_size == 2 and discrete.min_batch_size == 1 and cox.batch_coupled
    labels = torch.tensor([[1.0, 1], [2, 0], [3, 1], [4, 1], [5, 0], [6, 1], [7, 1], [8, 0]])
    risk = torch.randn(8, 1)
    assert float(discrete.loss(risk, labels)) == float(cox.loss(risk, labels))  # not fitted: Cox
    discrete.fit(labels, 2)
    assert float(discrete.loss(risk, labels)) != float(cox.loss(risk, labels))
    # per sample, the logistic-hazard terms (their mean the batch's loss), defined for a validation bag on its own
    # where the Cox loss of a batch of one is 0
    per_sample = discrete.loss(risk, labels, per_sample=True)
    assert per_sample.shape == (8,) and float(per_sample.mean()) == pytest.approx(float(discrete.loss(risk, labels)))
    assert float(discrete.loss(risk[:1], labels[:1], per_sample=True)[0]) > 0 == float(cox.loss(risk[:1], labels[:1]))
    assert discrete.constant_loss(labels) == pytest.approx(float(discrete.loss(torch.zeros(8, 1), labels)))
    with pytest.raises(UserError):
        objective_for(_task("regression"), "cox")
    with pytest.raises(UserError):
        objective_for(_task(), "dice")
    with pytest.raises(UserError):
        objective_for(TaskInfo(task_type="segmentation", num_outputs=2, input_kind="volume3d",
                               input_shape=(1, 8, 8, 8), class_names=["b", "f"]), "discrete_time")


@pytest.mark.parametrize("overrides", [["train.loss=discrete_time", "train.batch_size=1", "train.time_bins=3"],
                                       ["train.loss=cox", "train.event_balance=true"]])
def test_a_bag_survival_run_trains_with_each_loss(tmp_path, overrides):
    from test_survival_regression import _cohort, _config

    config = _config(tmp_path, _cohort(tmp_path, "survival", n=40))
    text = yaml.safe_load(open(config))
    text["train"]["epochs"] = 2
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(text))
    assert main(["train", config, "--out", str(tmp_path / "run"), "--no-progress", *overrides]) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["test"]["c_index"] is not None and math.isfinite(results["learning"]["constant_loss"])
    with open(tmp_path / "run" / "metrics.csv", newline="") as f:
        val_losses = [float(row["val_loss"]) for row in csv.DictReader(f)]
    assert all(loss > 0 for loss in val_losses)  # discrete time scored one bag at a time: its own loss, not Cox's 0
