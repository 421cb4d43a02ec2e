"""A command's inputs are never written over (issue 49): a CONFIG inside --out stays, with or without --overwrite;
cv leaves a folder's own report.html and cv.csv alone; a run killed inside its first checkpoint writes resumes."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from engine_data import TINY, image_bundle
from medattn.cli import main
from medattn.config import load_config
from medattn.errors import UserError
from medattn.experiments import cv
from medattn.pretrain import pretrain
from medattn.runtime import checkpoint

USER_CONFIG = "name: mine\ndata:\n  kind: synthetic_cxr\n"


def _error(capsys, argv) -> str:
    """Run the CLI, expect exit status 2 and one error line; return it."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("medattn: error: ")
    return err[0]


@pytest.mark.parametrize("command", ["train", "pretrain"])
def test_a_config_inside_out_is_never_moved_or_replaced(tmp_path, capsys, command):
    """`medattn train DIR/config.yaml --out DIR --overwrite` moved the user's config aside, deleted it and wrote the
    resolved one; without --overwrite the refusal called the config "a run"."""
    run = tmp_path / "run"
    run.mkdir()
    config = run / "config.yaml"
    config.write_text(USER_CONFIG)
    for extra in ([], ["--overwrite"], ["--resume"]):
        line = _error(capsys, [command, str(config), *TINY, "--out", str(run), "--no-progress", *extra])
        assert f"CONFIG {config} lies inside --out {run}, where the run writes config.yaml" in line
        assert "already holds a run" not in line
        assert config.read_text() == USER_CONFIG and sorted(p.name for p in run.iterdir()) == ["config.yaml"]


def test_resume_may_read_the_runs_own_config(tmp_path, capsys):
    """A run with a checkpoint leaves its config.yaml alone when resumed, so `--resume` may be given it as CONFIG."""
    run = tmp_path / "run"
    assert main(["train", "synthetic_cxr", *TINY, "--out", str(run), "--no-progress"]) == 0
    saved = (run / "config.yaml").read_text()
    assert main(["train", str(run / "config.yaml"), "--out", str(run), "--resume", "--no-progress"]) == 0
    assert (run / "config.yaml").read_text() == saved
    line = _error(capsys, ["train", str(run / "config.yaml"), "--out", str(run), "--overwrite"])
    assert "lies inside --out" in line and (run / "config.yaml").read_text() == saved


def test_a_file_the_config_names_inside_out_is_refused(tmp_path, capsys):
    """Any input the config names (here the pool) that lies where the run writes is refused before anything moves."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    pool = run / "checkpoints" / "pool.csv"
    pool.write_text("path\n")
    line = _error(capsys, ["pretrain", "synthetic_cxr", *TINY, f"pretrain.pool={pool}", "--out", str(run),
                           "--overwrite", "--no-progress"])
    assert f"pretrain.pool {pool} lies inside --out {run}, where the run writes checkpoints" in line
    assert pool.read_text() == "path\n"


def _killed_inside_first_last(run) -> None:
    """The state a SIGKILL inside the first ``checkpoints/last`` write leaves (``best`` complete, ``last`` half
    written under its temporary name, nothing after the epoch)."""
    os.replace(run / "checkpoints/last", run / "checkpoints/.last.tmp-99999")
    (run / "checkpoints/.last.tmp-99999/model.safetensors").write_text("half written")
    for name in ("results.json", "predictions_test.csv", "roc_test.png", "report.html", "heatmaps", "pretrain.json"):
        path = run / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)


def _killed_inside_first_best(run) -> None:
    """The state a SIGKILL inside the first ``checkpoints/best`` write leaves (no checkpoint, ``best`` half written
    under its temporary name; config.yaml and metrics.csv written)."""
    _killed_inside_first_last(run)
    shutil.rmtree(run / "checkpoints/.last.tmp-99999")
    os.replace(run / "checkpoints/best", run / "checkpoints/.best.tmp-99999")


@pytest.mark.parametrize("kill", [_killed_inside_first_last, _killed_inside_first_best])
def test_the_train_command_resumes_a_run_killed_inside_its_first_checkpoints(tmp_path, capsys, kill):
    """`medattn train --resume` refused such a run ("start it again with --overwrite"); a config other than the one the
    run saved is still refused."""
    run = tmp_path / "run"
    argv = ["train", "synthetic_cxr", *TINY, "--out", str(run), "--no-progress"]
    assert main(argv) == 0
    kill(run)
    capsys.readouterr()
    assert "differs from the run's saved config in train.lr" in _error(capsys, [*argv, "train.lr=0.5", "--resume"])
    assert main([*argv, "--resume"]) == 0
    assert "training it again from epoch 1" in capsys.readouterr().out
    assert json.loads((run / "results.json").read_text())["best_epoch"] == 1
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best", "last"]


@pytest.mark.parametrize("kill", [_killed_inside_first_last, _killed_inside_first_best])
def test_pretraining_killed_inside_its_first_checkpoints_resumes(tmp_path, kill):
    """`medattn pretrain --resume` of such a run said there was no checkpoint to resume from."""
    bundle = image_bundle(16)
    config = load_config(None, ["data.kind=synthetic_cxr", "model.name=vit2d_tiny", "model.attention=seqnorm",
                                "pretrain.epochs=1", "pretrain.batch_size=8", "train.threads=1"])
    whole = pretrain(config, bundle, tmp_path / "whole", progress=False, log=lambda m: None)
    pretrain(config, bundle, tmp_path / "cut", progress=False, log=lambda m: None)
    kill(tmp_path / "cut")
    changed = load_config(None, ["data.kind=synthetic_cxr", "model.name=vit2d_tiny", "model.attention=seqnorm",
                                 "pretrain.epochs=1", "pretrain.batch_size=8", "train.threads=1", "pretrain.lr=0.5"])
    with pytest.raises(UserError, match="differs from the pretraining run's saved config"):
        pretrain(changed, bundle, tmp_path / "cut", resume=True, progress=False, log=lambda m: None)
    lines = []
    resumed = pretrain(config, bundle, tmp_path / "cut", resume=True, progress=False, log=lines.append)
    assert any("pretraining it again from epoch 1" in line for line in lines)
    assert resumed["final_loss"] == whole["final_loss"]
    a, b = (checkpoint.load_weights(tmp_path / run / "checkpoints" / "last") for run in ("whole", "cut"))
    assert a.keys() == b.keys()
    assert sorted(p.name for p in (tmp_path / "cut" / "checkpoints").iterdir()) == ["best", "last"]


@pytest.mark.parametrize("name", ["cv.csv", "report.html", "cv.json"])
def test_cv_refuses_a_folder_holding_the_users_own_summary_files(tmp_path, monkeypatch, name):
    """`medattn cv CONFIG --out DIR` replaced a user's report.html and cv.csv in DIR with exit 0."""
    def never(*args, **kwargs):
        raise AssertionError("a fold ran")

    monkeypatch.setattr(cv, "run_jobs", never)
    (tmp_path / name).write_text("the user's own file")
    config = load_config("synthetic_cxr", TINY)
    with pytest.raises(UserError, match=f"{name} was not written by medattn cv: refusing to replace it"):
        cv.cross_validate(config, 2, tmp_path, progress=False, log=lambda m: None)
    assert (tmp_path / name).read_text() == "the user's own file"
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
