"""The machine record of every benchmark: CPU model, torch's CPU capability, bf16 hardware, load average;
benchmarks leave bf16 out (and say so) on a CPU without bf16 hardware."""

from __future__ import annotations

import argparse

from medattn.bench import binary, common

AVX2_ONLY = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma popcnt\n"
AVX512_BF16 = "model name\t: Zen 5\nflags\t\t: avx2 avx512f avx512_bf16 avx512_vpopcntdq\n"
AMX = "flags\t\t: avx2 avx512f amx_tile amx_bf16 amx_int8\n"
ARM = "Features\t: fp asimd bf16 i8mm\n"


def test_bf16_support_read_from_cpu_flags():
    no = common.cpu_bf16_support(AVX2_ONLY)
    assert not no.supported and no.flags == ()
    assert no.describe().startswith("no (") and "not supported on this CPU" in no.unsupported_reason()
    assert common.cpu_bf16_support(AVX512_BF16).flags == ("avx512_bf16",)
    assert common.cpu_bf16_support(AMX).flags == ("amx_bf16",)
    assert common.cpu_bf16_support(ARM).describe() == "yes (bf16)"
    assert common.cpu_bf16_support(AMX).unsupported_reason() is None
    assert not common.cpu_bf16_support("").supported  # no /proc/cpuinfo: nothing claimed


def test_environment_records_cpu_capability_bf16_and_load():
    env = common.environment()
    assert env["cpu_capability"]  # e.g. "AVX2", "AVX512"
    assert env["cpu_bf16"].startswith(("yes (", "no ("))
    assert env["load_average_1min"] is None or env["load_average_1min"] >= 0
    assert "cpu_bf16" in common.row_environment(env)


def test_binary_bench_leaves_bf16_out_without_hardware(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(binary, "cpu_bf16_support", lambda: common.cpu_bf16_support(AVX2_ONLY))
    parser = argparse.ArgumentParser()
    binary.add_arguments(parser)
    args = parser.parse_args(["--sizes", "64", "--dims", "64", "--repeats", "1", "--skip", "memory",
                              "--out", str(tmp_path)])
    assert binary.run(args) == 0
    assert "bf16: not supported on this CPU" in capsys.readouterr().out
    methods = (tmp_path / "binary_scores.csv").read_text() + (tmp_path / "binary_attention.csv").read_text()
    assert "bits-popcount" in methods and "bits-sg" in methods and "bf16" not in methods


def test_interleaved_medians_time_every_method_each_round():
    calls = []
    medians = binary.interleaved_medians({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 3)
    assert calls == ["a", "b"] * 4  # one warm-up round, then three timed rounds in turn
    assert set(medians) == {"a", "b"} and all(t >= 0 for t in medians.values())
