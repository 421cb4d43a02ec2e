"""A generated fault corpus: every command that reads a user's files, every input kind, every fault.

For each input kind (image, volume, bag: the kinds of ``medattn.data.base.INPUT_KINDS``) a small model is trained
and each command that reads files of that kind (:data:`COMMANDS`) meets each fault of :data:`FAULTS` (missing,
empty, truncated, wrong content, a folder in a file's place, two inputs of one name, the input folder as output
folder, an existing output, a ``--device`` this machine lacks). The property checked every time: the command exits 0
with one result per input, or prints exactly one ``medattn: error:`` line (status 2, no traceback); and no file that
existed before the command is changed or lost. The outcome counts are printed (``-s``) for the closing note's table.
"""

from __future__ import annotations

import hashlib
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from medattn.cli import COMMANDS, main
from medattn.data.base import INPUT_KINDS

#: What trains a model of each input kind (config and overrides), and how a good input file is written.
RUNS = {
    "image2d": ("synthetic_cxr", ["model.name=vit2d_tiny", "data.image_size=32", "data.num_samples=[16,8,8]"]),
    "volume3d": ("synthetic_breast_mri", ["model.name=vit3d_tiny", "data.volume_size=[16,16,8]",
                                          "data.num_samples=[16,8,8]"]),
    "bag": ("synthetic_wsi", ["model.name=vitwsi_tiny", "data.feature_dim=16", "data.num_instances=[5,9]",
                              "data.num_samples=[16,8,8]"]),
}
SUFFIX = {"image2d": ".png", "volume3d": ".nii.gz", "bag": ".h5"}
#: Commands that read a user's input files, with their argument lists (run folder, inputs, output folder).
COMMANDS_WITH_FILES = {
    "predict": lambda run, files, out: ["predict", str(run), *map(str, files), "--out", str(out / "p.csv")],
    "explain": lambda run, files, out: ["explain", str(run), *map(str, files), "--out", str(out)],
}
#: Commands that read no user file per input (configs, checkpoints, slides and volumes are covered elsewhere:
#: tests/*/test_bad_input_*.py, tests/slides/, tests/diffusion/test_diffusion_cli.py, tests/core/test_extras.py; the
#: unlabelled pool of pretrain and the data plan reads: tests/pretrain/test_pretrain.py, tests/plan/test_plan.py).
COVERED_ELSEWHERE = {"demo", "train", "cv", "compare", "eval", "export", "inpaint", "models", "wsi", "realistic",
                     "pretrain", "plan"}


def _good(path: Path, kind: str, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    if kind == "image2d":
        from PIL import Image

        Image.fromarray(rng.integers(0, 255, (40, 36), dtype=np.uint8)).save(path)
    elif kind == "volume3d":
        import nibabel as nib

        nib.save(nib.Nifti1Image(rng.normal(size=(18, 16, 9)).astype(np.float32), np.eye(4)), path)
    else:
        import h5py

        with h5py.File(path, "w") as f:
            f["features"] = rng.normal(size=(7, 16)).astype(np.float32)
            f["coords"] = rng.integers(0, 4000, (7, 2)).astype(np.float32)
    return path


def _text(path: Path) -> Path:
    path.write_text("not medical data")
    return path


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _folder_with_outputs(folder: Path) -> Path:
    """A folder holding files named as a command's outputs, written by the user."""
    folder.mkdir()
    for name in ("p.csv", "summary.csv", "q.png", "q.nii.gz", "q_tiles.csv"):
        (folder / name).write_text("the user's")
    return folder


#: fault -> make(folder, kind) -> (input files, output folder). ``good`` is the control.
FAULTS = {
    "good": lambda d, k: ([_good(d / f"a{SUFFIX[k]}", k, 0), _good(d / f"b{SUFFIX[k]}", k, 1)], d / "out"),
    "missing": lambda d, k: ([_good(d / f"a{SUFFIX[k]}", k, 0), d / f"gone{SUFFIX[k]}"], d / "out"),
    "empty": lambda d, k: ([(d / f"e{SUFFIX[k]}").open("w").close() or d / f"e{SUFFIX[k]}"], d / "out"),
    "truncated": lambda d, k: ([_good(d / f"t{SUFFIX[k]}", k, 2)], d / "out"),
    "wrong content": lambda d, k: ([_text(d / f"w{SUFFIX[k]}")], d / "out"),
    "folder as file": lambda d, k: ([(d / f"f{SUFFIX[k]}").mkdir() or d / f"f{SUFFIX[k]}"], d / "out"),
    "same name": lambda d, k: ([_good((d / "x").mkdir() or d / "x" / f"s{SUFFIX[k]}", k, 3),
                                _good((d / "y").mkdir() or d / "y" / f"s{SUFFIX[k]}", k, 4)], d / "out"),
    "out is input folder": lambda d, k: ([_good(d / f"p{SUFFIX[k]}", k, 5)], d),
    "existing output": lambda d, k: ([_good(d / f"q{SUFFIX[k]}", k, 6)], _folder_with_outputs(d / "out")),
    "device not here": lambda d, k: ([_good(d / f"a{SUFFIX[k]}", k, 0)], d / "out"),
}
#: fault -> the options the command is given with it (good inputs, a device no machine here has).
OPTIONS = {"device not here": ["--device", "cuda:99"]}
OUTCOMES: Counter = Counter()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    for kind, (config, overrides) in RUNS.items():
        assert main(["train", config, *overrides, "train.epochs=1", "eval.bootstrap=0", "eval.heatmaps=0", "--out",
                     str(root / kind), "--no-progress"]) == 0
    return {kind: root / kind for kind in RUNS}


def test_every_input_kind_and_command_is_in_the_corpus():
    assert set(RUNS) == set(INPUT_KINDS)
    assert set(COMMANDS) == set(COMMANDS_WITH_FILES) | COVERED_ELSEWHERE


def _snapshot(folder: Path) -> dict[Path, str]:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("kind", sorted(RUNS))
@pytest.mark.parametrize("command", sorted(COMMANDS_WITH_FILES))
def test_one_result_per_input_or_one_error_line_and_nothing_owned_is_lost(command, kind, fault, runs, tmp_path,
                                                                            capsys):
    files, out = FAULTS[fault](tmp_path, kind)
    if fault == "truncated":
        _truncate(files[0])
    before = _snapshot(tmp_path)
    capsys.readouterr()
    code = main([*COMMANDS_WITH_FILES[command](runs[kind], files, out), *OPTIONS.get(fault, [])])
    captured = capsys.readouterr()
    after = _snapshot(tmp_path)
    assert {p: h for p, h in after.items() if p in before} == before, "a file the user had was changed or lost"
    if code == 0:
        OUTCOMES[command, fault, "result"] += 1
        table = out / ("p.csv" if command == "predict" else "summary.csv")
        assert len(table.read_text().strip().splitlines()) == 1 + len(files)
    else:
        OUTCOMES[command, fault, "one error line"] += 1
        err = captured.err.strip()
        assert code == 2 and err.startswith("medattn: error: ") and "\n" not in err and "Traceback" not in err, err
    assert fault not in ("good", "same name") or code == 0, captured.err
    assert fault not in ("missing", "empty", "truncated", "wrong content", "folder as file", "existing output",
                         "device not here") or code == 2, f"{fault} was accepted"
    shutil.rmtree(tmp_path / "out", ignore_errors=True)


def test_print_the_corpus_outcomes():
    """The table of the closing note: command x fault -> outcome counts (run with -s to see it)."""
    for (command, fault, outcome), count in sorted(OUTCOMES.items()):
        print(f"{command:8s} {fault:20s} {outcome:15s} {count}")
