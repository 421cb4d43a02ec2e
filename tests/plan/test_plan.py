"""The training plan from the data's fingerprint: deterministic, applied only to the keys a config leaves null,
recorded with the run, printed by medattn plan; bag limits that can drop a needle's tiles are named."""

from __future__ import annotations

import json
import math

import yaml

from engine_data import bag_bundle, image_bundle, tiny_config
from medattn.cli import main
from medattn.plan import apply, describe, fingerprint, plan
from medattn.plan.rules import MAX_EPOCHS, MIN_EPOCHS, TARGET_STEPS
from medattn.train import fit


def test_the_plan_is_deterministic_and_follows_the_number_of_cases():
    config = tiny_config("train.epochs=null", "train.batch_size=4")
    first, second = fingerprint(image_bundle(24)), fingerprint(image_bundle(24))
    assert first == second and first["cases"] == {"train": 24, "val": 12, "test": 12}
    assert first["positive_share"] == [0.5] and first["input_shape"] == [1, 32, 32]
    decisions = plan(config, first)
    assert decisions == plan(config, second)
    epochs = {d.key: d.value for d in decisions}["train.epochs"]
    assert epochs == min(MAX_EPOCHS, max(MIN_EPOCHS, math.ceil(TARGET_STEPS["transformer"] / 6)))
    larger = dict(first, cases={"train": 2400, "val": 100, "test": 100})
    assert {d.key: d.value for d in plan(config, larger)}["train.epochs"] == MIN_EPOCHS  # 600 steps an epoch
    cnn = tiny_config("train.epochs=null", "model.name=resnet2d_tiny", "model.attention=null")
    assert {d.key: d.value for d in plan(cnn, first)}["train.epochs"] < epochs  # a CNN needs fewer steps
    for windowed in ("swin2d_tiny", "swin2d_small"):  # attention of its own, no mechanism argument: a transformer
        swin = tiny_config("train.epochs=null", f"model.name={windowed}", "model.attention=null")
        assert {d.key: d.value for d in plan(swin, first)}["train.epochs"] == epochs


def test_the_plan_never_replaces_a_value_the_config_sets():
    config = tiny_config("train.epochs=7")
    decisions = plan(config, fingerprint(image_bundle(24)))
    assert not any(d.key == "train.epochs" for d in decisions)
    assert apply(config, decisions) == config


def test_a_bag_limit_below_the_largest_bag_is_named_and_kept():
    found = fingerprint(bag_bundle(16))
    assert found["bag_sizes"]["max"] <= 12 and found["bag_sizes"]["min"] >= 5
    config = tiny_config("model.name=vitwsi_tiny", "data.max_instances=4")
    note = next(d for d in plan(config, found) if d.key == "data.max_instances")
    assert not note.applied and note.value == 4 and "whole bags" in note.reason
    assert apply(config, plan(config, found))["data"]["max_instances"] == 4
    assert "[as configured]" in describe(found, plan(config, found))


def test_training_applies_and_records_the_plan(tmp_path, monkeypatch):
    from medattn.plan import rules

    monkeypatch.setattr(rules, "TARGET_STEPS", {"transformer": 6, "other": 6})  # 3 epochs of 2 steps
    monkeypatch.setattr(rules, "MIN_EPOCHS", 1)
    config = tiny_config("train.epochs=null", "train.batch_size=12", "eval.bootstrap=0", "eval.heatmaps=0")
    lines = []
    results = fit(config, image_bundle(24), tmp_path / "run", progress=False, log=lines.append)
    planned = {d["key"]: d for d in results["plan"]["decisions"]}
    epochs = planned["train.epochs"]["value"]
    assert epochs == 3 and results["epochs"] == epochs and results["plan"]["fingerprint"]["cases"]["train"] == 24
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert yaml.safe_load(saved)["train"]["epochs"] == epochs and f"# default: train.epochs={epochs}" in saved
    assert any(line.startswith("plan: train.epochs=") for line in lines)
    # the checkpoint records the design the preset gave (applied on load if the preset's default changes later)
    meta = json.loads((tmp_path / "run" / "checkpoints" / "best" / "checkpoint.json").read_text())
    assert meta["model_defaults"] == {"stem": "patch", "global_pool": "token"}


def test_medattn_plan_prints_the_fingerprint_and_the_plan(capsys):
    assert main(["plan", "synthetic_wsi", "train.epochs=null", "data.num_samples=[6, 2, 2]",
                 "data.num_instances=[20, 40]"]) == 0
    out = capsys.readouterr().out
    assert "fingerprint:" in out and "bag_sizes" in out and "train.epochs = " in out


def test_a_survival_bag_models_epochs_count_its_bags_whatever_the_batch():
    """A batch of 16 survival bags runs them one at a time, 16 single-bag steps: the plan gives it the epochs of
    batch 1, where a classification bag model (padded batches) and an image model get fewer steps per epoch and so
    more epochs as the batch grows."""
    found = fingerprint(bag_bundle(16))
    survival = dict(found, task_type="survival")

    def planned(found: dict, batch: int) -> int:
        config = tiny_config("model.name=vitwsi_tiny", "train.epochs=null", f"train.batch_size={batch}")
        return {d.key: d.value for d in plan(config, found)}["train.epochs"]

    cases = found["cases"]["train"]
    one_bag_a_step = min(MAX_EPOCHS, max(MIN_EPOCHS, math.ceil(TARGET_STEPS["transformer"] / cases)))
    assert planned(survival, 1) == planned(survival, 16) == one_bag_a_step
    assert planned(found, 16) > planned(found, 1) == one_bag_a_step
