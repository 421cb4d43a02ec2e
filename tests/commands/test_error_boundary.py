"""One error line for every condition a user's input or machine can cause; a genuine bug keeps its traceback."""

from __future__ import annotations

import errno
import json
from types import SimpleNamespace

import numpy as np
import pytest

from medattn.cli import main
from medattn.data.cohort.splits import assign_splits
from medattn.errors import UserError


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("medattn: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(("error", "expected"), [
    (OSError(errno.ENOSPC, "No space left on device", "/runs/x/metrics.csv"), "No space left on device"),
    (OSError(errno.EROFS, "Read-only file system", "/runs/x"), "Read-only file system"),
    (MemoryError(), "out of memory"),
])
def test_the_machine_s_failures_are_one_line(error, expected, monkeypatch, capsys):
    from medattn.commands import models

    def run(args):
        raise error

    monkeypatch.setattr(models, "run", run)
    assert main(["models"]) == 2
    assert expected in _one_error_line(capsys)


def test_a_genuine_bug_keeps_its_traceback(monkeypatch):
    from medattn.commands import models

    def run(args):
        raise OSError(errno.EBADF, "Bad file descriptor")  # not something a user's machine or input causes

    monkeypatch.setattr(models, "run", run)
    with pytest.raises(OSError):
        main(["models"])


def test_folds_the_rarest_class_cannot_fill_are_refused():
    patients = [f"p{i}" for i in range(20)]
    keys = ["0"] * 17 + ["1"] * 3
    with pytest.raises(UserError, match="rarest class .* has 3 case.*at most 3 folds"):
        assign_splits(patients, keys, {"folds": 5, "fold": 0}, seed=0)
    assert len(assign_splits(patients, keys, {"folds": 3, "fold": 0}, seed=0)) == 20


def test_a_slide_declaring_more_than_memory_is_refused_before_reading():
    from medattn.slides.reader import memory_bytes, thumbnail

    side = int((memory_bytes() * 2) ** 0.5)  # one level, larger than the machine
    slide = SimpleNamespace(dimensions=(side, side), level_dimensions=[(side, side)],
                            get_best_level_for_downsample=lambda d: 0,
                            get_thumbnail=lambda size: pytest.fail("the level was read"))
    with pytest.raises(UserError, match="more than half this machine's memory"):
        thumbnail(slide, 1024)


def _tiles(folder, rows, kept):
    from medattn.slides.tiling import STATUSES

    geometry = {"level": 0, "read_size": 256, "size0": 256, "patch_px": 256}
    (folder / "s.json").write_text(json.dumps({"geometry": geometry, "counts": {**dict.fromkeys(STATUSES, 0),
                                                                                "kept": kept}}))
    (folder / "s.csv").write_text("x,y,tissue_fraction,white_fraction,sharpness,status\n" + "".join(rows))


def test_a_malformed_tiles_row_is_refused_not_dropped(tmp_path):
    from medattn.slides.tiling import read_tiles

    good = "0,0,1,0,9,kept\n256,0,1,0,9,kept\n"
    _tiles(tmp_path, [good], 2)
    coords, _ = read_tiles(tmp_path, tmp_path / "s.svs")
    assert np.array_equal(coords, [[0, 0], [256, 0]])
    for rows, kept, message in (([good, "512,0,1,0,9,kep\n"], 2, "row 4: status 'kep'"),
                                ([good, "512,0\n"], 2, "malformed tiles"),
                                ([good], 3, "2 kept tile.*counts 3")):
        _tiles(tmp_path, rows, kept)
        with pytest.raises(UserError, match=message):
            read_tiles(tmp_path, tmp_path / "s.svs")


def test_a_full_disk_during_training_is_one_line_and_the_previous_run_stays(tmp_path):
    """A full disk simulated by a file-size limit in a subprocess (CI has no root to fill a real one): the overwrite
    that cannot write its checkpoint ends in one error line, and the previous run is back byte for byte."""
    import os
    import subprocess
    import sys

    from engine_data import TINY

    run = tmp_path / "run"
    assert main(["train", "synthetic_cxr", *TINY, "--out", str(run), "--no-progress"]) == 0
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    script = ("import resource, signal, sys\n"
              "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))\n"
              "from medattn.cli import main\n"
              "sys.exit(main(sys.argv[1:]))\n")
    done = subprocess.run([sys.executable, "-c", script, "train", "synthetic_cxr", *TINY, "seed=3", "--out", str(run),
                           "--overwrite", "--no-progress"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "MEDATTN_MALLOC": "default"})
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and err and err[-1].startswith("medattn: error: "), done.stderr
    assert "Traceback" not in done.stderr and "File too large" in err[-1]
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == before
