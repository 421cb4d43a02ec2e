"""The output policy (medattn.outputs): never over an input, never over what the command did not write,
never outside its folder, distinct names for inputs of one name, atomic writes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from engine_data import rows, save_checkpoint
from medattn.cli import main
from medattn.data.base import TaskInfo
from medattn.errors import UserError
from medattn.outputs import OutputFolder


def test_inputs_are_never_written_over_and_existing_files_only_with_overwrite(tmp_path):
    image = tmp_path / "g00.png"
    image.write_bytes(b"the user's image")
    (tmp_path / "old.csv").write_text("the user's table")
    out = OutputFolder(tmp_path, [image], overwrite=True)
    with pytest.raises(UserError, match="is an input of this command"):
        out.path("g00.png")
    assert OutputFolder(tmp_path, [image], overwrite=True).path("old.csv") == tmp_path / "old.csv"
    with pytest.raises(UserError, match="exists and this command did not write it"):
        OutputFolder(tmp_path, [image]).path("old.csv")
    with pytest.raises(UserError, match="is one of the inputs"):
        OutputFolder(tmp_path, [tmp_path])
    for bad in ("", "..", "a/b", "/etc/passwd"):
        with pytest.raises(UserError, match="cannot be an output file name"):
            OutputFolder(tmp_path / "out").path(bad)
    assert image.read_bytes() == b"the user's image"


def test_inputs_of_one_name_get_distinct_stems_and_writes_are_atomic(tmp_path):
    out = OutputFolder(tmp_path / "out")
    assert [out.stem_for(p) for p in ("a/x.png", "b/x.png", "c/x.nii.gz", "y.h5")] == ["x", "x_2", "x_3", "y"]
    with out.write("x.csv") as tmp:
        tmp.write_text("first")
    with out.write("x.csv") as tmp:  # what this call wrote it may replace
        tmp.write_text("second")
    with pytest.raises(RuntimeError), out.write("x.csv") as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert (tmp_path / "out/x.csv").read_text() == "second"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["x.csv"]


def _images(folder, names):
    paths = []
    for i, name in enumerate(names):
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (32, 32), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def test_explain_into_the_image_folder_keeps_the_image_and_same_named_inputs_get_two_maps(tmp_path, capsys):
    torch.manual_seed(0)
    ck = save_checkpoint(tmp_path / "ck", "synthetic_cxr", ["model.name=vit2d_tiny"],
                         TaskInfo("binary", "image2d", 1, (1, 32, 32), ["cardiomegaly"], synthetic=True),
                         mean=[0.5], std=[0.5])
    (image,) = _images(tmp_path / "images", ["g00.png"])
    before = image.read_bytes()
    assert main(["explain", str(ck), str(image), "--out", str(tmp_path / "images")]) == 2
    assert "is an input of this command" in capsys.readouterr().err
    assert image.read_bytes() == before and sorted(p.name for p in image.parent.iterdir()) == ["g00.png"]
    a, b = _images(tmp_path, ["a/x.png", "b/x.png"])
    assert main(["explain", str(ck), str(a), str(b), "--out", str(tmp_path / "maps")]) == 0
    summary = rows(tmp_path / "maps/summary.csv")
    assert [(r["file"], r["outputs"]) for r in summary] == [(str(a), "x.png"), (str(b), "x_2.png")]
    assert main(["explain", str(ck), str(a), "--out", str(tmp_path / "maps")]) == 2  # its own earlier output
    assert "--overwrite" in capsys.readouterr().err
    assert main(["explain", str(ck), str(a), "--out", str(tmp_path / "maps"), "--overwrite"]) == 0


def test_export_replaces_an_existing_file_only_with_overwrite_and_never_the_checkpoint(tmp_path, capsys):
    ck = save_checkpoint(tmp_path / "ck", "synthetic_cxr", ["model.name=vit2d_tiny"],
                         TaskInfo("binary", "image2d", 1, (1, 32, 32), ["cardiomegaly"], synthetic=True),
                         mean=[0.5], std=[0.5])
    (tmp_path / "m.pt2").write_text("the user's file")
    assert main(["export", str(ck), "--format", "pt2", "--out", str(tmp_path / "m.pt2")]) == 2
    assert "--overwrite" in capsys.readouterr().err and (tmp_path / "m.pt2").read_text() == "the user's file"
    weights = (ck / "model.safetensors").read_bytes()
    assert main(["export", str(ck), "--format", "pt2", "--out", str(ck / "model.safetensors"), "--overwrite"]) == 2
    assert "is an input" in capsys.readouterr().err and (ck / "model.safetensors").read_bytes() == weights
    assert main(["export", str(ck), "--format", "pt2", "--out", str(tmp_path / "m.pt2"), "--overwrite"]) == 0


def test_eval_keeps_an_earlier_evaluation_unless_overwrite(tmp_path, capsys):
    from engine_data import TINY

    run = tmp_path / "run"
    assert main(["train", "synthetic_cxr", *TINY, "--out", str(run), "--no-progress"]) == 0
    out = tmp_path / "eval"
    assert main(["eval", str(run), "synthetic_cxr", *TINY, "--out", str(out), "--no-progress"]) == 0
    first = (out / "eval.json").read_bytes()
    assert main(["eval", str(run), "synthetic_cxr", *TINY, "--out", str(out), "--no-progress"]) == 2
    assert "--overwrite" in capsys.readouterr().err and (out / "eval.json").read_bytes() == first
    assert main(["eval", str(run), "synthetic_cxr", *TINY, "--out", str(out), "--no-progress", "--overwrite"]) == 0


def _fake_demo(monkeypatch) -> list[str]:
    """``medattn demo`` without training: each run folder gets a results file and a ROC figure, the scaling section
    nothing. Returns the run folders trained, in order."""
    from medattn.bench import demo_scaling
    from medattn.experiments import demo

    trained = []

    def train_job(job, run_dir, progress):
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "results.json").write_text("{}")
        Image.new("L", (8, 8)).save(run_dir / "roc_test.png")
        trained.append(run_dir.name)
        return {"task": job["task"], "task_label": job["label"], "mechanism": job["mechanism"], "auroc": 0.5,
                "ci_low": None, "ci_high": None, "train_seconds": 0.0, "did_not_learn": ""}

    def scaling_section(out, quick, threads):
        return ""

    monkeypatch.setattr(demo, "train_job", train_job)
    monkeypatch.setattr(demo_scaling, "scaling_section", scaling_section)
    return trained


def test_demo_replaces_only_what_an_earlier_demo_wrote(tmp_path, monkeypatch, capsys):
    """`medattn demo --out DIR` deleted DIR/runs, a user's `medattn train` runs included."""
    trained = _fake_demo(monkeypatch)
    out = tmp_path / "report"
    notes = out / "runs/my_study/notes.txt"
    notes.parent.mkdir(parents=True)
    notes.write_text("the user's study")
    (out / "notes.txt").write_text("the user's notes")
    demo = ["demo", "--quick", "--jobs", "1", "--no-progress", "--out", str(out)]
    assert main([*demo, "--tasks", "synthetic_wsi", "synthetic_cxr"]) == 0
    assert len(trained) == 8 and (out / "runs/synthetic_cxr_sima/results.json").is_file()
    assert (out / "table.csv").is_file() and (out / "roc_synthetic_cxr_sima.png").is_file()
    assert main([*demo, "--tasks", "synthetic_wsi"]) == 0  # replaces its own runs; the cxr ones go
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["my_study", *sorted(
        f"synthetic_wsi_{m}" for m in ("baseline", "softmax", "sima", "seqnorm"))]
    assert not list(out.glob("roc_synthetic_cxr_*.png")) and (out / "roc_synthetic_wsi_sima.png").is_file()
    assert notes.read_text() == "the user's study" and (out / "notes.txt").read_text() == "the user's notes"
    # a user's run where a demo run goes: refused, named, before any training
    (out / "runs/synthetic_cxr_sima").mkdir()
    (out / "runs/synthetic_cxr_sima/config.yaml").write_text("the user's run")
    trained.clear()
    capsys.readouterr()
    assert main([*demo, "--tasks", "synthetic_cxr"]) == 2
    err = capsys.readouterr().err
    assert "synthetic_cxr_sima exists and an earlier call of this command did not write it" in err
    assert trained == [] and (out / "runs/synthetic_cxr_sima/config.yaml").read_text() == "the user's run"
    assert notes.read_text() == "the user's study" and (out / "runs/synthetic_wsi_sima/results.json").is_file()


def test_demo_recognises_a_report_folder_written_before_the_manifest(tmp_path, monkeypatch):
    import json

    from medattn.experiments.demo import DATA_NOTE, MANIFEST

    _fake_demo(monkeypatch)
    out = tmp_path / "report"
    assert main(["demo", "--quick", "--jobs", "1", "--no-progress", "--tasks", "synthetic_wsi", "--out", str(out)]) == 0
    (out / MANIFEST).unlink()  # as an earlier version left it: its table.json names its runs
    assert json.loads((out / "table.json").read_text())["data"] == DATA_NOTE
    assert main(["demo", "--quick", "--jobs", "1", "--no-progress", "--tasks", "synthetic_wsi", "--out", str(out)]) == 0
    (out / MANIFEST).unlink()
    (out / "table.json").write_text('{"data": "the user\'s own table"}')
    assert main(["demo", "--quick", "--jobs", "1", "--no-progress", "--tasks", "synthetic_wsi", "--out", str(out)]) == 2


def test_a_folder_within_a_policy_appends_replaces_and_removes(tmp_path):
    """``OutputFolder.within``: a folder whose policy the caller applied (a run folder): every name may be replaced;
    ``append_csv`` adds rows (the header once), ``remove`` confines its name to the folder."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("old")
    folder = OutputFolder.within(tmp_path / "run")
    folder.save_text("config.yaml", "new")
    assert (tmp_path / "run" / "config.yaml").read_text() == "new"
    for epoch in (1, 2):
        folder.append_csv("metrics.csv", [{"epoch": epoch}], ["epoch"])
    assert (tmp_path / "run" / "metrics.csv").read_text() == "epoch\n1\n2\n"
    strict = OutputFolder(tmp_path / "other")
    strict.append_csv("m.csv", [{"a": 1}], ["a"])
    strict.append_csv("m.csv", [{"a": 2}], ["a"])  # its own file: appended again
    assert (tmp_path / "other" / "m.csv").read_text() == "a\n1\n2\n"
    with pytest.raises(UserError, match="did not write it"):
        OutputFolder(tmp_path / "other").append_csv("m.csv", [{"a": 3}], ["a"])
    folder.remove("metrics.csv")
    assert not (tmp_path / "run" / "metrics.csv").exists()
    with pytest.raises(UserError, match="output file name"):
        folder.remove("../other")
