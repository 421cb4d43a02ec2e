"""The pooled-feature path's fit before training (medattn.train.pooled_path): it equals scikit-learn's penalised
logistic regression on the same summaries, chooses its penalty by cross-validation deterministically, makes the
model start as the fitted pooled model, and a real run records it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine_data import SignalBags
from medattn.data.base import TaskInfo
from medattn.models import create_model
from medattn.train.objectives import objective_for
from medattn.train.pooled_path import PENALTY_GRID, choose_penalty, fit_linear, fit_pooled_path
from medattn.train.report import learning_warnings

TASK = TaskInfo("binary", "bag", 1, (16,), synthetic=True)


class MaxFeatureBags(SignalBags):
    """Bags of 30-60 tiles of 16 noise features (SD 3); a positive bag has one tile whose feature 3 is raised by
    10-16: its label is in the bag's maximum of feature 3 alone (what a linear model on pooled features reads)."""

    def __init__(self, n: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.bags = []
        for i in range(n):
            bag = torch.randn(int(torch.randint(30, 61, (), generator=gen)), 16, generator=gen) * 3 + 5
            if i % 2:
                bag[0, 3] += 10 + 6 * float(torch.rand((), generator=gen))
            self.bags.append(bag)


def _fitted_model(dataset):
    from medattn.train.model_setup import fit_feature_norm

    torch.manual_seed(0)
    model = create_model("vitwsi_tiny", attention="seqnorm", readout="attention", pooled_features=True)
    fit_feature_norm(model, dataset)
    return model, fit_pooled_path(model, dataset, objective_for(TASK), "binary")


def test_the_linear_fit_equals_scikit_learns_penalised_logistic_regression():
    from sklearn.linear_model import LogisticRegression

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(120, 6, generator=gen)
    labels = ((x[:, 0] - 0.5 * x[:, 2] + 0.8 * torch.randn(120, generator=gen)) > 0).float()[:, None]
    for c in (0.1, 1.0):
        weight, bias = fit_linear(x, labels, objective_for(TASK), c, 1)
        reference = LogisticRegression(C=c, tol=1e-10, max_iter=10_000).fit(x.numpy(), labels[:, 0].numpy())
        np.testing.assert_allclose(weight[0].numpy(), reference.coef_[0], rtol=2e-3, atol=2e-4)
        np.testing.assert_allclose(bias.numpy(), reference.intercept_, rtol=2e-3, atol=2e-4)


def test_the_model_starts_as_the_fitted_pooled_model_which_finds_the_maximum():
    dataset = MaxFeatureBags(80, 0)
    model, record = _fitted_model(dataset)
    assert record["fitted"] and record["fitted_loss"] < 0.5 * record["constant_loss"]
    assert record["C"] in PENALTY_GRID and set(record["cv_metric"]) == {f"{c:g}" for c in PENALTY_GRID}
    assert not model.head.weight.any()  # the head on z starts at zero: the logits are the pooled path's
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(dataset[i]["input"][None]) for i in range(len(dataset))])[:, 0]
        summaries = torch.stack([model.features_summary(model.feature_norm(dataset[i]["input"])[None])[0]
                                 for i in range(len(dataset))])
        pooled = model.pooled_head(model.features_pool_norm(summaries))[:, 0] + model.head.bias
    torch.testing.assert_close(logits, pooled, rtol=1e-4, atol=1e-4)
    labels = torch.tensor([i % 2 for i in range(len(dataset))])
    assert logits[labels == 1].min() > logits[labels == 0].max() - 1.0  # the maximum of feature 3 separates them
    column = model.pooled_head.weight[0].abs()
    assert int(column.argmax()) == 16 + 3  # the maximum (second half of s) of feature 3


def test_the_penalty_is_chosen_by_cross_validation_and_the_same_each_time():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(100, 5, generator=gen)
    labels = (x[:, 1] + 0.3 * torch.randn(100, generator=gen) > 0).float()[:, None]
    first = choose_penalty(x, labels, objective_for(TASK), "binary", 1)
    assert first == choose_penalty(x, labels, objective_for(TASK), "binary", 1)
    assert first[0] == max(PENALTY_GRID, key=lambda c: (first[1][c], -c)) and first[1][first[0]] > 0.8
    noise = (torch.randn(100, generator=gen) > 0).float()[:, None]  # nothing to find: the strongest wins ties
    assert choose_penalty(torch.zeros(100, 5), noise, objective_for(TASK), "binary", 1)[0] == PENALTY_GRID[0]


def test_a_model_without_the_path_is_left_alone():
    model = create_model("vitwsi_tiny", attention="seqnorm", readout="max")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert fit_pooled_path(model, MaxFeatureBags(10, 0), objective_for(TASK), "binary") is None
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("losses, expected", [
    ([0.36, 0.355, 0.352], "never went below the pooled-feature path's fit"),
    ([0.30, 0.20, 0.12], None),
])
def test_a_run_from_a_fitted_start_is_judged_against_the_fit(losses, expected):
    found = learning_warnings(losses, None, fitted_start=0.35)
    assert (expected in found[0]) if expected else not found


def test_a_real_run_records_the_fit_starts_from_it_and_its_checkpoint_loads(tmp_path):
    """At a rate too small to move a weight far, the run's test AUROC is its start's: the pooled model's with the
    path, near a constant predictor's without it (the max readout's head starts at zero and moves by about 1e-12)."""
    from engine_data import tiny_config
    from medattn.data.base import DataBundle
    from medattn.train import fit

    bundle = DataBundle(MaxFeatureBags(60, 0), MaxFeatureBags(20, 1), MaxFeatureBags(30, 2), TASK)
    scores = {}
    for pooled in ("true", "false"):
        config = tiny_config("model.name=vitwsi_tiny", "model.attention=seqnorm", "model.kwargs.readout=max",
                             f"model.kwargs.pooled_features={pooled}", "train.epochs=1", "train.batch_size=4",
                             "train.lr=1e-12", "eval.bootstrap=0", "eval.heatmaps=0")
        logged = []
        results = fit(config, bundle, tmp_path / pooled, progress=False, log=logged.append)
        scores[pooled] = results["test"]["auroc"]
    assert results["pooled_path"] is None
    fitted = json.loads((tmp_path / "true/results.json").read_text())["pooled_path"]
    assert fitted["fitted"] and fitted["bags"] == 60
    assert scores["true"] >= 0.85 and scores["false"] <= 0.7
    _the_checkpoint_predicts_as_the_run_did(tmp_path / "true/checkpoints/best", bundle.test, scores["true"])


def test_a_resumed_run_does_nothing_before_training_again_and_records_what_was_done(tmp_path, monkeypatch):
    """A resumed run read every training bag again for feature statistics its checkpoint then overwrote, and its
    results.json said ``pooled_path: null`` and ``init_from: null`` for a model fitted and initialised before its
    first epoch. Now it does neither again, and its results.json records what the run it continues did."""
    from engine_data import tiny_config
    from medattn.data.base import DataBundle
    from medattn.train import fit, model_setup, pooled_path, supervised

    class Killed(Exception):
        pass

    def kill_after_1(epoch, row):
        if epoch == 1:
            raise Killed

    bundle = DataBundle(MaxFeatureBags(40, 0), MaxFeatureBags(20, 1), MaxFeatureBags(20, 2), TASK)
    config = tiny_config("model.name=vitwsi_tiny", "model.attention=seqnorm", "model.kwargs.readout=max",
                         "model.kwargs.pooled_features=true",
                         "train.epochs=2", "train.batch_size=4", "eval.bootstrap=0", "eval.heatmaps=0")
    started = dict(progress=False, log=lambda m: None, init_from=tmp_path / "start/checkpoints/best")
    fit(config, bundle, tmp_path / "start", progress=False, log=lambda m: None)
    full = fit(config, bundle, tmp_path / "full", **started)
    with pytest.raises(Killed):
        fit(config, bundle, tmp_path / "resumed", on_epoch_end=kill_after_1, **started)
    done = []
    for module, name in ((supervised, "initialise"), (supervised, "fit_feature_norm"),
                         (supervised, "fit_pooled_path"), (model_setup, "feature_statistics"),
                         (pooled_path, "choose_penalty")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *args, real=real, name=name: done.append(name) or real(*args))
    resumed = fit(config, bundle, tmp_path / "resumed", resume=True, **started)
    assert done == []
    assert full["pooled_path"]["fitted"] and full["feature_standardization"]["bags"] == 40
    assert full["init_from"]["from"].endswith("best")
    for key in supervised.BEFORE_TRAINING:
        assert resumed[key] == full[key]
        assert json.loads((tmp_path / "resumed/results.json").read_text())[key] == full[key]


def _the_checkpoint_predicts_as_the_run_did(folder, dataset, auroc: float) -> None:
    """A pooled-features checkpoint loads (eval, predict, export all start here) with its fitted path and its
    standardiser's statistics, and scores the test bags as the run did."""
    from sklearn.metrics import roc_auc_score

    from medattn.runtime.trained import load_checkpoint

    model = load_checkpoint(folder).model
    assert model.pooled_features and int(model.features_pool_norm.count) == 60 + 60  # the fit's bags, one epoch's
    assert model.pooled_head.weight.abs().max() > 0
    with torch.no_grad():
        logits = [float(model(dataset[i]["input"].unsqueeze(0)).squeeze()) for i in range(len(dataset))]
    labels = [float(dataset[i]["label"]) for i in range(len(dataset))]
    assert roc_auc_score(labels, logits) == pytest.approx(auroc, abs=1e-6)
