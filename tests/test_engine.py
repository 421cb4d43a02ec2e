import csv
import json
import math

import pytest
import torch

from engine_data import bag_bundle, image_bundle, tiny_config
from medattn.data.base import TaskInfo
from medattn.errors import UserError
from medattn.train import build_model, fit
from medattn.train.engine import lr_at


def _run(tmp_path, bundle, *overrides, name="run", **kwargs):
    return fit(tiny_config(*overrides), bundle, tmp_path / name, progress=False, log=lambda m: None, **kwargs)


def test_fit_writes_the_run_folder(tmp_path):
    results = _run(tmp_path, image_bundle())
    run = tmp_path / "run"
    for name in ("config.yaml", "metrics.csv", "predictions_test.csv", "roc_test.png", "results.json",
                 "checkpoints/best/model.safetensors", "checkpoints/last/training_state.safetensors"):
        assert (run / name).exists(), name
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert [int(r["epoch"]) for r in rows] == [1, 2]
    best = max(rows, key=lambda r: float(r["val_auroc"]))
    assert results["best_epoch"] == int(best["epoch"])
    test = results["test"]
    assert 0 <= test["ci_low"] <= test["auroc"] <= test["ci_high"] <= 1
    predictions = list(csv.DictReader(open(run / "predictions_test.csv")))
    assert len(predictions) == 12 and set(predictions[0]) == {"id", "patient", "label_0", "prob_0"}
    assert json.loads((run / "results.json").read_text())["test"]["auroc"] == test["auroc"]


def test_same_seed_same_numbers(tmp_path):
    a = _run(tmp_path, image_bundle(), name="a")
    b = _run(tmp_path, image_bundle(), name="b")
    _run(tmp_path, image_bundle(), "seed=1", name="c")
    assert a["test"] == b["test"]
    assert (tmp_path / "a/predictions_test.csv").read_text() == (tmp_path / "b/predictions_test.csv").read_text()
    assert (tmp_path / "a/predictions_test.csv").read_text() != (tmp_path / "c/predictions_test.csv").read_text()


def test_learns_an_easy_task(tmp_path):
    results = _run(tmp_path, image_bundle(48), "train.epochs=4", "model.attention=seqnorm")
    assert results["val_auroc"] > 0.8


@pytest.mark.parametrize("overrides", [("train.grad_accum=3",), ("train.precision=bf16",),
                                       ("model.attention=sima", "train.grad_clip=0")])
def test_options_run(tmp_path, overrides):
    results = _run(tmp_path, image_bundle(), "train.epochs=1", *overrides)
    assert math.isfinite(results["test"]["loss"])


def test_bags_with_masks_and_multiclass(tmp_path):
    bags = _run(tmp_path, bag_bundle(), "model.name=vitwsi_tiny", "train.epochs=1", name="bags")
    assert bags["test"]["n"] == 8
    multi = _run(tmp_path, image_bundle(24, "multiclass"), "train.epochs=1", name="multi")
    header = next(csv.reader(open(tmp_path / "multi/predictions_test.csv")))
    assert header == ["id", "patient", "label", "prob_0", "prob_1", "prob_2"]
    assert multi["test"]["auroc"] is not None


def test_validation_with_one_class_is_a_clear_error(tmp_path):
    bundle = image_bundle()
    bundle.val = torch.utils.data.Subset(bundle.val, [0, 2, 4])  # even indices: all negative
    with pytest.raises(UserError, match="validation split: all 3 samples are negative"):
        _run(tmp_path, bundle, "train.epochs=1")


def test_model_and_data_must_match():
    with pytest.raises(UserError, match="takes images or volumes but the data gives bag"):
        build_model({"name": "vit2d_tiny", "attention": "softmax"}, TaskInfo("binary", "bag", 1, (16,)))
    with pytest.raises(UserError, match="unknown model 'vit9d'"):
        build_model({"name": "vit9d", "attention": "softmax"}, TaskInfo("binary", "image2d", 1, (1, 32, 32)))
    with pytest.raises(ValueError, match="nope"):
        build_model({"name": "vit2d_tiny", "attention": "nope"}, TaskInfo("binary", "image2d", 1, (1, 32, 32)))


def test_model_takes_sizes_from_the_task():
    model = build_model({"name": "vit3d_tiny", "attention": "seqnorm"}, TaskInfo("multilabel", "volume3d", 4,
                                                                                 (2, 16, 16, 8)))
    assert model(torch.randn(1, 2, 16, 16, 8)).shape == (1, 4)


def test_lr_schedule_warms_up_then_decays():
    lrs = [lr_at(s, 10, 2, 1.0, 0.0) for s in range(10)]
    assert lrs[:2] == [0.5, 1.0]
    assert lrs[2] == 1.0 and all(a > b for a, b in zip(lrs[2:], lrs[3:]))
    assert lr_at(10, 10, 2, 1.0, 0.1) == pytest.approx(0.1)
