"""Ctrl-C (and a scheduler's SIGTERM) during ``medattn train``: one line saying what was kept and the command that
resumes it."""

from __future__ import annotations

import os
import shlex
import signal

from medattn.cli import main
from medattn.train import loop

ARGS = ["synthetic_cxr", "model.name=vit2d_tiny", "data.image_size=32", "data.num_samples=[16,8,8]",
        "train.epochs=3", "eval.bootstrap=0", "eval.heatmaps=0"]


def _ctrl_c() -> None:
    raise KeyboardInterrupt


def _interrupt_in_epoch(monkeypatch, epoch: int, interrupt=_ctrl_c) -> None:
    real = loop.train_one_epoch

    def train_one_epoch(*args, **kwargs):
        if args[9] == epoch:  # the epoch argument
            interrupt()
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "train_one_epoch", train_one_epoch)


def test_ctrl_c_after_an_epoch_says_how_to_resume_and_the_command_resumes(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    _interrupt_in_epoch(monkeypatch, 2)
    assert main(["train", *ARGS, "--out", str(run), "--no-progress"]) == 130
    err = capsys.readouterr().err.strip()
    assert err.startswith("medattn: interrupted (Ctrl-C): ") and "\n" not in err and "Traceback" not in err
    command = err.split("continue it with: ", 1)[1]
    assert command.endswith("--resume") and str(run) in command
    monkeypatch.undo()
    assert main([*shlex.split(command)[1:], "--no-progress"]) == 0
    assert "resuming" in capsys.readouterr().out and (run / "results.json").is_file()


def test_ctrl_c_before_the_first_epoch_finished_says_nothing_is_kept(tmp_path, monkeypatch, capsys):
    _interrupt_in_epoch(monkeypatch, 1)
    assert main(["train", *ARGS, "--out", str(tmp_path / "run"), "--no-progress"]) == 130
    err = capsys.readouterr().err.strip()
    assert "no epoch had finished" in err and "\n" not in err


def test_ctrl_c_during_an_overwrite_brings_the_previous_run_back(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    assert main(["train", *ARGS, "train.epochs=1", "--out", str(run), "--no-progress"]) == 0
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    _interrupt_in_epoch(monkeypatch, 2)
    assert main(["train", *ARGS, "seed=4", "--out", str(run), "--overwrite", "--no-progress"]) == 130
    assert "is back as it was" in capsys.readouterr().err
    after = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == before


def test_a_schedulers_sigterm_stops_the_run_as_ctrl_c_does_and_the_handler_is_restored(tmp_path, monkeypatch, capsys):
    """Slurm's time limit, Kubernetes: SIGTERM to the process during epoch 2 gives Ctrl-C's line and exit 143. The
    test's own handler stands in for the default (which would end the test process) and must be back afterwards."""

    def reached_the_test(signum, frame):
        raise AssertionError("SIGTERM reached the test's handler: medattn installed none")

    before = signal.signal(signal.SIGTERM, reached_the_test)
    try:
        run = tmp_path / "run"
        _interrupt_in_epoch(monkeypatch, 2, lambda: os.kill(os.getpid(), signal.SIGTERM))
        assert main(["train", *ARGS, "--out", str(run), "--no-progress"]) == 143
        err = capsys.readouterr().err.strip()
        assert err.startswith("medattn: interrupted (SIGTERM): ") and "\n" not in err and "Traceback" not in err
        assert err.split("continue it with: ", 1)[1].endswith("--resume")
        assert signal.getsignal(signal.SIGTERM) is reached_the_test
    finally:
        signal.signal(signal.SIGTERM, before)
