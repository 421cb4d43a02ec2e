"""Pretraining runs are not classifiers (issue 49): eval refuses them as predict does, with a true hint; the pool never
holds the config's validation or test images; --init-from refuses what would load less than the encoder; every
checkpoint.json field is checked (one line, no traceback)."""

from __future__ import annotations

import csv
import json
import re

import numpy as np
import pytest
import torch
from PIL import Image

from engine_data import TINY
from medattn.cli import main
from medattn.config import load_config
from medattn.data import build_datasets
from medattn.errors import UserError
from medattn.models import create_model
from medattn.pretrain import MaskedAutoencoder
from medattn.pretrain.data import pretraining_set
from medattn.runtime import checkpoint
from medattn.train.model_setup import initialise

PRETRAINED = {"objective": "masked autoencoding", "train_cases": 16, "pool": None, "pool_cases": 0}


def _error(capsys, argv) -> str:
    """Run the CLI, expect exit status 2 and one error line without a traceback; return it."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("medattn: error: ") and "Traceback" not in err[0]
    return err[0]


def test_eval_predict_and_explain_refuse_a_pretraining_run_with_a_true_hint(tmp_path, capsys):
    """`medattn eval` of a pretraining run printed an AUROC from a head that never saw a label; predict and explain
    refused it but told the user to use eval."""
    run = tmp_path / "pre"
    assert main(["pretrain", "synthetic_cxr", *TINY, "pretrain.epochs=1", "pretrain.batch_size=8", "--out", str(run),
                 "--no-progress"]) == 0
    image = tmp_path / "x.png"
    Image.fromarray(np.zeros((32, 32), dtype=np.uint8)).save(image)
    capsys.readouterr()
    for argv in (["eval", str(run), "synthetic_cxr", *TINY, "--no-progress"],
                 ["predict", str(run), str(image), "--out", str(tmp_path / "p.csv")],
                 ["explain", str(run), str(image), "--out", str(tmp_path / "maps")]):
        line = _error(capsys, argv)
        assert "is a pretraining run (masked autoencoding): its head never saw a label" in line
        assert f"train one from it with: medattn train CONFIG --init-from {run}" in line
        assert "medattn eval" not in line
    assert not (run / "eval_synthetic_cxr_test").exists()


def _image_table(folder, rows: int) -> str:
    """A labelled table of ``rows`` 40 px images split train, train, val, test in turn."""
    rng = np.random.default_rng(rows)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    with (folder / "cases.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "label", "split"])
        for i in range(rows):
            Image.fromarray(rng.integers(0, 255, (40, 40), dtype=np.uint8)).save(folder / f"images/l{i}.png")
            writer.writerow([f"images/l{i}.png", i % 2, ("train", "train", "val", "test")[i % 4]])
    return str(folder / "cases.csv")


def test_the_pool_never_holds_the_configs_validation_or_test_images(tmp_path):
    """A pool that listed the config's validation and test images was pretrained on, although the docs said never."""
    cases = _image_table(tmp_path / "labelled", 16)
    config = load_config(None, ["data.kind=image_table", f"data.csv={cases}", "data.label_columns=label",
                                "data.split_column=split", "data.image_size=32", "data.in_chans=1"])
    bundle = build_datasets(config["data"], seed=0)
    pool = tmp_path / "pool.csv"
    # every labelled image, one of them by another spelling of its path; train ones may be pooled, val/test not
    pool.write_text("path\n" + "".join(f"labelled/images/l{i}.png\n" for i in range(15))
                    + "labelled/images/../images/l15.png\n")
    dataset, described = pretraining_set(bundle, config["data"], pool)
    assert described["pool_cases"] == 8 and described["pool_held_out"] == 8
    assert len(dataset) == len(bundle.train) + 8
    held = tmp_path / "held.csv"
    held.write_text("path\n" + "".join(f"labelled/images/l{i}.png\n" for i in range(2, 16, 4)))
    with pytest.raises(UserError, match="every file it lists is one of the config's validation or test images"):
        pretraining_set(bundle, config["data"], held)


def _pretraining_checkpoint(folder, name: str):
    """A pretraining run's ``best`` for preset ``name`` (the encoder, a head that never saw a label)."""
    mae = MaskedAutoencoder(create_model(name, attention="seqnorm"))
    config = load_config(None, ["data.kind=synthetic_cxr", f"model.name={name}", "model.attention=seqnorm"])
    task = {"task_type": "binary", "input_kind": "image2d", "num_outputs": 1,
            "input_shape": [mae.encoder.in_chans, *mae.encoder.img_size]}
    checkpoint.save(folder, mae.encoder, {"config": config, "task": task, "epoch": 1, "pretrained": PRETRAINED})
    return folder


def test_init_from_refuses_a_checkpoint_that_would_load_less_than_the_encoder(tmp_path):
    """`--init-from` a vit2d_small pretraining run into vit2d_tiny loaded one tensor (the head's untrained bias) and
    recorded the run as pretrained; into a ResNet likewise."""
    small = _pretraining_checkpoint(tmp_path / "small", "vit2d_small")
    with pytest.raises(UserError, match=r"\(vit2d_small\): it would load less than the encoder: .* another shape"):
        initialise(create_model("vit2d_tiny", attention="seqnorm", num_classes=1), small, lambda m: None)
    tiny = _pretraining_checkpoint(tmp_path / "tiny", "vit2d_tiny")
    with pytest.raises(UserError, match="it would load none of the encoder"):
        initialise(create_model("resnet2d_tiny", num_classes=1), tiny, lambda m: None)
    # the same preset (another head) loads its whole encoder and records the pretraining; so does another mechanism
    lines = []
    report = initialise(create_model("vit2d_tiny", attention="seqnorm", num_classes=3), tiny, lines.append)
    assert report["pretrained"] == PRETRAINED
    assert sorted(report["new_tensors"]) == sorted(report["unused_tensors"]) == ["head.bias", "head.weight"]
    other = initialise(create_model("vit2d_tiny", attention="softmax", num_classes=1), tiny, lines.append)
    assert other["new_tensors"] == [] and all("_norm." in name for name in other["unused_tensors"])
    assert "pretrained by masked autoencoding" in lines[0]


@pytest.mark.parametrize("key, value, message", [
    ("pretrained", "yes", "pretrained is invalid (got 'yes'); pretrained must be a mapping with objective"),
    ("pretrained", {"objective": "mae", "train_cases": -1}, "pretrained is invalid"),
    ("epoch", "three", "epoch is invalid (got 'three'); epoch must be an integer >= 0"),
    ("val_auroc", "high", "val_auroc is invalid (got 'high'); val_auroc must be a number or null"),
    ("threshold", {"values": [2.0]}, "threshold.values must list 1 number"),
    ("threshold", [0.5], "threshold is invalid"),
    ("preprocessing", [1], "preprocessing is invalid"),
    ("before_training", {"pooled_path": 0.1},
     "before_training is invalid (got {'pooled_path': 0.1}); before_training must be a mapping of mappings"),
])
def test_every_checkpoint_json_field_is_checked(tmp_path, capsys, key, value, message):
    """A hand-edited ``"pretrained": "yes"`` ended in a TypeError traceback; each field is one line now."""
    folder = _pretraining_checkpoint(tmp_path / "ck", "vit2d_tiny")
    meta = json.loads((folder / "checkpoint.json").read_text())
    meta[key] = value
    (folder / "checkpoint.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match=re.escape(message)):
        checkpoint.load_meta(folder)
    with pytest.raises(UserError, match=re.escape(message)):
        initialise(create_model("vit2d_tiny", attention="seqnorm", num_classes=1), folder, lambda m: None)
    assert message.split(" (")[0] in _error(capsys, ["train", "synthetic_cxr", *TINY, "--init-from", str(folder),
                                                     "--out", str(tmp_path / "run")])
    assert not torch.is_tensor(value)
