"""benchmarks/diffusion_scaling.py runs end to end on a tiny grid and writes its rows."""

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "diffusion_scaling.py"


def test_diffusion_scaling_bench_writes_time_and_memory(tmp_path):
    spec = importlib.util.spec_from_file_location("diffusion_scaling", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.main(["--mechanisms", "softmax,binary-hamming", "--grids", "2x2x2,2x2x4", "--dim", "16",
                        "--depth", "1", "--heads", "2", "--repeats", "1", "--threads", "1", "--in-process",
                        "--out", str(tmp_path)])
    assert [(r["mechanism"], r["tokens"]) for r in rows] == [("softmax", 8), ("softmax", 16), ("binary-hamming", 8),
                                                             ("binary-hamming", 16)]
    assert all(r["status"] == "ok" and r["train_step_s"] > 0 and r["sample_step_s"] > 0 for r in rows)
    saved = json.loads((tmp_path / "diffusion_scaling.json").read_text())
    assert saved["environment"]["torch_threads"] == 1 and len(saved["results"]) == 4
    assert (tmp_path / "diffusion_scaling.csv").read_text().startswith("mechanism,tokens,grid")


def test_measure_case_in_a_fresh_process_reports_memory():
    from medattn.bench.common import run_isolated

    result = run_isolated("medattn.diffusion.benchmark:measure_case", {"attention": "softmax", "grid": [2, 2, 4],
                          "phase": "sample", "dim": 16, "depth": 1, "heads": 2, "repeats": 1, "threads": 1},
                          timeout_s=300)
    assert result["sample_step_s"] > 0 and result["sample_peak_mib"] >= 0
