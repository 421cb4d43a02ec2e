"""Segmentation through the training loop: Dice loss and metric, U-Net and U-PAM-Net presets, run files."""

import csv
import json
import math

import numpy as np
import pytest
import torch

from medattn import metrics
from medattn.config import load_config
from medattn.data import build_datasets
from medattn.data.base import TaskInfo
from medattn.models import create_model
from medattn.runtime.build import build_model
from medattn.train import fit
from medattn.train.objectives import Segmentation, objective_for

TINY = ["data.volume_size=[8, 8, 32]", "data.num_blobs=2", "data.num_samples=[4, 2, 3]", "train.epochs=1",
        "train.batch_size=2", "eval.bootstrap=20", "model.kwargs.base_channels=4"]


@pytest.mark.parametrize("name", ["unet3d", "upamnet"])
def test_one_epoch_through_the_training_loop(tmp_path, name):
    config = load_config("synthetic_vertebrae", [f"model.name={name}", *TINY])
    bundle = build_datasets(config["data"], seed=config["seed"])
    results = fit(config, bundle, tmp_path / name, progress=False, log=lambda m: None)
    run = tmp_path / name
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert list(rows[0]) == ["epoch", "lr", "train_loss", "val_loss", "val_dice", "seconds"]
    assert 0 <= float(rows[0]["val_dice"]) <= 1 and math.isfinite(float(rows[0]["train_loss"]))
    saved = json.loads((run / "results.json").read_text())
    assert saved["metric"] == "dice" and saved["val_dice"] == results["val_dice"] and saved["attention"] is None
    test = saved["test"]
    assert test["n"] == 3 and 0 <= test["ci_low"] <= test["dice"] <= test["ci_high"] <= 1
    assert list(test["dice_per_class"]) == ["background", "blob1", "blob2"]
    cases = list(csv.DictReader(open(run / "predictions_test.csv")))
    assert len(cases) == 3 and list(cases[0])[:4] == ["id", "patient", "mean_dice", "dice_background"]
    assert sum(int(cases[0][f"voxels_{c}"]) for c in ("background", "blob1", "blob2")) == 8 * 8 * 32
    assert not (run / "roc_test.png").exists()
    assert json.loads((run / "checkpoints/best/checkpoint.json").read_text())["val_dice"] == results["val_dice"]


def test_presets_take_sizes_from_the_task_and_no_attention():
    task = TaskInfo("segmentation", "volume3d", 5, (2, 8, 8, 16))
    small = {"unet3d": {"base_channels": 4}, "upamnet": {"base_channels": 4},
             "dilated_fcn": {"width": 6, "num_blocks": 1}, "dilated_fcn_pam": {"width": 6, "num_blocks": 1}}
    for name, kwargs in small.items():
        model = build_model({"name": name, "attention": None, "kwargs": kwargs}, task)
        assert model(torch.randn(1, 2, 8, 8, 16)).shape == (1, 5, 8, 8, 16), name
    plain, pam = create_model("unet3d"), create_model("upamnet")
    assert pam.pam is not None and plain.pam is None
    count = [sum(p.numel() for p in m.parameters()) for m in (plain, pam)]
    assert count[1] <= count[0] <= 1.01 * count[1]  # parameter-matched twins
    with pytest.raises(ValueError, match="model 'unet3d' has no attention mechanism"):
        create_model("unet3d", attention="seqnorm")
    assert create_model("vit2d_tiny")(torch.randn(1, 1, 32, 32)).shape == (1, 1)  # default mechanism


def test_segmentation_loss_and_dice_outputs():
    objective = objective_for(TaskInfo("segmentation", "volume3d", 3, (1, 4, 4, 4)))
    assert isinstance(objective, Segmentation)
    labels = torch.zeros(2, 4, 4, 4, dtype=torch.int64)
    labels[0, :2] = 1
    labels[1, :1] = 2
    perfect = torch.nn.functional.one_hot(labels, 3).movedim(-1, 1).float() * 20
    wrong = perfect.roll(1, dims=1)
    assert objective.loss(perfect, labels) < 0.05 < 1 < objective.loss(wrong, labels)
    per_case = objective.loss(wrong, labels, per_sample=True)
    assert per_case.shape == (2,) and torch.all(per_case > 1)
    dice, voxels = objective.outputs(perfect, labels)
    assert dice.dtype == torch.float64 and dice[0, :2].eq(1).all() and dice[0, 2].isnan()
    assert dice[1, 1].isnan() and dice[1, 2] == 1 and voxels.tolist() == [[32, 32, 0], [48, 0, 16]]
    logits = perfect.clone().requires_grad_()
    objective.loss(logits * 0.01, labels).backward()
    assert logits.grad.abs().sum() > 0


def test_dice_metrics():
    nan = float("nan")
    dice = np.array([[0.9, 1.0, nan], [0.8, 0.5, 0.0], [0.7, nan, 1.0]])
    assert np.allclose(metrics.class_dice(dice), [0.8, 0.75, 0.5])
    assert metrics.mean_dice(dice) == pytest.approx(0.625)  # foreground classes only
    low, high = metrics.dice_bootstrap_ci(dice, 200, 0.9, seed=1)
    assert low <= 0.625 <= high and (low, high) == metrics.dice_bootstrap_ci(dice, 200, 0.9, seed=1)
    with pytest.raises(metrics.UndefinedMetricError, match="Dice is undefined on the validation split"):
        metrics.mean_dice(np.array([[1.0, nan], [1.0, nan]]), "validation")
    with pytest.raises(ValueError, match=r"dice must be \(N, K\)"):
        metrics.class_dice(np.zeros((0, 3)))
