import csv

import pytest
import torch
from safetensors.torch import load_file

from engine_data import image_bundle, tiny_config
from medattn.errors import UserError
from medattn.models import create_model
from medattn.train import checkpoint, fit


class Killed(Exception):
    """Stands in for the process dying right after an epoch's checkpoint was written."""


def _fit(config, run_dir, **kwargs):
    return fit(config, image_bundle(), run_dir, progress=False, log=lambda m: None, **kwargs)


def _kill_after(epoch):
    def hook(done, row):
        if done == epoch:
            raise Killed

    return hook


def test_resume_gives_the_same_final_metrics_as_an_uninterrupted_run(tmp_path):
    config = tiny_config("train.epochs=3", "train.grad_accum=2")
    full = _fit(config, tmp_path / "full")
    with pytest.raises(Killed):
        _fit(config, tmp_path / "resumed", on_epoch_end=_kill_after(1))
    resumed = _fit(config, tmp_path / "resumed", resume=True)
    assert resumed["test"] == full["test"]
    assert resumed["best_epoch"] == full["best_epoch"] and resumed["val_auroc"] == full["val_auroc"]
    rows = [list(csv.DictReader(open(tmp_path / run / "metrics.csv"))) for run in ("full", "resumed")]
    assert [{k: r[k] for k in ("epoch", "lr", "train_loss", "val_auroc")} for r in rows[0]] == \
           [{k: r[k] for k in ("epoch", "lr", "train_loss", "val_auroc")} for r in rows[1]]
    full_w = load_file(tmp_path / "full/checkpoints/last/model.safetensors")
    resumed_w = load_file(tmp_path / "resumed/checkpoints/last/model.safetensors")
    assert all(torch.equal(full_w[k], resumed_w[k]) for k in full_w)


def test_output_folder_with_a_run_is_refused(tmp_path):
    config = tiny_config("train.epochs=1")
    _fit(config, tmp_path / "run")
    with pytest.raises(UserError, match="already holds a run; use --resume"):
        _fit(config, tmp_path / "run")
    _fit(config, tmp_path / "run", overwrite=True)
    with pytest.raises(UserError, match="differs from the run's saved config in train.lr"):
        _fit(tiny_config("train.epochs=1", "train.lr=0.5"), tmp_path / "run", resume=True)
    with pytest.raises(UserError, match="no checkpoint to resume"):
        _fit(config, tmp_path / "empty", resume=True)


def test_init_from_another_mechanism_reports_new_tensors(tmp_path):
    _fit(tiny_config("train.epochs=1"), tmp_path / "softmax")
    results = _fit(tiny_config("train.epochs=1", "model.attention=seqnorm"), tmp_path / "seqnorm",
                   init_from=tmp_path / "softmax")
    new = results["init_from"]["new_tensors"]
    assert new and all("norm" in name and ".attn." in name for name in new)
    model = create_model("vit2d_tiny", attention="seqnorm", num_classes=1)
    fresh, unused = checkpoint.init_from(model, checkpoint.resolve(tmp_path / "softmax"))
    assert fresh == new and unused == []
    source = load_file(tmp_path / "softmax/checkpoints/best/model.safetensors")
    assert torch.equal(model.state_dict()["encoder.blocks.0.attn.qkv.weight"],
                       source["encoder.blocks.0.attn.qkv.weight"])


def test_atomic_write_keeps_the_previous_checkpoint(tmp_path):
    model = torch.nn.Linear(2, 1)
    checkpoint.save(tmp_path / "ck", model, {"config": {}, "task": {}, "epoch": 1})
    with pytest.raises(RuntimeError):
        with checkpoint.atomic_dir(tmp_path / "ck") as tmp:
            (tmp / "model.safetensors").write_text("half written")
            raise RuntimeError("killed while writing")
    assert checkpoint.load_meta(checkpoint.resolve(tmp_path / "ck"))["epoch"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_corrupt_or_missing_checkpoint_is_a_user_error(tmp_path):
    model = torch.nn.Linear(2, 1)
    checkpoint.save(tmp_path / "ck", model, {"config": {}, "task": {}})
    (tmp_path / "ck/model.safetensors").write_bytes(b"\x80\x04not safetensors")
    with pytest.raises(UserError, match="unreadable weights"):
        checkpoint.load_model(tmp_path / "ck", model)
    with pytest.raises(UserError, match="no checkpoint found"):
        checkpoint.resolve(tmp_path / "nothing")


def test_optimizer_and_rng_state_round_trip(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    checkpoint.save(tmp_path / "ck", model, {"config": {}, "task": {}}, optimizer, {"epoch": 3})
    expected = torch.rand(5)
    other = torch.optim.AdamW(torch.nn.Linear(3, 2).parameters(), lr=0.5)
    state = checkpoint.load_training_state(tmp_path / "ck", other)
    assert state["epoch"] == 3 and torch.equal(torch.rand(5), expected)
    for a, b in zip(optimizer.state_dict()["state"].values(), other.state_dict()["state"].values()):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert other.param_groups[0]["lr"] == 0.1
