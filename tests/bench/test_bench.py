"""Smoke runs of ``medattn bench attention`` / ``bench scaling`` at tiny sizes, and the roofline arithmetic."""

from __future__ import annotations

import json

import pytest
import torch

from medattn.bench import attention, binary, roofline, scaling, scaling_step
from medattn.bench.common import extrapolate
from medattn.cli import main
from medattn.models import create_model

RATES = roofline.MachineRates({"fp32": 100.0, "bf16": 400.0}, 10.0)  # fixed, so no measuring in tests


@pytest.fixture(autouse=True)
def _fixed_rate_after_each_variant(monkeypatch):
    """bench scaling measures the matmul rate again after each variant; fixed here (50 GFLOP/s)."""
    monkeypatch.setattr(scaling_step, "measure_matmul_gflops", lambda precision, device="cpu": 50.0)


def test_attention_cost_by_hand():
    # seqnorm core, B=1, H=2, N=8, d=4, fp32: K'^T V and Q' C are 2 * H * N * d^2 = 512 FLOPs each, 1024 in
    # all; compulsory bytes: q, k, v read and the output written, 4 tensors of H N d = 64 floats = 1024 bytes.
    forward = roofline.attention_cost("seqnorm", seq_len=8, heads=2, head_dim=4, dim=8)
    assert forward == roofline.Cost(1024, 1024)
    # Backward: twice the FLOPs and 7 tensors of 64 floats.
    both = roofline.attention_cost("seqnorm", seq_len=8, heads=2, head_dim=4, dim=8, backward=True)
    assert both == roofline.Cost(3 * 1024, 1024 + 7 * 64 * 4)
    # Softmax: 4 H N^2 d = 4 * 2 * 64 * 4 = 2048. SimA takes the cheaper order: N=2 < d=4 gives 4 H N d N.
    assert roofline.attention_cost("softmax", 8, 2, 4, 8).flops == 2048
    assert roofline.attention_cost("sima", 2, 2, 4, 8).flops == 4 * 2 * 2 * 4 * 2
    # bf16 halves the bytes, not the FLOPs; a mechanism without a FLOP model has none; an unknown one is refused.
    assert roofline.attention_cost("seqnorm", 8, 2, 4, 8, precision="bf16") == roofline.Cost(1024, 512)
    assert roofline.attention_cost("binary-hamming", 8, 2, 4, 8) is None
    with pytest.raises(ValueError, match="unknown attention"):
        roofline.attention_cost("no-such-mechanism", 8, 2, 4, 8)
    # Roofline time: 1024 FLOPs at 100 GFLOP/s plus 1024 bytes at 10 GB/s.
    assert RATES.time_s(forward, "fp32") == pytest.approx(1024 / 100e9 + 1024 / 10e9)


def test_layer_cost_adds_the_projections():
    # qkv: 8 rows x (8 -> 24): 2*8*8*24 = 3072 FLOPs; proj: 8 x (8 -> 8): 1024; the core 1024.
    layer = roofline.attention_cost("seqnorm", seq_len=8, heads=2, head_dim=4, dim=8, layer=True)
    assert layer.flops == 1024 + 3072 + 1024
    # Bytes of the qkv forward: X (64) + W (192) + Y (192) floats.
    assert roofline.linear_cost(8, 8, 24).bytes == (64 + 192 + 192) * 4
    # Backward without input gradient counts one extra product; with it, two.
    assert roofline.linear_cost(8, 8, 24, backward=True, input_grad=False).flops == 2 * 3072
    assert roofline.linear_cost(8, 8, 24, backward=True).flops == 3 * 3072


def test_matmul_flops_of_a_model_by_hand():
    # vit2d_tiny at 32 px: patch 8 -> 16 patches + cls = 17 tokens, D' = D = 32, MLP 64, depth 2, 1 class.
    tokens, dim, mlp = 17, 32, 64
    block = 2 * tokens * (dim * 3 * dim + dim * dim + 2 * dim * mlp)
    patch = 2 * 16 * (1 * 8 * 8) * dim
    head = 2 * 1 * dim * 1
    forward = 2 * block + patch + head
    assert roofline.matmul_flops(lambda: create_model("vit2d_tiny", img_size=32), (1, 1, 32, 32),
                                 backward=False) == forward
    # Backward: every layer twice more, except the patch embedding whose input (the image) needs no grad.
    assert roofline.matmul_flops(lambda: create_model("vit2d_tiny", attention="seqnorm", img_size=32),
                                 (1, 1, 32, 32)) == 3 * forward - patch


def test_extrapolate_power_law():
    assert extrapolate([], 10) is None
    assert extrapolate([(1, 2.0)], 4) == pytest.approx(32.0)  # default exponent 2
    assert extrapolate([(1, 1.0), (2, 8.0)], 4) == pytest.approx(64.0)  # fitted exponent 3
    assert extrapolate([(1, 1.0), (2, 1.0)], 4) == pytest.approx(2.0)  # clamped to at least 1


def test_attention_bench_rows_in_process():
    rows = attention.run_attention_bench(["softmax", "seqnorm"], [16, 64], heads=2, head_dim=8, dim=16,
                                         repeats=1, warmup=0, rates=RATES, isolate=False, include_peers=False)
    ok = [row for row in rows if row["status"] == "ok"]
    assert len(ok) == 2 * 2 * 2 * 2  # mechanisms x N x parts x passes
    for row in ok:
        assert row["median_s"] > 0
        assert row["roofline_s"] == pytest.approx(row["roofline_fraction"] * row["median_s"])
        assert {"machine", "torch_threads", "allocator", "torch", "precision"} <= set(row)
    seqnorm_core = next(r for r in ok if r["mechanism"] == "seqnorm" and r["part"] == "core" and r["n"] == 64
                        and r["pass"] == "fwd")
    cost = roofline.attention_cost("seqnorm", 64, 2, 8, 16)
    assert seqnorm_core["roofline_s"] == pytest.approx(RATES.time_s(cost, "fp32"))


def test_attention_bench_skips_over_budget():
    # A budget no real call meets: the smallest N runs, the next ones are skipped and recorded.
    rows = attention.run_attention_bench(["linear"], [16, 32, 64], heads=2, head_dim=8, dim=16, parts=("core",),
                                         repeats=1, warmup=0, budget_s=1e-9, rates=RATES, isolate=False,
                                         include_peers=False)
    by_n = {row["n"]: row["status"] for row in rows if row["pass"] == "fwd"}
    assert by_n[16] == "ok"
    assert by_n[32].startswith("skipped: over time budget") and by_n[64].startswith("skipped: over time budget")


def test_attention_bench_records_missing_peer():
    name = next(iter(attention.PEERS))
    if name in attention.installed_peers():
        pytest.skip(f"{name} is installed")
    rows = attention.run_attention_bench([name], [16], rates=RATES, isolate=False)
    assert len(rows) == 1 and rows[0]["status"].endswith("not installed")


def test_attention_bench_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown attention"):
        attention.run_attention_bench(["nope"], [16], rates=RATES)
    with pytest.raises(ValueError, match="positive"):
        attention.run_attention_bench(["softmax"], [0], rates=RATES)
    with pytest.raises(ValueError, match="precision"):
        attention.run_attention_bench(["softmax"], [16], precision="fp8", rates=RATES)


def test_attention_bench_isolated_memory_grows_and_budget_skips():
    # Fresh processes: q, k, v are 8 MiB each at N=32768 (2 heads of 32), so the peak of the seqnorm
    # core's backward there exceeds that at N=64 (kilobytes) by at least them and their gradients. From
    # these two points N=65536 is predicted over a 51 MiB budget and skipped without running.
    rows = attention.run_attention_bench(["seqnorm"], [64, 32768, 65536], heads=2, head_dim=32, dim=64,
                                         parts=("core",), passes=("fwd+bwd",), repeats=1, warmup=0, budget_s=1e6,
                                         memory_budget_gb=0.05, rates=RATES, isolate=True, include_peers=False)
    assert [row["status"] for row in rows][:2] == ["ok", "ok"]
    assert rows[1]["peak_mem_mb"] - rows[0]["peak_mem_mb"] > 6 * 8
    assert rows[2]["status"].startswith("skipped: over memory budget")


def test_scaling_bench_rows_in_process():
    rows = scaling.run_scaling_bench(["softmax", "seqnorm"], [32, 64], model="vit2d_tiny", repeats=1, warmup=0,
                                     rates=RATES, isolate=False, images_per_epoch=100)
    assert [(r["mechanism"], r["resolution"], r["tokens"]) for r in rows] == [
        ("softmax", 32, 17), ("softmax", 64, 65), ("seqnorm", 32, 17), ("seqnorm", 64, 65)]
    for row in rows:
        assert row["status"] == "ok"
        assert row["epoch_s"] == pytest.approx(100 * row["step_s"])
        assert row["floor_ratio"] == pytest.approx(row["step_s"] / row["matmul_floor_s"])
        assert row["floor_ratio_after"] == pytest.approx(row["step_s"] / (row["matmul_gflop"] / 50.0))
        assert row["matmul_floor_s"] == pytest.approx(row["matmul_gflop"] / 100.0)
        assert row["floor_ratio_interleaved"] > 0  # the rate timed in the steps' rounds, not the fixed RATES
        # the work the step executed: every matmul of the floor's layers and the attention cores besides
        assert row["matmul_gflop"] <= row["counted_gflop"] <= 1.5 * row["matmul_gflop"] + 1e-3
        assert row["achieved_gflops"] == pytest.approx(row["counted_gflop"] / row["step_s"])


def test_scaling_bench_skips_over_time_budget():
    rows = scaling.run_scaling_bench(["seqnorm"], [32, 64], model="vit2d_tiny", repeats=1, warmup=0, rates=RATES,
                                     isolate=False, time_budget_s=1e-9)
    assert rows[0]["status"] == "ok"
    assert rows[1]["status"].startswith("skipped: over time budget")
    assert "step_s" not in rows[1] and rows[1]["matmul_floor_s"] > 0


def test_cli_attention_writes_csv_and_json(tmp_path, monkeypatch):
    monkeypatch.setattr(attention, "measure_rates", lambda device="cpu": RATES)
    code = main(["bench", "attention", "--mechanisms", "sima", "--seq-lens", "16", "--heads", "2", "--head-dim", "8",
                 "--dim", "16", "--repeats", "1", "--no-isolate", "--out", str(tmp_path)])
    assert code == 0
    data = json.loads((tmp_path / "attention.json").read_text())
    assert data["environment"]["rates"] == RATES.as_dict()
    assert {(r["part"], r["pass"]) for r in data["results"]} == {(p, q) for p in attention.PARTS
                                                                  for q in attention.PASSES}
    assert (tmp_path / "attention.csv").read_text().startswith("mechanism,part,n,")


def test_cli_scaling_writes_csv_json_png(tmp_path, monkeypatch):
    monkeypatch.setattr(scaling, "measure_rates", lambda device="cpu": RATES)
    code = main(["bench", "scaling", "--model", "vit2d_tiny", "--resolutions", "32", "--mechanisms", "seqnorm",
                 "--repeats", "1", "--warmup", "0", "--no-isolate", "--out", str(tmp_path)])
    assert code == 0
    rows = json.loads((tmp_path / "scaling.json").read_text())["results"]
    assert len(rows) == 1 and rows[0]["status"] == "ok"
    pytest.importorskip("matplotlib")
    assert (tmp_path / "scaling.png").stat().st_size > 0


def test_cli_reports_bad_mechanism(capsys):
    assert main(["bench", "scaling", "--mechanisms", "nope", "--model", "vit2d_tiny"]) == 2
    assert "unknown attention" in capsys.readouterr().err


@pytest.mark.parametrize("precision", ["bf16"])
def test_attention_bench_bf16_runs(precision):
    if not torch.backends.mkldnn.is_available():
        pytest.skip("no oneDNN for bf16 on this CPU build")
    rows = attention.run_attention_bench(["seqnorm"], [16], heads=2, head_dim=8, dim=16, precision=precision,
                                         repeats=1, warmup=0, rates=RATES, isolate=False, include_peers=False)
    assert all(row["status"] == "ok" and row["precision"] == "bf16" for row in rows)


def test_cli_binary_and_pam_smoke_runs_write_results(tmp_path):
    """The two other benches run end to end from the CLI at tiny sizes and write their CSV/JSON."""
    assert main(["bench", "binary", "--sizes", "64", "--dims", "8", "--repeats", "1", "--skip", "bf16", "memory",
                 "--threads", "1", "--out", str(tmp_path / "binary")]) == 0
    recorded = json.loads(next((tmp_path / "binary").glob("*.json")).read_text())
    assert recorded["environment"]["torch_threads"] == 1  # --threads honoured and recorded
    layers = json.loads((tmp_path / "binary" / "binary_layer.json").read_text())["results"]
    assert {r["method"] for r in layers} == set(binary.LAYERS)  # each layer timed in the same rounds as softmax
    assert all(r["speedup_vs_softmax"] > 0 and r["heads"] == 8 and r["dim"] == 64 for r in layers)
    assert next(r for r in layers if r["method"] == "binary-hamming/v16")["value_dim"] == 16
    assert main(["bench", "pam", "--sizes", "500", "--brute-max", "500", "--repeats", "1",
                 "--out", str(tmp_path / "pam")]) == 0
    for folder in ("binary", "pam"):
        written = {p.suffix for p in (tmp_path / folder).iterdir()}
        assert {".csv", ".json"} <= written


def test_scaling_bench_variants_side_by_side_in_one_process():
    rows = scaling.run_scaling_bench(["seqnorm"], [32], model="vit2d_tiny", repeats=1, warmup=0, rates=RATES,
                                     isolate=False, activation_checkpointing=True)
    assert [(r["variant"], r["status"]) for r in rows] == [("eager", "ok"), ("eager+checkpointing", "ok")]
    assert rows[0]["vs_eager"] == 1.0
    assert rows[1]["vs_eager"] == pytest.approx(rows[1]["step_s"] / rows[0]["step_s"])
    assert rows[0]["matmul_floor_s"] == rows[1]["matmul_floor_s"]


def test_scaling_bench_failing_variant_keeps_the_others(monkeypatch):
    def broken_compile(model, **kwargs):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(torch, "compile", broken_compile)
    rows = scaling.run_scaling_bench(["sima"], [32], model="vit2d_tiny", repeats=1, warmup=0, rates=RATES,
                                     isolate=False, compile=True)
    assert [r["variant"] for r in rows] == ["eager", "compiled"]
    assert rows[0]["status"] == "ok"
    assert rows[1]["status"] == "failed: RuntimeError: no compiler here"


def test_scaling_bench_bf16_beside_fp32_or_says_why_not(monkeypatch):
    class Bf16:
        def __init__(self, reason):
            self.reason = reason

        def unsupported_reason(self):
            return self.reason

    monkeypatch.setattr(scaling, "cpu_bf16_support", lambda: Bf16(None))
    rows = scaling.run_scaling_bench(["seqnorm"], [32], model="vit2d_tiny", precision=["fp32", "bf16"], repeats=1,
                                     warmup=0, rates=RATES, isolate=False, device="cpu")
    assert [(r["variant"], r["precision"], r["status"]) for r in rows] == [
        ("eager", "fp32", "ok"), ("eager bf16", "bf16", "ok")]
    assert rows[1]["matmul_floor_s"] == pytest.approx(rows[1]["matmul_gflop"] / 400.0)  # the bf16 rate
    assert rows[1]["vs_eager"] == pytest.approx(rows[1]["step_s"] / rows[0]["step_s"])

    monkeypatch.setattr(scaling, "cpu_bf16_support", lambda: Bf16("bf16: not supported on this CPU (test)"))
    rows = scaling.run_scaling_bench(["seqnorm"], [32], model="vit2d_tiny", precision=["fp32", "bf16"], repeats=1,
                                     warmup=0, rates=RATES, isolate=False, device="cpu")
    assert [(r["variant"], r["status"]) for r in rows] == [
        ("eager bf16", "skipped: bf16: not supported on this CPU (test)"), ("eager", "ok")]
    assert "step_s" not in rows[0]


def test_extract_bench_reports_tiles_per_second_against_the_matmul_rate(tmp_path):
    """medattn bench extract: an encoder in a publisher's architecture with random weights, timed beside a matmul."""
    assert main(["bench", "extract", "--encoders", "vit-b16,resnet50", "--precisions", "fp32,int8", "--rounds", "1",
                 "--batch-size", "1", "--threads", "1", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "extract.json").read_text())["results"]
    assert [(r["encoder"], r["precision"]) for r in rows] == [("vit-b16", "fp32"), ("vit-b16", "int8"),
                                                              ("resnet50", "fp32")]  # no int8 for convolutions
    assert rows[0]["min_cosine_to_fp32"] == pytest.approx(1.0) and 0.99 < rows[1]["min_cosine_to_fp32"] < 1.0
    rows = [rows[0], rows[2]]
    assert rows[0]["gflop_per_tile"] == pytest.approx(35.1, rel=0.05)  # ViT-B/16 at 224 px: 17.6 GMAC
    assert rows[1]["gflop_per_tile"] == pytest.approx(8.2, rel=0.05)  # ResNet-50: 4.1 GMAC
    for row in rows:
        assert row["tiles_per_s"] > 0 and 0 < row["fraction_of_matmul"] < 5
        assert row["hours_per_15k"] == pytest.approx(15_000 / row["tiles_per_s"] / 3600)


def test_on_cuda_with_triton_a_kernel_mechanism_is_timed_with_and_without_its_kernels(monkeypatch):
    """bench scaling's variants twice (torch, triton) where the kernels can run; the torch twin's step runs with
    the kernels switched off. Faked here: the implementations of a CUDA device, steps on the CPU."""
    from medattn.attention import triton_support

    seen = []
    monkeypatch.setattr(scaling_step, "implementations", lambda mechanism, device: ["torch", "triton"])
    real_step = scaling_step.training_step

    def recording_step(*args, **kwargs):
        step = real_step(*args, **kwargs)
        return lambda: seen.append(triton_support.switched_off()) or step()

    monkeypatch.setattr(scaling_step, "training_step", recording_step)
    result = scaling_step.measure_step("vit2d_tiny", "seqnorm", 32, repeats=1, warmup=1)
    assert [v["variant"] for v in result["variants"]] == ["eager torch", "eager triton"]
    assert all(v["status"] == "ok" for v in result["variants"]) and True in seen and False in seen
