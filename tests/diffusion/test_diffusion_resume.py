"""The diffusion stages are objectives of the training loop: a stage killed after an epoch resumes (``--resume``) to
the numbers, results and weights of an uninterrupted run, and a resume with another config is refused."""

import csv
import json

import pytest
import torch
from safetensors.torch import load_file

from medattn.catalogue import TRAINING_TASKS
from medattn.cli import main
from medattn.config import load_config
from medattn.diffusion.data import volume_bundle
from medattn.errors import UserError
from medattn.train import fit
from medattn.train.training_tasks import training_task

DATA = ["data.size=[16, 16, 32]", "data.num_samples={train: 3, val: 1, test: 1}", "train.threads=1"]
STAGE1 = ["synthetic_brain_vqae", *DATA, "train.epochs=2", "train.batch_size=5", "model.kwargs.patch_size=8",
          "model.kwargs.channels=[4, 4]", "model.kwargs.embed_dim=16", "model.kwargs.codebook_size=8"]
STAGE2 = ["synthetic_brain_transformer", *DATA, "train.epochs=3", "train.batch_size=2", "model.kwargs.dim=16",
          "model.kwargs.depth=1", "model.kwargs.num_heads=2", "diffusion.sample_steps=4"]


class Killed(Exception):
    """Stands in for the process dying right after an epoch's checkpoints were written."""


def _kill_after(epoch):
    def hook(done, row):
        if done == epoch:
            raise Killed

    return hook


def _fit(args, run, **kwargs):
    config = load_config(args[0], args[1:])
    return fit(config, volume_bundle(config), run, progress=False, log=lambda message: None, **kwargs)


def _assert_same_runs(full, resumed, epochs):
    rows = [[{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(open(run / "metrics.csv"))]
            for run in (full, resumed)]
    assert len(rows[0]) == epochs and rows[0] == rows[1]
    assert json.loads((full / "results.json").read_text()) == json.loads((resumed / "results.json").read_text())
    for name in ("last", "best"):
        a, b = (load_file(run / "checkpoints" / name / "model.safetensors") for run in (full, resumed))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_every_task_has_an_objective_of_the_loop():
    assert set(TRAINING_TASKS) == {"supervised", "diffusion_vqae", "diffusion_transformer"}
    assert all(callable(training_task(name)) for name in TRAINING_TASKS)


def test_a_killed_diffusion_stage_resumes_to_the_uninterrupted_numbers(tmp_path, capsys):
    stage1, resumed1 = tmp_path / "vqae", tmp_path / "vqae_resumed"
    _fit(STAGE1, stage1)
    with pytest.raises(Killed):
        _fit(STAGE1, resumed1, on_epoch_end=_kill_after(1))
    assert (resumed1 / "checkpoints/last/training_state.safetensors").is_file()
    assert not (resumed1 / "results.json").exists()
    _fit(STAGE1, resumed1, resume=True)
    _assert_same_runs(stage1, resumed1, 2)

    stage2 = [*STAGE2, f"diffusion.vqae_checkpoint={stage1}"]
    full, resumed2 = tmp_path / "transformer", tmp_path / "transformer_resumed"
    _fit(stage2, full)
    with pytest.raises(Killed):
        _fit(stage2, resumed2, on_epoch_end=_kill_after(2))
    with pytest.raises(UserError, match="differs from the run's saved config in diffusion.temperature"):
        _fit([*stage2, "diffusion.temperature=0.5"], resumed2, resume=True)
    assert main(["train", *stage2, "--out", str(resumed2), "--resume", "--no-progress"]) == 0
    assert f"resuming {resumed2} after epoch 2" in capsys.readouterr().out
    _assert_same_runs(full, resumed2, 3)

    assert main(["train", *stage2, "--out", str(tmp_path / "init"), "--init-from", str(full)]) == 2
    assert "--init-from is not supported by the diffusion stages" in capsys.readouterr().err
