"""Runs move between machines (issue 38): the device a model was trained on is recorded in its checkpoint, never
obeyed. A run trained here on the CPU is rewritten as a GPU run writes it (``train.device: cuda``, and
``train.precision: bf16``); predict, eval, explain and export of it on this CPU succeed and give the CPU run's numbers;
``--device`` names where a model runs (a device this machine lacks is one error line); a bf16 model on a CPU without
bf16 hardware runs in fp32 and says so once. Benchmarks name the GPU they ran on. Tests marked ``cuda`` run where a
GPU exists (``pytest -m cuda``)."""

from __future__ import annotations

import csv
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

from engine_data import square_image_table
from medattn.bench import common, plots
from medattn.cli import main
from medattn.errors import UserError
from medattn.runtime import device as runtime_device

TRAIN = ["train.epochs=1", "train.batch_size=4", "train.threads=1", "eval.bootstrap=0", "--no-progress"]


def _as_written_on_a_gpu(run: Path, target: Path, **train: str) -> Path:
    """A copy of ``run`` whose checkpoints' configs say what a GPU run's do (``train`` keys, e.g. device="cuda").
    A checkpoint keeps its weights on the CPU (``model.safetensors`` holds no device) and its run config in
    ``checkpoint.json``: the config is what could bind a run to a machine, so the config is rewritten."""
    shutil.copytree(run, target)
    metas = sorted(target.rglob("checkpoint.json"))
    assert metas
    for path in metas:
        meta = json.loads(path.read_text())
        meta["config"]["train"].update(train)
        path.write_text(json.dumps(meta, indent=1))
    return target


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """PNG files (positives carry a bright square), a tiny ViT trained on them on the CPU, and that run as a CUDA
    run (``cuda``) and as a CUDA bf16 run (``bf16``) write it."""
    folder = tmp_path_factory.mktemp("portable")
    square_image_table(folder, "{name: vit2d_tiny, kwargs: {img_size: 16}}")
    assert main(["train", str(folder / "c.yaml"), "train.device=cpu", *TRAIN, "--out", str(folder / "cpu")]) == 0
    return {"folder": folder, "files": [str(folder / f"{i}.png") for i in range(6)], "cpu": folder / "cpu",
            "cuda": _as_written_on_a_gpu(folder / "cpu", folder / "cuda", device="cuda"),
            "bf16": _as_written_on_a_gpu(folder / "cpu", folder / "bf16", device="cuda", precision="bf16")}


def _rows(path: Path) -> list[dict]:
    return list(csv.DictReader(open(path)))


def _probabilities(path: Path) -> list[dict]:
    return [{key: value for key, value in row.items() if key.startswith("prob_")} for row in _rows(path)]


def _predict(runs: dict, run: str, name: str, *options: str) -> list[dict]:
    out = runs["folder"] / f"{name}.csv"
    assert main(["predict", str(runs[run]), *runs["files"], "--out", str(out), "--overwrite", *options]) == 0
    return _probabilities(out)


def test_a_gpu_run_predicts_evaluates_explains_and_exports_on_the_cpu(runs, capsys):
    """Every command that runs the model answers on this CPU, with the numbers of the run trained here."""
    folder = runs["folder"]
    expected = _predict(runs, "cpu", "cpu")
    capsys.readouterr()
    assert _predict(runs, "cuda", "cuda") == expected
    assert "ran on cpu (trained with train.device=cuda)" in capsys.readouterr().out
    assert _predict(runs, "cuda", "cuda_on_cpu", "--device", "cpu") == expected
    evaluated = {}
    for run in ("cpu", "cuda"):
        assert main(["eval", str(runs[run]), str(folder / "c.yaml"), "--out", str(folder / f"eval_{run}"),
                     "--no-progress"]) == 0
        evaluated[run] = json.loads((folder / f"eval_{run}" / "eval.json").read_text())
        explained = folder / f"explain_{run}"
        assert main(["explain", str(runs[run]), *runs["files"][:2], "--out", str(explained)]) == 0
        evaluated[run]["summary"] = _probabilities(explained / "summary.csv")
        assert main(["export", str(runs[run]), "--format", "pt2", "--out", str(folder / f"{run}.pt2")]) == 0
    assert evaluated["cuda"]["auroc"] == evaluated["cpu"]["auroc"] is not None
    assert evaluated["cuda"]["summary"] == evaluated["cpu"]["summary"] == expected[:2]
    assert (folder / "eval_cuda" / "predictions_test.csv").read_text() == \
        (folder / "eval_cpu" / "predictions_test.csv").read_text()
    assert main(["predict", str(folder / "cuda.pt2"), *runs["files"], "--out", str(folder / "pt2.csv")]) == 0
    _close(_probabilities(folder / "pt2.csv"), expected, 1e-4)


def test_the_library_takes_the_device_too(runs):
    """open_model, evaluate and explain_files take ``device`` (default ``auto``: here the CPU)."""
    from medattn.config import load_config
    from medattn.deploy.runtime import open_model
    from medattn.explain.files import explain_files
    from medattn.runtime.trained import load_checkpoint
    from medattn.train.evaluate import evaluate

    runner = open_model(runs["cuda"])
    assert (runner.device, runner.trained_device) == ("cpu", "cuda")
    assert open_model(runs["cuda"], device="cpu").device == "cpu"
    trained = load_checkpoint(runs["cuda"])
    assert {p.device.type for p in trained.model.parameters()} == {"cpu"}
    assert trained.config["train"]["device"] == "cuda"  # recorded, shown, not obeyed
    config = load_config(str(runs["folder"] / "c.yaml"))
    result = evaluate(runs["cuda"], config, out=runs["folder"] / "lib_eval", progress=False, device="cpu")
    assert result["auroc"] is not None and result["device"] == "cpu"  # eval.json records where it ran
    report = explain_files(runs["cuda"], runs["files"][:1], runs["folder"] / "lib_explain", device="cpu")
    assert len(report.rows) == 1
    for name in ("cuda", "cuda:3", "gpu"):
        with pytest.raises(UserError, match="--device"):
            open_model(runs["cuda"], device=name)


@pytest.mark.parametrize("name", ["cuda", "cuda:99", "gpu"])
@pytest.mark.parametrize("command", ["predict", "eval", "explain"])
def test_a_device_this_machine_lacks_is_one_error_line(runs, command, name, capsys):
    if name == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    folder = runs["folder"]
    argv = {"predict": ["predict", str(runs["cuda"]), *runs["files"], "--out", str(folder / "refused.csv")],
            "eval": ["eval", str(runs["cuda"]), str(folder / "c.yaml"), "--out", str(folder / "refused_eval")],
            "explain": ["explain", str(runs["cuda"]), *runs["files"], "--out", str(folder / "refused_explain")]}
    capsys.readouterr()
    assert main([*argv[command], "--device", name]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"medattn: error: --device={name}: ") and "\n" not in err and "Traceback" not in err
    assert not (folder / "refused.csv").exists() and not (folder / "refused_eval").exists()
    assert not (folder / "refused_explain").exists()


def test_an_exported_file_runs_on_the_cpu(runs, capsys):
    folder = runs["folder"]
    assert main(["export", str(runs["cpu"]), "--format", "pt2", "--out", str(folder / "cpu_only.pt2"),
                 "--overwrite"]) == 0
    capsys.readouterr()
    assert main(["predict", str(folder / "cpu_only.pt2"), *runs["files"], "--out", str(folder / "x.csv"),
                 "--device", "cuda"]) == 2
    assert "runs on the CPU here" in capsys.readouterr().err


def _close(a: list[dict], b: list[dict], tolerance: float) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            assert abs(float(x[key]) - float(y[key])) <= tolerance, (key, x[key], y[key])


def _notes(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "train.precision=bf16" in r.getMessage()]


def test_bf16_without_hardware_runs_in_fp32_and_says_so_once(runs, monkeypatch, caplog):
    expected = _predict(runs, "cpu", "fp32")
    caplog.set_level(logging.WARNING, logger="medattn.runtime")
    monkeypatch.setattr(runtime_device, "bf16_in_hardware", lambda device: False)
    assert _predict(runs, "bf16", "bf16_emulated") == expected  # fp32, as the CPU run
    assert _notes(caplog) == ["the model was trained with train.precision=bf16, but this CPU has no AVX-512 BF16 or "
                              "AMX: it runs in fp32"]
    caplog.clear()
    monkeypatch.setattr(runtime_device, "bf16_in_hardware", lambda device: True)
    in_bf16 = _predict(runs, "bf16", "bf16_hardware")
    assert _notes(caplog) == []
    _close(in_bf16, expected, 0.05)  # bf16 autocast: close, not equal
    caplog.clear()
    assert _predict(runs, "cpu", "fp32_again") == expected and _notes(caplog) == []  # an fp32 model: no note


def test_bf16_hardware_detection():
    cpu = torch.device("cpu")
    assert runtime_device.bf16_in_hardware(cpu) == (torch.cpu._is_avx512_bf16_supported()
                                                    or torch.cpu._is_amx_tile_supported())
    assert runtime_device.bf16_in_hardware(torch.device("mps")) is False
    assert runtime_device.inference_precision("fp32", cpu) == "fp32"


def test_auto_is_the_best_this_machine_has(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert runtime_device.best_device() == "mps"
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert runtime_device.best_device() == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert runtime_device.best_device() == "cuda"


def test_benchmarks_name_the_gpu(monkeypatch):
    """The machine record and the plot titles name the GPU a bench ran on (CUDA), else the CPU."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert common.device_name("cuda") == common.device_name("cuda:1") == "NVIDIA H100 80GB HBM3"
    assert common.device_name("cpu") == common.environment()["processor"]
    env = common.environment("bf16", "cuda")
    assert (env["device"], env["device_name"]) == ("cuda", "NVIDIA H100 80GB HBM3")
    row = {"mechanism": "seqnorm", "resolution": 64, "n": 64, "status": "ok", "epoch_h": 1.0, "median_s": 0.1,
           "peak_mem_mb": 10.0, "model": "vit2d_tiny", "batch_size": 2, "precision": "bf16",
           **common.row_environment(env)}
    assert plots.hardware([row]) == "NVIDIA H100 80GB HBM3"
    titles = []
    monkeypatch.setattr(plots, "_pyplot", lambda: _FakePyplot)
    monkeypatch.setattr(plots, "_finish", lambda fig, panels, ticks, xlabel, title, dpi: titles.append(title))
    plots.scaling_figure([row])
    plots.attention_scaling_figure([row], "one attention layer")
    assert titles == ["vit2d_tiny training step, batch 2, bf16, NVIDIA H100 80GB HBM3",
                      "one attention layer, NVIDIA H100 80GB HBM3"]


class _FakePyplot:
    """As much of pyplot as the plot functions call before :func:`medattn.bench.plots._finish`."""

    class _Axis:
        def plot(self, *args, **kwargs) -> None:
            pass

    @classmethod
    def subplots(cls, *args, **kwargs):
        return None, (cls._Axis(), cls._Axis())


@pytest.mark.cuda
def test_predict_on_the_gpu_equals_predict_on_the_cpu(runs):
    """Where a GPU exists: the CUDA run predicts on it (``--device cuda``) as on the CPU (TF32 convolutions: 1e-3)."""
    _close(_predict(runs, "cuda", "on_gpu", "--device", "cuda"), _predict(runs, "cuda", "on_cpu", "--device", "cpu"),
           1e-3)


@pytest.mark.cuda
def test_bf16_on_a_gpu_that_has_it():
    gpu = torch.device("cuda")
    assert runtime_device.inference_precision("bf16", gpu) == \
        ("bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp32")
