import csv
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image

from engine_data import TINY
from medattn.cli import COMMANDS, main
from medattn.data import build_datasets
from medattn.errors import UserError


def _error(capsys, argv) -> str:
    """Run the CLI, expect exit status 2 and one error line without a traceback; return that line."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("medattn: error: ") and "Traceback" not in err[0]
    return err[0]


def test_train_eval_predict(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(["train", "synthetic_cxr", *TINY, "--out", str(run_dir), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "test AUROC" in out and "SYNTHETIC" in out
    results = json.loads((run_dir / "results.json").read_text())
    assert main(["eval", str(run_dir), "synthetic_cxr", *TINY, "--no-progress"]) == 0
    evaluated = json.loads((run_dir / "eval_synthetic_cxr_test/eval.json").read_text())
    assert evaluated["auroc"] == results["test"]["auroc"]
    bundle = build_datasets({"kind": "synthetic_cxr", "image_size": 32, "num_samples": [16, 8, 8]})
    files = []
    for i in range(3):
        image = (bundle.test[i]["input"][0] * 0.5 + 0.5).clamp(0, 1).numpy()
        files.append(tmp_path / f"x{i}.png")
        Image.fromarray(np.round(image * 255).astype(np.uint8)).save(files[-1])
    assert main(["predict", str(run_dir), *map(str, files), "--out", str(tmp_path / "p.csv")]) == 0
    rows = list(csv.DictReader(open(tmp_path / "p.csv")))
    assert [r["file"] for r in rows] == list(map(str, files))
    test_rows = list(csv.DictReader(open(run_dir / "predictions_test.csv")))
    for row, test_row in zip(rows, test_rows):  # 8-bit PNG round trip: close to the in-memory prediction
        assert abs(float(row["prob_cardiomegaly"]) - float(test_row["prob_cardiomegaly"])) < 0.02
    assert "missing.png: no such file" in _error(capsys, ["predict", str(run_dir), "missing.png", "--out", "x.csv"])


def test_user_errors_are_one_line(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(["train", "synthetic_cxr", *TINY, "--out", str(run_dir), "--no-progress"]) == 0
    capsys.readouterr()
    assert "already holds a run; use --resume" in _error(capsys, ["train", "synthetic_cxr", *TINY, "--out",
                                                                  str(run_dir)])
    assert "unknown config key 'train.lrr'" in _error(capsys, ["train", "synthetic_cxr", "train.lrr=1"])
    assert "config file not found: nope.yaml" in _error(capsys, ["train", "nope.yaml"])
    assert "unknown model 'vit9d'" in _error(capsys, ["train", "synthetic_cxr", *TINY, "model.name=vit9d",
                                                      "--out", str(tmp_path / "a")])
    assert "nope" in _error(capsys, ["train", "synthetic_cxr", *TINY, "model.attention=nope",
                                     "--out", str(tmp_path / "b")])
    assert "unknown data kind" in _error(capsys, ["train", "synthetic_cxr", "data.kind=nope",
                                                  "--out", str(tmp_path / "c")])
    assert "no checkpoint found" in _error(capsys, ["eval", str(tmp_path / "none"), "synthetic_cxr"])
    assert "does not fit the checkpoint's task" in _error(capsys, ["eval", str(run_dir), "synthetic_wsi"])


def test_skip_bad_reports_the_count(tmp_path, capsys):
    config = _image_table(tmp_path)
    with open(tmp_path / "labels.csv", "a") as f:
        f.write("gone.png,1,p99\n")
    assert "gone.png" in _error(capsys, ["train", config, "--out", str(tmp_path / "a")])
    assert main(["train", config, "--out", str(tmp_path / "b"), "--skip-bad", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "skipped 1 bad sample(s)" in out and "skipped 1)" in out


def test_demo_quick(tmp_path, capsys):
    """The demo's files; with --jobs 2 each run trains in a worker process of its own, to the numbers it gets
    when trained here (the SeqNorm run, trained in this process for the comparison)."""
    from medattn.experiments.demo import demo_jobs, train_job

    jobs = demo_jobs(["synthetic_wsi"], quick=True, seed=0, threads=1)
    serial = [train_job(job, tmp_path / "serial" / job["mechanism"], progress=False) for job in jobs
              if job["mechanism"] == "seqnorm"]
    assert len(serial) == 1
    assert main(["demo", "--quick", "--tasks", "synthetic_wsi", "--jobs", "2", "--out", str(tmp_path / "demo"),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "4 runs, 2 at a time" in out and json.loads((tmp_path / "demo/table.json").read_text())["jobs"] == 2
    parallel = {r["mechanism"]: r["auroc"] for r in csv.DictReader(open(tmp_path / "demo/table.csv"))}
    assert [parallel[row["mechanism"]] for row in serial] == [str(row["auroc"]) for row in serial]
    assert "SYNTHETIC DATA" in out and "SeqNorm (ours)" in out and "Baseline (CNN / MIL)" in out
    rows = list(csv.DictReader(open(tmp_path / "demo/table.csv")))
    assert [r["mechanism"] for r in rows] == ["baseline", "softmax", "sima", "seqnorm"]
    assert [r["model"] for r in rows] == ["abmil_tiny"] + ["vitwsi_tiny"] * 3
    assert json.loads((tmp_path / "demo/table.json").read_text())["data"].startswith("SYNTHETIC")
    with Image.open(tmp_path / "demo/roc_synthetic_wsi_seqnorm.png") as png:  # a real image, not just a file
        assert png.format == "PNG" and min(png.size) >= 200
        assert len(np.unique(np.asarray(png.convert("L")))) > 2  # axes and a curve, not a blank canvas
    scaling = list(csv.DictReader(open(tmp_path / "demo/scaling.csv")))  # why one would pick linear attention
    assert {(r["mechanism"], r["status"]) for r in scaling} == {("softmax", "ok"), ("seqnorm", "ok")}
    assert "why linear attention" in out and Image.open(tmp_path / "demo/scaling.png").size[0] >= 600


def _image_table(folder, n: int = 40) -> str:
    """PNG files (positives carry a bright square) with a labels CSV and a tiny config reading them."""
    rng = np.random.default_rng(0)
    with open(folder / "labels.csv", "w") as f:
        f.write("path,label,patient\n")
        for i in range(n):
            image = rng.integers(0, 120, (40, 36), dtype=np.uint8)
            image[5:15, 5:15] += 130 * (i % 2)
            Image.fromarray(image).save(folder / f"{i}.png")
            f.write(f"{i}.png,{i % 2},p{i}\n")
    (folder / "c.yaml").write_text(
        f"data: {{kind: image_table, csv: {folder / 'labels.csv'}, label_columns: [label], patient_column: patient,"
        " image_size: 32, in_chans: 1, val_fraction: 0.25, test_fraction: 0.25}\n"
        "model: {name: vit2d_tiny}\ntrain: {epochs: 1, batch_size: 8, threads: 1}\neval: {bootstrap: 20}\n")
    return str(folder / "c.yaml")


@pytest.mark.parametrize("precision, bf16_hardware", [("fp32", None), ("bf16", True), ("bf16", False)],
                         ids=["fp32", "bf16-cpu", "bf16-on-avx2-only-cpu"])
def test_predict_gives_the_probabilities_eval_gives_on_the_same_files(tmp_path, capsys, monkeypatch, precision,
                                                                      bf16_hardware):
    """One prediction path: predict on the test split's files equals eval's predictions_test.csv per file
    (predict ignored the run's bf16 autocast before, off by up to 1e-3). A bf16 run predicts in bf16 where the CPU
    has bf16 hardware and in fp32 where it does not: both branches run on every CPU (the capability simulated)."""
    if bf16_hardware is not None:
        from medattn.runtime import device

        monkeypatch.setattr(device, "bf16_in_hardware", lambda where: bf16_hardware)
    config = _image_table(tmp_path)
    run = tmp_path / "run"
    assert main(["train", config, f"train.precision={precision}", "--out", str(run), "--no-progress"]) == 0
    assert main(["eval", str(run), config, "--out", str(tmp_path / "eval"), "--no-progress", "--batch-size", "3"]) == 0
    evaluated = {r["id"]: float(r["prob_label"]) for r in csv.DictReader(open(tmp_path / "eval/predictions_test.csv"))}
    files = [str(tmp_path / name) for name in evaluated]
    assert main(["predict", str(run), *files, "--out", str(tmp_path / "p.csv"), "--batch-size", "4"]) == 0
    predicted = {r["file"]: float(r["prob_label"]) for r in csv.DictReader(open(tmp_path / "p.csv"))}
    assert len(predicted) == len(evaluated) == 10
    for name, probability in evaluated.items():
        assert abs(predicted[str(tmp_path / name)] - probability) <= 1e-6, name


def test_only_user_errors_are_one_line_and_debug_shows_their_traceback(monkeypatch, capsys):
    def bug(args):
        raise ValueError("an internal bug")

    monkeypatch.setattr("medattn.commands.models.run", bug)
    with pytest.raises(ValueError, match="an internal bug"):  # a real bug keeps its traceback
        main(["models"])
    assert "unknown config key" in _error(capsys, ["train", "synthetic_cxr", "train.lrr=1"])
    for argv in (["--debug", "train", "synthetic_cxr", "train.lrr=1"], ["train", "synthetic_cxr", "train.lrr=1",
                                                                        "--debug"]):
        with pytest.raises(UserError, match="unknown config key"):
            main(argv)


def test_usage_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "run", "synthetic_cxr", "--batch-size", "0"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["medattn: error: argument --batch-size: must be a positive integer, got '0' "
                   "(see medattn eval --help)"]


@pytest.mark.slow
def test_killed_process_resumes_to_the_same_metrics(tmp_path):
    """A real SIGKILL after the first epoch's checkpoint, then --resume, against an uninterrupted run."""
    args = ["synthetic_cxr", *TINY, "train.epochs=3", "--no-progress"]
    assert main(["train", *args, "--out", str(tmp_path / "full")]) == 0
    run_dir = tmp_path / "killed"
    process = subprocess.Popen([sys.executable, "-m", "medattn", "train", *args, "--out", str(run_dir)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    meta = run_dir / "checkpoints/last/checkpoint.json"
    deadline = time.time() + 120
    while not (meta.exists() and json.loads(meta.read_text())["epoch"] >= 1) and time.time() < deadline:
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert json.loads(meta.read_text())["epoch"] < 3, "the run finished before it could be killed"
    assert main(["train", *args, "--out", str(run_dir), "--resume"]) == 0
    full = json.loads((tmp_path / "full/results.json").read_text())
    resumed = json.loads((run_dir / "results.json").read_text())
    assert resumed["test"] == full["test"] and resumed["best_epoch"] == full["best_epoch"]
    assert (run_dir / "predictions_test.csv").read_text() == (tmp_path / "full/predictions_test.csv").read_text()
    rows = [[{k: v for k, v in r.items() if k != "seconds"} for r in csv.DictReader(open(folder / "metrics.csv"))]
            for folder in (tmp_path / "full", run_dir)]
    assert len(rows[0]) == 3 and rows[0] == rows[1]
    last = [(folder / "checkpoints/last/model.safetensors").read_bytes() for folder in (tmp_path / "full", run_dir)]
    assert last[0] == last[1]


def test_overrides_after_options_join_the_command_overrides(monkeypatch):
    seen = {}
    monkeypatch.setattr("medattn.commands.train.run", lambda args: seen.update(vars(args)) or 0)
    assert main(["train", "synthetic_cxr", "train.epochs=1", "--overwrite", "train.lr=0.1"]) == 0
    assert seen["overrides"] == ["train.epochs=1", "train.lr=0.1"]
    with pytest.raises(SystemExit):
        main(["train", "synthetic_cxr", "--overwrite", "--no-such-option"])


@pytest.mark.parametrize("argv", [["--help"], *[[name, "--help"] for name in COMMANDS],
                                  ["wsi", "tile", "--help"], ["train", "synthetic_cxr", "train.lr=-1"], ["trian"]],
                         ids=lambda argv: " ".join(argv))
def test_help_and_config_errors_answer_without_importing_torch(argv):
    """Help, usage and config errors come before any heavy import (they answered in about 3 s before)."""
    code = ("import sys\nfrom medattn.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    result = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_output_into_a_reader_that_stops_early_ends_quietly():
    """`medattn models | head -1`: no BrokenPipeError traceback, exit status 141 as after SIGPIPE."""
    script = "import sys\nsys.argv = ['medattn', 'models']\nfrom medattn.cli import entry\nentry()\n"
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write: every write fails with EPIPE
    try:
        result = subprocess.run([sys.executable, "-c", script], stdout=write_end, stderr=subprocess.PIPE, text=True,
                                timeout=60)
    finally:
        os.close(write_end)
    assert result.returncode == 141 and "Traceback" not in result.stderr, result.stderr


def test_progress_bars_are_drawn_on_a_terminal_only(tmp_path):
    """Output into a log file gets no bar redraws (``make demo > log`` wrote about 200 KB of them)."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "medattn", "train", "synthetic_cxr", "model.name=vit2d_tiny", "data.image_size=32",
               "data.num_samples=[16,8,8]", "train.epochs=1", "eval.bootstrap=0", "--out", str(tmp_path / "run")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "MEDATTN_MALLOC": "default"})
    assert done.returncode == 0, done.stderr
    assert "it/s" not in done.stderr and "\r" not in done.stderr


def test_train_speaks_at_once_and_its_time_is_the_whole_command(tmp_path, capsys):
    """``train`` printed nothing for seconds and a summary time of training alone (2.2 s of a 12.3 s command)."""
    import json
    import time

    started = time.time()
    assert main(["train", "synthetic_cxr", *TINY, "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    wall = time.time() - started
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("medattn train: vit2d_tiny on synthetic_cxr ->")
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["train_seconds"] < results["elapsed_seconds"] <= wall
    assert any(line.startswith("time ") and "in all" in line for line in out)


def test_models_lists_everything_a_config_can_name(capsys):
    """Every preset, mechanism, data kind, packaged config, and the diffusion models and data kinds."""
    from medattn.attention import available_attentions
    from medattn.data import available_data_kinds
    from medattn.diffusion.data import KINDS
    from medattn.diffusion.model import STAGES
    from medattn.models.presets import PRESETS

    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in [*PRESETS, *available_attentions(), *available_data_kinds(), *KINDS, *STAGES.values()]:
        assert name in out, name


def test_models_lists_without_importing_torch():
    """The catalogue answers ``medattn models`` in a fraction of a second: nothing in it loads torch."""
    code = ("import sys; from medattn.cli import main; main(['models']); "
            "assert 'torch' not in sys.modules, 'medattn models imported torch'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "binary-hamming" in done.stdout and "vit_s8_seg" in done.stdout


def test_catalogue_names_resolve_to_the_registered_classes():
    """Each name in the catalogue builds the class it names; the registries hold nothing the catalogue lacks."""
    from medattn import catalogue
    from medattn.attention import available_attentions, get_attention_class
    from medattn.models.presets import PRESETS

    assert set(available_attentions()) == set(catalogue.ATTENTIONS)
    for name, where in catalogue.ATTENTIONS.items():
        assert get_attention_class(name).__name__ == where.split(":")[1]
    assert {name: (cls.__name__, kwargs) for name, (cls, kwargs) in PRESETS.items()} == catalogue.PRESETS


def test_demo_table_rounds_the_auroc_of_a_run_that_learned_nothing():
    from medattn.experiments.demo import COLUMNS, format_table

    rows = [{"task": "synthetic_cxr", "task_label": "CXR", "mechanism": m, "auroc": 0.4567891, "ci_low": 0.3,
             "ci_high": 0.6, "did_not_learn": "within chance" if m == "seqnorm" else ""} for m in COLUMNS]
    table = format_table(rows, ["synthetic_cxr"])
    assert "its AUROC 0.457 is not a result" in table and "0.4567891" not in table


def test_models_lists_aligned_presets_and_every_tile_encoder(capsys):
    """Issue 36: the columns stay aligned for the longest preset name, and the tile encoders are listed (from their
    cards) with the design keys of the presets (stem, readout)."""
    from medattn.slides.encoders import extractor_kinds

    assert main(["models"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("  ") and "=" in line]
    columns = {line.index(line.split()[1]) for line in rows}  # where the class name starts
    assert len(columns) == 1, rows
    encoders = out.split("tile encoders")[1].split("attention mechanisms")[0]
    assert all(f"  {name} " in encoders for name in extractor_kinds())
    assert "stem=residual" in out and "readout=max" in out
