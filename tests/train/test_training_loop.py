"""The training loop (:func:`medattn.train.fit`, :mod:`medattn.train.loop`): the run folder it writes, seeds,
learning on easy tasks, bags, model/data checks, the learning-rate schedule, the best epoch, learning and size
warnings."""

import csv
import json

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from safetensors.torch import load_file

from engine_data import bag_bundle, image_bundle, tiny_config
from medattn.data.base import TaskInfo
from medattn.errors import UserError
from medattn.runtime.build import build_model, check_model_config
from medattn.runtime.device import check_device
from medattn.train import fit
from medattn.train.defaults import resolve_training
from medattn.train.loop import improves
from medattn.train.model_setup import size_warnings
from medattn.train.optim import lr_at
from medattn.train.report import learning_warnings


def _run(tmp_path, bundle, *overrides, name="run", **kwargs):
    return fit(tiny_config(*overrides), bundle, tmp_path / name, progress=False, log=lambda m: None, **kwargs)


def test_fit_writes_the_run_folder(tmp_path):
    bundle = image_bundle()
    results = _run(tmp_path, bundle)
    run = tmp_path / "run"
    # saved as resolved: the train keys left null hold the model's own values (medattn.train.defaults)
    assert yaml.safe_load((run / "config.yaml").read_text()) == resolve_training(tiny_config())[0]
    with Image.open(run / "roc_test.png") as png:
        assert png.format == "PNG" and min(png.size) >= 200
    with Image.open(run / "training_curves.png") as png:  # loss and validation score per epoch
        assert png.format == "PNG" and png.size[0] > png.size[1]
    # the best checkpoint is the model that wrote predictions_test.csv; the last one holds the optimizer state
    model = build_model(tiny_config()["model"], bundle.task).eval()
    model.load_state_dict(load_file(run / "checkpoints/best/model.safetensors"))
    with torch.no_grad():
        probs = model(torch.stack([bundle.test[i]["input"] for i in range(len(bundle.test))])).sigmoid()[:, 0]
    written = [float(r["prob_0"]) for r in csv.DictReader(open(run / "predictions_test.csv"))]
    assert written == pytest.approx(probs.tolist(), abs=1e-6)
    state = load_file(run / "checkpoints/last/training_state.safetensors")
    assert any(k.endswith("exp_avg_sq") for k in state) and "rng.torch" in state
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


@pytest.mark.parametrize("overrides, bf16_hardware", [
    (("train.grad_accum=3",), None), (("train.precision=bf16",), True), (("train.precision=bf16",), False),
    (("model.attention=sima", "train.grad_clip=0"), None)], ids=["grad_accum", "bf16-cpu", "bf16-on-avx2-only-cpu",
                                                                 "sima"])
def test_options_still_learn(tmp_path, monkeypatch, overrides, bf16_hardware):
    """Each option trains, not merely runs: the training loss falls every epoch on a learnable task. A bf16 run is
    validated in bf16 where the CPU has bf16 hardware, else in fp32: both branches run on every CPU (simulated)."""
    if bf16_hardware is not None:
        from medattn.runtime import device

        monkeypatch.setattr(device, "bf16_in_hardware", lambda where: bf16_hardware)
    results = _run(tmp_path, image_bundle(48), "train.epochs=3", *overrides)
    losses = [float(r["train_loss"]) for r in csv.DictReader(open(tmp_path / "run/metrics.csv"))]
    assert len(losses) == 3 and losses[0] > losses[1] > losses[2] and losses[2] < 0.8 * losses[0]
    assert results["val_auroc"] > 0.7


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
    image = TaskInfo("binary", "image2d", 1, (1, 32, 32))
    with pytest.raises(UserError, match="^model.attention: unknown attention 'nope'"):
        build_model({"name": "vit2d_tiny", "attention": "nope"}, image)
    with pytest.raises(UserError, match="^model.kwargs.dropout: model 'vit2d_tiny' takes no argument 'dropout'"):
        build_model({"name": "vit2d_tiny", "attention": None, "kwargs": {"dropout": 0.1}}, image)
    with pytest.raises(UserError, match=r"^model.kwargs \{'depth': 0\} .* do not build model 'vit2d_tiny': depth"):
        build_model({"name": "vit2d_tiny", "attention": None, "kwargs": {"depth": 0}}, image)
    with pytest.raises(UserError, match="^model.attention: model 'unet3d' has no attention mechanism"):
        check_model_config({"name": "unet3d", "attention": "softmax", "kwargs": {}})


def test_a_device_the_machine_lacks_is_a_user_error():
    with pytest.raises(UserError, match="^train.device=cuda:99: this machine has"):
        check_device("cuda:99")
    check_device("cpu")


def test_model_takes_sizes_from_the_task():
    model = build_model({"name": "vit3d_tiny", "attention": "seqnorm"}, TaskInfo("multilabel", "volume3d", 4,
                                                                                 (2, 16, 16, 8)))
    assert model(torch.randn(1, 2, 16, 16, 8)).shape == (1, 4)


def test_lr_schedule_warms_up_then_decays():
    lrs = [lr_at(s, 10, 2, 1.0, 0.0) for s in range(10)]
    assert lrs[:2] == [0.5, 1.0]
    assert lrs[2] == 1.0 and all(a > b for a, b in zip(lrs[2:], lrs[3:]))
    assert lr_at(10, 10, 2, 1.0, 0.1) == pytest.approx(0.1)


@pytest.mark.parametrize("score, loss, expected", [
    (0.9, 0.50, True),    # a higher score wins whatever the loss
    (0.8, 0.10, False),   # a lower score loses whatever the loss
    (0.85, 0.30, True),   # a tie at the best score: the lower validation loss wins
    (0.85, 0.40, False),  # a tie with a higher loss keeps the earlier epoch
])
def test_best_epoch_breaks_ties_by_validation_loss(score, loss, expected):
    state = {"best_score": 0.85, "best_loss": 0.35, "best_epoch": 2}
    assert improves(state, score, loss) is expected
    assert improves({"best_score": None, "best_loss": None}, score, loss)


@pytest.mark.parametrize("losses, probabilities, expected", [
    ([0.693, 0.692, 0.693], np.linspace(0.1, 0.9, 20)[:, None], ["never left its start"]),
    ([0.693, 0.40, 0.21], np.full((20, 1), 0.5) + np.linspace(0, 0.01, 20)[:, None], ["collapse to a band"]),
    ([0.693, 0.40, 0.21], np.linspace(0.1, 0.9, 20)[:, None], []),
    ([0.693, 0.692], np.full((20, 1), 0.5), ["never left its start", "collapse to a band"]),
    ([0.693], None, []),  # one epoch: no trend to judge; segmentation: no probabilities
    # ihc_bags, 40 epochs: down to 0.19, back to 0.70 at the end: it learned, then fell back (not "never left")
    ([0.695, 0.359, 0.190, 0.574, 0.699], np.linspace(0.1, 0.9, 20)[:, None], ["rose back"]),
])
def test_learning_warnings(losses, probabilities, expected):
    found = learning_warnings(losses, probabilities)
    assert len(found) == len(expected) and all(e in f for e, f in zip(expected, found))


def test_a_run_that_learns_nothing_says_so(tmp_path):
    logged = []
    results = fit(tiny_config("train.lr=1e-9"), image_bundle(), tmp_path / "run", progress=False, log=logged.append)
    assert any("never left its start" in w for w in results["warnings"])
    assert "WARNING        the train loss never left its start" in logged[-1]
    assert json.loads((tmp_path / "run/results.json").read_text())["warnings"] == results["warnings"]
    learned = _run(tmp_path, image_bundle(48), "train.epochs=4", "model.attention=seqnorm", name="learns")
    assert not any("never left its start" in w for w in learned["warnings"])


@pytest.mark.parametrize("name, shape, kwargs, ratio", [
    ("vit2d_small", (1, 224, 224), {}, "12.2x"),  # made for 64 px with patches of 8: 64 tokens, here 784
    ("vit2d_small", (1, 64, 64), {}, None),
    ("vit2d_small", (1, 224, 224), {"patch_size": 28}, None),  # the user's patch size brings it back to 64
    ("vit2d_small", (1, 224, 224), {"img_size": 224}, None),  # the user chose the size
    ("vit2d_small", (1, 32, 32), {}, "0.25x"),  # far fewer tokens than designed
    ("vit3d_small", (1, 64, 64, 32), {}, "8x"),
    ("resnet2d_small", (1, 224, 224), {}, None),  # no tokens
])
def test_a_preset_far_from_its_design_size_is_a_warning(name, shape, kwargs, ratio):
    task = TaskInfo("binary", "image2d" if len(shape) == 3 else "volume3d", 1, shape)
    warnings = size_warnings({"name": name, "attention": None, "kwargs": kwargs}, task)
    assert (warnings == []) if ratio is None else (len(warnings) == 1 and f"({ratio})" in warnings[0])


def test_the_size_warning_reaches_the_summary_and_results(tmp_path):
    bundle = image_bundle()
    results = _run(tmp_path, bundle, "model.name=vit2d_tiny", "model.kwargs.patch_size=4")
    assert any("tokens" in w for w in results["warnings"])
    assert json.loads((tmp_path / "run/results.json").read_text())["warnings"] == results["warnings"]


def test_a_log_line_shows_a_few_tensor_names_and_counts_the_rest():
    """--init-from printed about 250 tensor names on one line."""
    from medattn.train.model_setup import SHOWN_NAMES, _some

    names = [f"encoder.blocks.{i}.attn.q_norm.weight" for i in range(40)]
    assert _some(names).count("encoder") == SHOWN_NAMES and _some(names).endswith(f"and {40 - SHOWN_NAMES} more")
    assert _some(names[:2]) == ", ".join(names[:2])
