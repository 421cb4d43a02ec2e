"""Bad input through the real command line: exit status 2, one line naming the key or file, no traceback,
and nothing of the previous run in the output folder is lost.

Each case gets a copy of one finished tiny run (``run``) and a scratch folder; the train cases write into
that run with ``--overwrite``, so a run deleted before the input was checked shows up as lost files.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import traceback
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from safetensors.torch import load_file, save_file

from engine_data import TINY
from medattn.cli import main


def _train(run: Path, *overrides: str, options: tuple[str, ...] = ("--overwrite",)) -> list[str]:
    return ["train", "synthetic_cxr", *TINY, *overrides, "--out", str(run), "--no-progress", *options]


def _yaml(tmp: Path, text: str) -> str:
    path = tmp / "c.yaml"
    path.write_text(text)
    return str(path)


def _write(path: Path, text: str) -> None:
    path.write_text(text)


def _then(done: None, argv: list[str]) -> list[str]:
    """``argv`` after a preparation step (``done``, evaluated first) has changed the files."""
    return argv


def _edit_meta(run: Path, edit) -> None:
    for name in ("best", "last"):
        path = run / "checkpoints" / name / "checkpoint.json"
        meta = json.loads(path.read_text())
        edit(meta)
        path.write_text(json.dumps(meta))


def _edit_weights(run: Path, name: str = "best", tensor: str = "head.weight") -> None:
    path = run / "checkpoints" / name / "model.safetensors"
    weights = load_file(path)
    weights[tensor] = weights[tensor][..., :-1].contiguous()
    save_file(weights, path)


def _rename_tensors(run: Path) -> None:
    """The weights of some other network: every tensor under a name the model does not have."""
    path = run / "checkpoints" / "best" / "model.safetensors"
    save_file({f"other.{k}": v for k, v in load_file(path).items()}, path)


def _bomb(tmp: Path) -> list[str]:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        previous = chr(ord("a") + i - 1)
        lines.append(f"{chr(ord('a') + i)}: &{chr(ord('a') + i)} [{','.join([f'*{previous}'] * 9)}]")
    return ["train", _yaml(tmp, "data:\n  kind: synthetic_cxr\n  " + "\n  ".join(lines) + "\n")]


HELD: list = []  # lock files held by a case (as a running `medattn train` holds its folder), closed after it


def _locked(tmp: Path, run: Path) -> list[str]:
    HELD.append(open(run / ".lock", "a"))  # noqa: SIM115 (closed by the test after the case)
    fcntl.flock(HELD[-1], fcntl.LOCK_EX | fcntl.LOCK_NB)
    return _train(run)


def _fifo(tmp: Path, run: Path) -> list[str]:
    os.mkfifo(tmp / "pipe.png")
    return ["predict", str(run), str(tmp / "pipe.png"), "--out", str(tmp / "p.csv")]


def _readonly(tmp: Path, run: Path) -> list[str]:
    (tmp / "ro").mkdir()
    (tmp / "ro").chmod(0o500)
    return _train(tmp / "ro" / "run")


def _file(tmp: Path, name: str = "file") -> Path:
    (tmp / name).write_text("not a folder")
    return tmp / name


def _resume_mismatch(tmp: Path, run: Path) -> list[str]:
    _edit_weights(run, "last")
    return _train(run, options=("--resume",))


def _denied(monkeypatch):
    """What a read-only parent gives even to root: mkdir of the run folder fails with EACCES."""
    def mkdir(self, *args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))

    monkeypatch.setattr(Path, "mkdir", mkdir)


def _disk_full(monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("medattn.runtime.checkpoint.save_file", full)


# case id -> (argv from (scratch folder, run folder), a fragment the error line must name, monkeypatch or None)
CASES = {
    "eval.bootstrap=-5": (lambda t, r: _train(r, "eval.bootstrap=-5"), "eval.bootstrap", None),
    "train.betas=x": (lambda t, r: _train(r, "train.betas=x"), "train.betas", None),
    "train.betas three values": (lambda t, r: _train(r, "train.betas=[0.9, 0.9, 0.9]"), "train.betas", None),
    "train.device=foo": (lambda t, r: _train(r, "train.device=foo"), "train.device", None),
    "train.threads=-1": (lambda t, r: _train(r, "train.threads=-1"), "train.threads", None),
    "train.warmup_epochs=.inf": (lambda t, r: _train(r, "train.warmup_epochs=.inf"), "train.warmup_epochs", None),
    "model=3": (lambda t, r: _train(r, "model=3"), "model", None),
    "model.kwargs unknown key": (lambda t, r: _train(r, "model.kwargs.nope=1"), "model.kwargs.nope", None),
    "model.kwargs.depth=0": (lambda t, r: _train(r, "model.kwargs.depth=0"), "model.kwargs", None),
    "model.kwargs.embed_dim=abc": (lambda t, r: _train(r, "model.kwargs.embed_dim=abc"), "model.kwargs", None),
    "model.kwargs.num_heads=3 (embed 32)": (lambda t, r: _train(r, "model.kwargs.num_heads=3"), "model.kwargs",
                                            None),
    "model.attention=nope": (lambda t, r: _train(r, "model.attention=nope"), "model.attention", None),
    "model.name=[1]": (lambda t, r: _train(r, "model.name=[1]"), "model.name", None),
    "train.lr=.nan": (lambda t, r: _train(r, "train.lr=.nan"), "train.lr", None),
    "train.lr=-1": (lambda t, r: _train(r, "train.lr=-1"), "train.lr", None),
    "train.epochs=0": (lambda t, r: _train(r, "train.epochs=0"), "train.epochs", None),
    "train.batch_size=0": (lambda t, r: _train(r, "train.batch_size=0"), "train.batch_size", None),
    "train.eval_batch_size=0": (lambda t, r: _train(r, "train.eval_batch_size=0"), "train.eval_batch_size", None),
    "train.grad_clip=-1": (lambda t, r: _train(r, "train.grad_clip=-1"), "train.grad_clip", None),
    "train.num_workers=-1": (lambda t, r: _train(r, "train.num_workers=-1"), "train.num_workers", None),
    "train.skip_bad=maybe": (lambda t, r: _train(r, "train.skip_bad=maybe"), "train.skip_bad", None),
    "seed=-1": (lambda t, r: _train(r, "seed=-1"), "seed", None),
    "eval.ci=x": (lambda t, r: _train(r, "eval.ci=x"), "eval.ci", None),
    "name=2020-01-01 (a date)": (lambda t, r: _train(r, "name=2020-01-01"), "name", None),
    "data.note=2020-01-01 (a date)": (lambda t, r: _train(r, "data.note=2020-01-01"), "data.note", None),
    "YAML alias bomb": (lambda t, r: _bomb(t), "c.yaml", None),
    "YAML recursive alias": (lambda t, r: ["train", _yaml(t, "data: &d {kind: synthetic_cxr, me: *d}\n")],
                             "c.yaml", None),
    "YAML file of 2 MB": (lambda t, r: ["train", _yaml(t, "data: {kind: synthetic_cxr}\n" + "#" * 2_000_000)],
                          "c.yaml", None),
    "--resume --overwrite": (lambda t, r: _train(r, options=("--resume", "--overwrite")), "--resume", None),
    "--out is a file": (lambda t, r: _train(_file(t)), "file", None),
    "--out below a file": (lambda t, r: _train(_file(t) / "run"), "file", None),
    "--out read-only": (_readonly, "ro", None),
    "--out: permission denied": (lambda t, r: _train(t / "new"), "Permission denied", _denied),
    "run folder locked by another run": (_locked, "another", None),
    "disk full at the first checkpoint": (lambda t, r: _train(r), "No space left", _disk_full),
    "--resume: weights do not match": (_resume_mismatch, "head.weight", None),
    "--resume: training state corrupt": (
        lambda t, r: _then(_write(r / "checkpoints/last/training_state.json", "{}"), _train(r, options=("--resume",))),
        "training_state", None),
    "--init-from: checkpoint.json not JSON": (
        lambda t, r: _then(_write(r / "checkpoints/best/checkpoint.json", "{"),
                           _train(t / "new", options=("--init-from", str(r)))), "checkpoint.json", None),
    "--init-from: shares no tensor": (
        lambda t, r: _then(_rename_tensors(r), _train(t / "new", options=("--init-from", str(r)))), "no tensor", None),
    "eval: checkpoint.json not JSON": (
        lambda t, r: _then(_write(r / "checkpoints/best/checkpoint.json", "["), ["eval", str(r), "synthetic_cxr"]),
        "checkpoint.json", None),
    "eval: checkpoint.json without task": (
        lambda t, r: _edit_meta(r, lambda m: m.pop("task")) or ["eval", str(r), "synthetic_cxr"], "task", None),
    "eval: checkpoint.json asks for 10^12 pixels": (
        lambda t, r: _edit_meta(r, lambda m: m["task"].update(input_shape=[1, 10**6, 10**6]))
        or ["eval", str(r), "synthetic_cxr"], "input_shape", None),
    "eval: checkpoint.json asks for depth 10^9": (
        lambda t, r: _edit_meta(r, lambda m: m["config"]["model"]["kwargs"].update(depth=10**9))
        or ["eval", str(r), "synthetic_cxr"], "depth", None),
    "eval: num_outputs a string": (
        lambda t, r: _edit_meta(r, lambda m: m["task"].update(num_outputs="1"))
        or ["eval", str(r), "synthetic_cxr"], "num_outputs", None),
    "eval: weights do not match": (lambda t, r: _edit_weights(r) or ["eval", str(r), "synthetic_cxr", *TINY],
                                   "head.weight", None),
    "eval --batch-size 0": (lambda t, r: ["eval", str(r), "synthetic_cxr", *TINY, "--batch-size", "0"],
                            "--batch-size", None),
    "eval --out is a file": (lambda t, r: ["eval", str(r), "synthetic_cxr", *TINY, "--out", str(_file(t))],
                             "file", None),
    "predict a named pipe": (_fifo, "pipe.png", None),
    "predict: weights do not match": (lambda t, r: _edit_weights(r) or ["predict", str(r), str(r / "roc_test.png"),
                                                                      "--out", str(t / "p.csv")], "head.weight", None),
    "predict --out is a folder": (lambda t, r: ["predict", str(r), str(r / "roc_test.png"), "--out", str(t)],
                                  "scratch", None),
    "predict --batch-size 0": (lambda t, r: ["predict", str(r), str(r / "roc_test.png"), "--out",
                                             str(t / "p.csv"), "--batch-size", "0"], "--batch-size", None),
    "bench scaling --mechanisms nope": (lambda t, r: ["bench", "scaling", "--mechanisms", "nope", "--model",
                                                      "vit2d_tiny", "--out", str(t)], "nope", None),
    "bench pam --sizes 0": (lambda t, r: ["bench", "pam", "--sizes", "0", "--out", str(t)], "--sizes", None),
    "bench binary --sizes 0": (lambda t, r: ["bench", "binary", "--sizes", "0", "--out", str(t)], "--sizes", None),
}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("finished") / "run"
    assert main(_train(run, options=())) == 0
    return run


def _snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()
            and p.name != ".lock"}


def run_case(case: str, tmp: Path, finished: Path, monkeypatch) -> tuple[int | str, dict[str, bytes]]:
    """Run one case on a copy of ``finished`` in ``tmp``; -> (exit status, or 'traceback: <type>' when an
    exception escaped; the run folder's files as the case found them, after its preparation)."""
    make_argv, _, patch = CASES[case]
    run = tmp / "run"
    shutil.copytree(finished, run)
    scratch = tmp / "scratch"
    scratch.mkdir()
    argv = make_argv(scratch, run)
    found = _snapshot(run)
    if patch is not None:
        patch(monkeypatch)
    try:
        status: int | str = main(argv)
    except SystemExit as exit_:  # argparse's usage errors
        status = exit_.code
    except Exception as error:  # noqa: BLE001 (recorded as the outcome)
        status = f"traceback: {type(error).__name__}"
        traceback.print_exc()
    finally:
        while HELD:
            HELD.pop().close()
    return status, found


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_and_loses_nothing(case, tmp_path, finished_run, monkeypatch, capfd):
    if case == "--out read-only" and os.geteuid() == 0:
        pytest.skip("root writes into read-only folders (the case below patches mkdir to fail instead)")
    status, found = run_case(case, tmp_path, finished_run, monkeypatch)
    err = capfd.readouterr().err.strip().splitlines()
    assert status == 2, (status, err[-3:])
    assert len(err) == 1 and err[0].startswith("medattn: error: ") and "Traceback" not in err[0], err[-5:]
    assert CASES[case][1] in err[0]
    assert _snapshot(tmp_path / "run") == found, "the run in the folder lost or changed files"


def _png_with_a_broken_data_stream(path) -> None:
    """A PNG whose chunks and CRCs are valid (the header check passes) but whose image data do not inflate."""
    import struct
    import zlib

    Image.fromarray(np.full((16, 16), 90, np.uint8)).save(path)
    data = bytearray(path.read_bytes())
    start = data.index(b"IDAT") + 4
    length = struct.unpack(">I", data[start - 8:start - 4])[0]
    data[start:start + length] = bytes((b ^ 0x5A) for b in data[start:start + length])
    data[start + length:start + length + 4] = struct.pack(">I", zlib.crc32(data[start - 4:start + length]))
    path.write_bytes(bytes(data))


def test_a_test_image_broken_past_its_header_is_found_before_training(tmp_path, capsys):
    """Every file of every split is decoded before the first epoch: the broken test image is named at once, nothing
    is trained, and an overwritten run is untouched."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(12):
        Image.fromarray(rng.integers(0, 255, (16, 16), dtype=np.uint8)).save(tmp_path / f"{i}.png")
        rows.append(f"{i}.png,{i % 2},{['train', 'val', 'test'][i % 3]}\n")
    (tmp_path / "t.csv").write_text("path,label,split\n" + "".join(rows))
    (tmp_path / "c.yaml").write_text(
        f"data: {{kind: image_table, csv: {tmp_path / 't.csv'}, label_columns: [label], split_column: split, "
        "image_size: 16, in_chans: 1}\nmodel: {name: vit2d_tiny, kwargs: {img_size: 16}}\n")
    config = [str(tmp_path / "c.yaml"), "train.epochs=1", "eval.bootstrap=0"]
    assert main(["train", *config, "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    before = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    _png_with_a_broken_data_stream(tmp_path / "2.png")  # a test image
    capsys.readouterr()
    for extra in ([], ["--overwrite"]):
        out = tmp_path / ("run" if extra else "fresh")
        assert main(["train", *config, "--out", str(out), "--no-progress", *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert "2.png" in err and "\n" not in err and "epoch" not in err
    assert {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()} == before
    assert not (tmp_path / "fresh" / "checkpoints").exists()
