"""``medattn bench diffusion`` (and its alias benchmarks/diffusion_scaling.py) runs end to end on a tiny grid and writes
its rows."""

import importlib.util
import json
from pathlib import Path

from medattn.cli import main

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "diffusion_scaling.py"
TINY = ["--grids", "2x2x2,2x2x4", "--dim", "16", "--depth", "1", "--heads", "2", "--repeats", "1", "--threads", "1"]


def test_diffusion_bench_writes_time_and_memory(tmp_path):
    assert main(["bench", "diffusion", "--mechanisms", "softmax,binary-hamming", *TINY, "--in-process",
                 "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "diffusion_scaling.json").read_text())
    rows = saved["results"]
    assert [(r["mechanism"], r["tokens"]) for r in rows] == [("softmax", 8), ("softmax", 16), ("binary-hamming", 8),
                                                             ("binary-hamming", 16)]
    assert all(r["status"] == "ok" and r["train_step_s"] > 0 and r["sample_step_s"] > 0 for r in rows)
    assert saved["environment"]["torch_threads"] == 1 and saved["environment"]["device"] == rows[0]["device"]
    assert (tmp_path / "diffusion_scaling.csv").read_text().startswith("mechanism,tokens,grid")


def test_old_script_is_the_bench_measuring_each_case_in_a_fresh_process(tmp_path):
    spec = importlib.util.spec_from_file_location("diffusion_scaling", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--mechanisms", "softmax", "--grids", "2x2x4", *TINY[2:], "--out", str(tmp_path)]) == 0
    (row,) = json.loads((tmp_path / "diffusion_scaling.json").read_text())["results"]
    assert row["status"] == "ok" and row["sample_step_s"] > 0 and row["train_peak_mib"] >= 0
    assert module.main(["--mechanisms", "softmax", "--grids", "2x2x4", "--out", str(tmp_path)]) == 2  # refused


def test_a_case_predicted_over_the_budget_is_skipped(tmp_path):
    assert main(["bench", "diffusion", "--mechanisms", "softmax", *TINY, "--max-case-s", "1e-9", "--in-process",
                 "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "diffusion_scaling.json").read_text())["results"]
    assert rows[0]["status"] == "ok" and rows[1]["status"].startswith("skipped: over time budget")
