"""Judging runs against a constant predictor (medattn.train.verdict) and what compare, cv and demo do with a
run that did not learn; the per-model training defaults and the bag feature standardisation that make the
baselines learn."""

import math

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from engine_data import SignalBags, bag_bundle, tiny_config
from medattn.data.base import DataBundle, TaskInfo
from medattn.experiments.compare import summarise
from medattn.models import create_model
from medattn.train import fit
from medattn.train.defaults import GENERAL, resolve_training
from medattn.train.objectives import objective_for
from medattn.train.verdict import chance_halfwidth, constant_loss, judge

BINARY = TaskInfo("binary", "image2d", 1, (1, 8, 8))
SEGMENTATION = TaskInfo("segmentation", "volume3d", 2, (1, 8, 8, 8))


def test_constant_loss_is_the_label_priors_entropy():
    labels = torch.tensor([[1.0]] * 30 + [[0.0]] * 70)
    expected = -(0.3 * math.log(0.3) + 0.7 * math.log(0.7))
    assert constant_loss(objective_for(BINARY), labels) == pytest.approx(expected, abs=1e-6)
    # class-balanced sampling weighs the classes equally: the constant predictor's loss is ln 2
    weights = torch.where(labels[:, 0] > 0, 1 / 30, 1 / 70)
    assert constant_loss(objective_for(BINARY), labels, weights) == pytest.approx(math.log(2), abs=1e-6)
    # label smoothing e: targets 0.5 e / 1 - 0.5 e, the best constant's loss is their entropy at the prior
    smoothed = constant_loss(objective_for(BINARY, label_smoothing=0.2), torch.tensor([[1.0], [0.0]]))
    assert smoothed == pytest.approx(math.log(2), abs=1e-6)
    multiclass = TaskInfo("multiclass", "image2d", 3, (1, 8, 8))
    three = torch.tensor([0] * 50 + [1] * 25 + [2] * 25)
    entropy = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    assert constant_loss(objective_for(multiclass), three) == pytest.approx(entropy, abs=1e-5)


def test_chance_interval_is_the_mann_whitney_null():
    labels = np.array([[1]] * 30 + [[0]] * 30)
    se = math.sqrt((60 + 1) / (12 * 30 * 30))
    assert chance_halfwidth(labels, "binary", 0.95) == pytest.approx(1.959964 * se, rel=1e-5)
    # a random scorer's AUROC falls inside the interval about 95% of the time
    rng = np.random.default_rng(0)
    from sklearn.metrics import roc_auc_score

    inside = np.mean([abs(roc_auc_score(labels[:, 0], rng.random(60)) - 0.5) <= 1.959964 * se for _ in range(2000)])
    assert 0.93 < inside < 0.97
    assert chance_halfwidth(np.array([[1], [1]]), "binary", 0.95) is None  # one class: no interval


def _rows(losses, scores):
    return [{"epoch": i + 1, "train_loss": loss, "val_auroc": score} for i, (loss, score) in
            enumerate(zip(losses, scores))]


def test_judge_flags_a_constant_predictor_and_chance_level_validation():
    val = np.array([[1]] * 30 + [[0]] * 30)
    binary = objective_for(BINARY)
    # the attention-MIL: train loss rose above ln 2
    flat = judge(_rows([0.706, 0.73, 0.758], [0.55, 0.52, 0.53]), "val_auroc", binary, constant=math.log(2),
                 val_labels=val)
    assert not flat["learned"] and len(flat["reasons"]) == 2
    # the ViTs: 0.683 and 0.674 (ln 2 = 0.693) with a validation AUROC well above chance: learned, warned
    vit = judge(_rows([0.70, 0.69, 0.683], [0.60, 0.68, 0.72]), "val_auroc", binary, constant=math.log(2),
                val_labels=val)
    assert vit["learned"] and any("within 5% of a constant predictor" in w for w in vit["warnings"])
    # fits the training data, chance on validation: did not learn anything that generalises
    overfit = judge(_rows([0.6, 0.3, 0.1], [0.5, 0.55, 0.52]), "val_auroc", binary, constant=math.log(2),
                    val_labels=val)
    assert not overfit["learned"] and "within chance" in overfit["reasons"][0]
    rising = judge(_rows([0.6, 0.5, 0.4, 0.3], [0.6, 0.7, 0.75, 0.8]), "val_auroc", binary,
                   constant=math.log(2), val_labels=val)
    assert rising["learned"] and any("budget may be too short" in w for w in rising["warnings"])
    # fitted, then fell back (TransMIL on the realistic bags): judged by the epoch whose checkpoint is tested
    relapse = _rows([0.70, 0.60, 0.72], [0.55, 0.90, 0.52])
    assert judge(relapse, "val_auroc", binary, best_epoch=2, constant=math.log(2), val_labels=val)["learned"]
    relapse = _rows([0.75, 0.71, 0.70], [0.9, 0.80, 0.75])  # epoch-mean losses lag; none beat the prior's
    assert not judge(relapse, "val_auroc", binary, best_epoch=1, constant=math.log(2), val_labels=val)["learned"]
    dice = judge([{"epoch": 1, "train_loss": 1.0, "val_dice": 0.0}], "val_dice", objective_for(SEGMENTATION))
    assert not dice["learned"]


def _results(auroc, learned, reasons=("the final train loss 0.75 is no lower than a constant predictor's 0.69",)):
    return {"metric": "auroc", "data": "x", "synthetic": False, "test": {"auroc": auroc},
            "learning": {"learned": learned, "reasons": [] if learned else list(reasons)}}


def _write_cases(folder, probs):
    folder.mkdir(parents=True)
    rows = "\n".join(f"c{i},p{i},{i % 2},{p:.4f}" for i, p in enumerate(probs))
    (folder / "predictions_test.csv").write_text("id,patient,label_0,prob_0\n" + rows + "\n")


def test_compare_marks_an_arm_that_did_not_learn_and_leaves_it_out_of_the_paired_tests(tmp_path):
    config = tiny_config()
    arms = {name: config for name in ("seqnorm", "abmil", "softmax")}
    rng = np.random.default_rng(0)
    for arm in arms:
        for seed in (0, 1):
            _write_cases(tmp_path / arm / f"seed_{seed}", rng.random(20))
    results = [_results(0.9, True), _results(0.91, True), _results(0.5, False), _results(0.55, True),
               _results(0.8, True), _results(0.82, True)]
    summary = summarise(arms, [0, 1], results, tmp_path)
    rows = {r["arm"]: r for r in summary["arms"]}
    assert rows["abmil"]["status"] == "DID NOT LEARN (seed 0)" and rows["seqnorm"]["status"] == "learned"
    tests = [t for t in summary["tests"] if t["arm"] == "abmil"]
    assert len(tests) == 1 and tests[0]["test"] == "left out" and "abmil did not learn in seed(s) 0" in tests[0]["note"]
    assert {t["test"] for t in summary["tests"] if t["arm"] == "softmax"} != {"left out"}  # the others are tested
    # a reference that did not learn leaves every test out
    summary = summarise(arms, [0, 1], results, tmp_path, reference="abmil")
    assert {t["test"] for t in summary["tests"]} == {"left out"}


def test_attention_mil_trains_with_its_own_optimiser_unless_the_user_sets_one(tmp_path):
    config = tiny_config("model.name=abmil_tiny", "model.attention=null", "train.lr=null")
    resolved, chosen = resolve_training(config)
    assert resolved["train"]["optimizer"] == "adamw" and resolved["train"]["lr"] == 2e-4  # decoupled decay
    assert resolved["train"]["weight_decay"] == 1e-4 and chosen["train.lr"] == 2e-4
    assert resolved["train"]["schedule"] == "constant" and resolved["train"]["grad_clip"] == 0  # as CLAM trains it
    assert "train.warmup_epochs" not in chosen  # tiny_config sets it: the user's value wins
    vit = resolve_training(tiny_config("train.optimizer=null", "train.weight_decay=null"))[0]
    assert vit["train"]["optimizer"] == GENERAL["optimizer"] and vit["train"]["weight_decay"] == 0.05
    assert vit["train"]["grad_clip"] == 1.0 and vit["train"]["schedule"] == "cosine"
    assert resolve_training(resolved)[1] == {}  # resolving twice changes nothing
    results = fit(config, bag_bundle(), tmp_path / "run", progress=False, log=lambda m: None)
    saved = yaml.safe_load((tmp_path / "run/config.yaml").read_text())
    assert saved["train"]["optimizer"] == "adamw" and saved["train"]["lr"] == 2e-4  # config.yaml holds what ran
    assert results["defaults"]["train.lr"] == 2e-4 and results["defaults"]["model.kwargs.standardize_features"]


def test_feature_standardisation_reaches_the_model(tmp_path):
    """The training split's per-feature mean and std are fitted before training, saved with the weights, and
    make the model blind to an extractor's scale: bags scaled and shifted per feature train to the same model."""
    def scaled(bundle: DataBundle, scale: torch.Tensor, shift: torch.Tensor) -> DataBundle:
        for part in (bundle.train, bundle.val, bundle.test):
            part.bags = [bag * scale + shift for bag in part.bags]
        return bundle

    scale, shift = torch.logspace(-2, 3, 16), torch.linspace(-50, 50, 16)
    config = tiny_config("model.name=abmil_tiny", "model.attention=null", "train.epochs=1", "eval.bootstrap=0")
    plain, wide = bag_bundle(), scaled(bag_bundle(), scale, shift)
    fit(config, plain, tmp_path / "plain", progress=False, log=lambda m: None)
    results = fit(config, wide, tmp_path / "wide", progress=False, log=lambda m: None)
    train = torch.cat(wide.train.bags).double()
    weights = load_file(tmp_path / "wide/checkpoints/best/model.safetensors")
    assert torch.allclose(weights["feature_norm.mean"].double(), train.mean(0), rtol=1e-5, atol=1e-4)
    assert torch.allclose(weights["feature_norm.std"].double(), train.std(0, unbiased=False), rtol=1e-5)
    assert results["feature_standardization"]["instances"] == len(train)
    # the two runs see the same standardised inputs: the same weights after the standardiser
    other = load_file(tmp_path / "plain/checkpoints/best/model.safetensors")
    assert torch.allclose(weights["embed.weight"], other["embed.weight"], atol=1e-4)
    # and the model applies it: a raw bag through the saved model equals the standardised bag through a plain one
    model = create_model("abmil_tiny", feature_dim=16)
    model.load_state_dict(weights)
    bare = create_model("abmil_tiny", feature_dim=16, standardize_features=False)
    bare.load_state_dict({k: v for k, v in weights.items() if not k.startswith("feature_norm.")})
    bag = SignalBags(1, 5).bags[0][None] * scale + shift
    standardised = (bag - weights["feature_norm.mean"]) / weights["feature_norm.std"]
    assert torch.allclose(model.eval()(bag), bare.eval()(standardised), atol=1e-5)


def test_a_bag_checkpoint_written_before_standardisation_loads_as_it_was(tmp_path):
    from safetensors.torch import save_file

    from medattn.runtime.trained import load_checkpoint

    config = tiny_config("model.name=abmil_tiny", "model.attention=null", "train.epochs=1", "eval.bootstrap=0")
    fit(config, bag_bundle(), tmp_path / "run", progress=False, log=lambda m: None)
    best = tmp_path / "run/checkpoints/best"
    weights = load_file(best / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.startswith("feature_norm.")}, best / "model.safetensors")
    trained = load_checkpoint(tmp_path / "run")
    assert trained.config["model"]["kwargs"]["standardize_features"] is False
    assert not any(name.startswith("feature_norm.") for name in trained.model.state_dict())
