"""Every command of ``cli.COMMANDS`` and every bench of ``cli.BENCHES``, run twice into one folder that also holds a
user's file (issue 39: one output policy, docs/guarantees.md).

For each command that writes a folder (:data:`CASES`, generated against the registries: a command missing here
fails :func:`test_every_command_and_bench_has_a_case`): the first call succeeds; the second, without
``--overwrite``, is refused in one line with every earlier output whole (``refuse``), or skips what is done
(``resume``: wsi tile/extract, cv, compare) or replaces only what an earlier call wrote (``manifest``: demo); with
``--overwrite`` it succeeds. The user's file is never changed. Tiny data, one epoch; commands that cannot run in
seconds are in :data:`ELSEWHERE` with the test that covers them, and those that write nothing in
:data:`NO_FOLDER`. Every call is also heard by an audit hook (:func:`audited`, ``tests/write_audit.py``, issue 50):
each write comes through the output module and lands in the output folder, whatever its form in the code.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import write_audit
from medattn.cli import BENCHES, COMMANDS, main

TINY = ["model.name=vit2d_tiny", "data.image_size=32", "data.num_samples=[16,8,8]", "train.epochs=1",
        "eval.bootstrap=0", "eval.heatmaps=0"]
SLIDE_OPTIONS = ["--patch-um", "64", "--patch-px", "32", "--thumbnail-px", "256", "--no-progress"]
USER_FILE = "notes.txt"
FINISHED = (".h5", ".tif", ".safetensors")


@dataclass(frozen=True)
class Case:
    argv: object  # (inputs: dict, out: Path) -> argv
    contract: str  # "refuse", "resume" or "manifest": what a second call without --overwrite does
    overwrite: bool = True  # the command has --overwrite
    folder: object = None  # (out) -> the folder holding the user's file (default: out)


CASES = {
    "train": Case(lambda i, out: ["train", "synthetic_cxr", *TINY, "--out", str(out), "--no-progress"], "refuse"),
    "cv": Case(lambda i, out: ["cv", "synthetic_cxr", *TINY, "--folds", "2", "--out", str(out), "--no-progress"],
               "resume", overwrite=False),
    "compare": Case(lambda i, out: ["compare", "synthetic_cxr", *TINY, "--attention", "softmax", "--seeds", "0",
                                    "--out", str(out), "--no-progress"], "resume", overwrite=False),
    "eval": Case(lambda i, out: ["eval", str(i["run"]), "synthetic_cxr", *TINY, "--out", str(out), "--no-progress"],
                 "refuse"),
    "predict": Case(lambda i, out: ["predict", str(i["run"]), str(i["image"]), "--out", str(out / "p.csv")],
                    "refuse"),
    "explain": Case(lambda i, out: ["explain", str(i["run"]), str(i["image"]), "--out", str(out)], "refuse"),
    "export": Case(lambda i, out: ["export", str(i["run"]), "--format", "onnx", "--out", str(out / "model.onnx")],
                   "refuse"),
    "wsi synthetic": Case(lambda i, out: ["wsi", "synthetic", str(out), "--count", "2"], "refuse"),
    "wsi tile": Case(lambda i, out: ["wsi", "tile", str(i["slides"]), "--out", str(out), "--mpp", "1",
                                     *SLIDE_OPTIONS], "resume"),
    "wsi extract": Case(lambda i, out: ["wsi", "extract", str(i["slides"]), "--out", str(out), "--mpp", "1",
                                        *SLIDE_OPTIONS], "resume"),
    "realistic": Case(lambda i, out: ["realistic", "--out", str(out), "--tasks", "ihc_bags", "--cases", "4", "2",
                                      "2"], "refuse", overwrite=False),
    "demo": Case(lambda i, out: ["demo", "--quick", "--jobs", "1", "--no-progress", "--tasks", "synthetic_wsi",
                                 "--out", str(out)], "manifest", overwrite=False),
    "bench attention": Case(lambda i, out: ["bench", "attention", "--mechanisms", "sima", "--seq-lens", "16",
                                            "--heads", "2", "--head-dim", "8", "--dim", "16", "--repeats", "1",
                                            "--no-isolate", "--out", str(out)], "refuse"),
    "bench scaling": Case(lambda i, out: ["bench", "scaling", "--model", "vit2d_tiny", "--resolutions", "32",
                                          "--mechanisms", "seqnorm", "--repeats", "1", "--warmup", "0",
                                          "--no-isolate", "--out", str(out)], "refuse"),
    "bench binary": Case(lambda i, out: ["bench", "binary", "--sizes", "64", "--dims", "8", "--repeats", "1",
                                         "--skip", "bf16", "memory", "attention", "layer", "--threads", "1",
                                         "--out", str(out)], "refuse"),
    # --brute-max below --sizes: the lattice's two rows alone (each row is a fresh process; test_bench runs brute)
    "bench pam": Case(lambda i, out: ["bench", "pam", "--sizes", "100", "--brute-max", "99", "--repeats", "1",
                                      "--out", str(out)], "refuse"),
    "bench extract": Case(lambda i, out: ["bench", "extract", "--encoders", "resnet50", "--precisions", "fp32",
                                          "--rounds", "1", "--batch-size", "1", "--threads", "1", "--out", str(out)],
                          "refuse"),
    "bench diffusion": Case(lambda i, out: ["bench", "diffusion", "--mechanisms", "softmax", "--grids", "2x2x2",
                                            "--dim", "16", "--depth", "1", "--heads", "2", "--repeats", "1",
                                            "--threads", "1", "--in-process", "--out", str(out)], "refuse"),
}
#: Commands that write a folder but cannot run in seconds here: the test that runs them twice into one folder.
ELSEWHERE = {
    "inpaint": "needs a trained VQ-AE and transformer (minutes): refusal, --overwrite and distinct stems in "
               "tests/diffusion/test_diffusion_cli.py and tests/core/test_outputs.py",
    "pretrain": "a run folder of train.rundir (the same transaction as train, tested here): refusal, --resume and "
                "--overwrite in tests/pretrain/test_pretrain.py",
}
#: Commands that write no file.
NO_FOLDER = {"models": "prints the presets", "plan": "prints the plan a config gets"}


def test_every_command_and_bench_has_a_case():
    wsi = {"wsi tile", "wsi extract", "wsi synthetic"}
    covered = {name.split()[0] for name in CASES if not name.startswith("bench ")} | set(ELSEWHERE) | set(NO_FOLDER)
    assert covered == set(COMMANDS)
    assert wsi <= set(CASES)
    assert {name.split()[1] for name in CASES if name.startswith("bench ")} == set(BENCHES)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """A tiny trained run, an image it reads and a folder of two synthetic slides."""
    from PIL import Image

    root = tmp_path_factory.mktemp("inputs")
    assert main(["train", "synthetic_cxr", *TINY, "--out", str(root / "run"), "--no-progress"]) == 0
    image = root / "g00.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 36), dtype=np.uint8)).save(image)
    assert main(["wsi", "synthetic", str(root / "slides"), "--count", "2"]) == 0
    return {"run": root / "run", "image": image, "slides": root / "slides"}


@pytest.fixture
def quick(monkeypatch):
    """What makes the slow parts quick: fixed machine rates for the benches, a fake training for demo."""
    from test_outputs import _fake_demo

    from medattn.bench import attention, roofline, scaling

    rates = roofline.MachineRates({"fp32": 100.0, "bf16": 400.0}, 10.0)
    for module in (attention, scaling):
        monkeypatch.setattr(module, "measure_rates", lambda device="cpu": rates)
    _fake_demo(monkeypatch)


@pytest.fixture(autouse=True)
def audited(monkeypatch, tmp_path):
    """Every ``main`` call of a test here is heard by the audit recorder (tests/write_audit.py): each file it writes
    comes through the output module (or a temporary path it handed out) and lands in ``tmp_path/out``."""
    from medattn import cli

    def recorded_main(argv):
        with write_audit.recording() as events:
            code = cli.main(argv)
        found = write_audit.problems(events, tmp_path / "out")
        assert not found, f"{' '.join(argv)}:\n" + "\n".join(found)
        return code

    monkeypatch.setattr(sys.modules[__name__], "main", recorded_main)


def test_the_recorder_hears_a_planted_write(tmp_path, monkeypatch):
    """A write with plain ``open(.., "w")`` from inside a command, and one through the output module to another
    folder: both reported, whatever their form."""
    from medattn import cli, config, outputs

    listed = config.packaged_configs

    def planted():
        with open(tmp_path / "out" / "planted.txt", "w") as handle:  # inside the folder, but not by the policy
            handle.write("x")
        outputs.OutputFolder(tmp_path).save_text("elsewhere.txt", "x")  # by the policy, outside the folder
        return listed()

    (tmp_path / "out").mkdir()
    monkeypatch.setattr(config, "packaged_configs", planted)
    with write_audit.recording() as events:
        assert cli.main(["models", "--configs"]) == 0  # the module's main is the audited one
    found = write_audit.problems(events, tmp_path / "out")
    assert [f for f in found if "planted.txt" in f] == [
        f"open {tmp_path / 'out' / 'planted.txt'} from commands/models.py: no allowed writer "
        f"({', '.join(sorted(write_audit.WRITERS))}) on the stack"], found
    elsewhere = [f for f in found if "planted.txt" not in f]
    assert elsewhere and all("elsewhere.txt" in f and "outside the output folder" in f for f in elsewhere), found


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (but the lock of a run folder) and its digest."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".lock"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_twice_into_one_folder_keeps_the_users_file(name, inputs, quick, tmp_path, capsys):
    case = CASES[name]
    if name == "realistic":
        pytest.importorskip("nilearn")
        pytest.importorskip("skimage")
    out = tmp_path / "out"
    home = case.folder(out) if case.folder else out
    home.mkdir(parents=True)
    user = home / USER_FILE
    user.write_text("the user's notes")
    argv = case.argv(inputs, out)

    assert main(argv) == 0, capsys.readouterr().err
    first = _snapshot(out)
    assert len(first) > 1, "the command wrote nothing"
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err.strip()
    if case.contract == "refuse":
        assert code == 2 and err.startswith("medattn: error: ") and "\n" not in err, err
        assert "exist" in err or "already holds" in err or "not empty" in err, err
        assert _snapshot(out) == first, "a refused call changed an earlier output"
    else:
        assert code == 0, err
        if case.contract == "resume":
            done = {k: v for k, v in first.items() if k.endswith(FINISHED)}  # slides' features, runs' weights
            assert {k: v for k, v in _snapshot(out).items() if k in done} == done, "a finished entry was redone"
    assert user.read_text() == "the user's notes"
    if case.overwrite:
        assert main([*argv, "--overwrite"]) == 0, capsys.readouterr().err
        assert user.read_text() == "the user's notes"
        assert set(first) <= set(_snapshot(out)), "--overwrite lost an output"
