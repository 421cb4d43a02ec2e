"""A segmentation run's report shows its best and worst test cases (issue 51): the true and predicted label maps over
the input, ranked by the test's per-case mean foreground Dice, in report.html."""

from __future__ import annotations

import base64
import csv
import json

import numpy as np
from PIL import Image

from medattn.config import load_config
from medattn.data import build_datasets
from medattn.explain.cases import case_pictures_for
from medattn.explain.segmentation_cases import ranked_cases
from medattn.train import fit

TINY = ["data.volume_size=[8, 8, 32]", "data.num_blobs=2", "data.num_samples=[4, 2, 3]", "train.epochs=1",
        "train.batch_size=2", "eval.bootstrap=0", "model.kwargs.base_channels=4", "model.name=unet3d",
        "eval.heatmaps=1"]


def test_ranked_cases_by_mean_foreground_dice_leave_out_cases_without_any():
    nan = float("nan")
    dice = np.array([[0.9, 0.2, 0.4], [0.8, nan, 0.9], [0.7, nan, nan], [0.99, 0.1, 0.1]])
    order, mean = ranked_cases(dice)
    assert order == [1, 0, 3] and np.allclose(mean[[0, 1, 3]], [0.3, 0.9, 0.1]) and np.isnan(mean[2])


def test_a_segmentation_run_report_shows_its_best_and_worst_test_cases(tmp_path):
    config = load_config("synthetic_vertebrae", TINY)
    bundle = build_datasets(config["data"], seed=config["seed"])
    run = tmp_path / "run"
    fit(config, bundle, run, progress=False, log=lambda m: None, case_pictures=case_pictures_for(config))
    results = json.loads((run / "results.json").read_text())
    assert results["heatmaps"] == ["heatmaps/best_test_case_1.png", "heatmaps/worst_test_case_1.png"]
    assert not [w for w in results["warnings"] if "heatmaps" in w]
    with open(run / "predictions_test.csv", newline="") as f:
        cases = list(csv.DictReader(f))
    dice = [float(c["mean_dice"]) if c["mean_dice"] else -1.0 for c in cases]
    assert max(dice) > min(dice)  # the best and the worst differ, so both are drawn
    page = (run / "report.html").read_text()
    for name in results["heatmaps"]:
        picture = Image.open(run / name)
        assert picture.size[0] > 400 and len(np.unique(np.asarray(picture).reshape(-1, 4)[:, :3], axis=0)) > 20
        assert base64.b64encode((run / name).read_bytes()).decode() in page  # embedded in the page
    assert "Best test case 1." in page and "Worst test case 1." in page
