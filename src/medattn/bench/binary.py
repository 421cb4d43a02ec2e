"""BinaryFormer bit kernel vs fp32/bf16: Q K^T scores and whole attention forward, time and memory.

For every sequence length N and head dim d (one head, batch 1) it times, in one process, the methods
in rounds (one call of each per round; medians over the rounds, :func:`medattn.bench.common.interleaved_medians`):

* scores: all N x N dot products, in blocks of ``--block`` query rows (the same blocks for every
  method, so no N x N matrix is held): fp32 ``torch.matmul``, bf16 ``torch.matmul`` and the packed-bit
  popcount kernel (exact integers, int8 for d < 128, else int16; packing timed separately);
* attention: the whole forward ``softmax(S) V`` of ``--heads`` heads (batch 1): fp32 and bf16
  ``scaled_dot_product_attention`` and the bit kernel (binary-sg scores; with ``w_q w_k`` weights as
  binary-hamming);
* layer: whole attention layers in eval mode under ``torch.no_grad`` (width ``heads x d``; input (1, N,
  width)): ``softmax`` (SDPA), ``binary-hamming`` and ``binary-sg`` with values as wide as the queries, and
  ``binary-hamming`` with the paper's 16-wide values per head (``binary-hamming/v16``), each with its
  ``speedup_vs_softmax`` measured in the same rounds.

bf16 is timed only where the CPU has bf16 hardware (AVX-512 BF16, AMX, Arm BF16; see
:func:`medattn.bench.common.cpu_bf16_support`); elsewhere the command says "bf16: not supported on this
CPU" and leaves it out, since an emulated bf16 matmul (about 40x slower than fp32) means nothing.

Peak memory of the attention forward is measured in a fresh subprocess per method
(:func:`medattn.bench.common.run_isolated` of :func:`probe_memory`: peak RSS over the input's own size, N
ascending). Results: ``binary_scores`` and ``binary_attention`` CSV/JSON (and a PNG when matplotlib is installed)
and ``binary_layer`` in ``--out``.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F

from medattn.attention.binary.bits import binary_attention
from medattn.attention.binary.packing import binary_dot, pack_signs, smallest_exact_int
from medattn.bench.common import (
    add_overwrite,
    cpu_bf16_support,
    environment,
    interleaved_medians,
    median_time,
    peak_rss_bytes,
    results_folder,
    run_isolated,
    write_results,
)
from medattn.errors import UserError
from medattn.outputs import OutputFolder
from medattn.threads import set_threads

ATTENTION_METHODS = ("fp32-sdpa", "bf16-sdpa", "bits-sg", "bits-hamming")
#: Layers timed by the ``layer`` part: name -> (registered mechanism, value width per head or None = d).
LAYERS = {"softmax": ("softmax", None), "binary-hamming": ("binary-hamming", None),
          "binary-sg": ("binary-sg", None), "binary-hamming/v16": ("binary-hamming", 16)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384], help="sequence lengths N")
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 256], help="head dims d")
    parser.add_argument("--value-dim", type=int, default=None, help="value width D_v (default: d)")
    parser.add_argument("--heads", type=int, default=8, help="heads in the attention and layer parts")
    parser.add_argument("--block", type=int, default=2048, help="query rows per block in the scores benchmark")
    parser.add_argument("--tile-size", type=int, default=1024, help="keys per probability tile of the bit kernel")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per case (the median is kept)")
    parser.add_argument("--budget-s", type=float, default=20.0, help="stop repeating a case after this long")
    parser.add_argument("--skip", nargs="*", default=[], choices=["scores", "attention", "layer", "memory", "bf16"],
                        help="parts to leave out")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch and bit-kernel threads, also in the memory probes (default: the free cores, or "
                             "OMP_NUM_THREADS)")
    parser.add_argument("--out", default="reports/bench-binary", help="output directory")
    add_overwrite(parser)


def _check(args) -> None:
    if any(n <= 0 for n in args.sizes) or any(d <= 0 for d in args.dims):
        raise UserError("--sizes and --dims must be positive")
    if args.block <= 0 or args.tile_size <= 0 or args.repeats <= 0 or args.heads <= 0:
        raise UserError("--block, --tile-size, --repeats and --heads must be positive")
    if args.value_dim is not None and args.value_dim <= 0:
        raise UserError("--value-dim must be positive")


def _time(fn, args) -> float:
    return median_time(fn, repeats=args.repeats, warmup=1, budget_s=args.budget_s)


def bench_scores(n: int, d: int, args) -> list[dict]:
    """Time the N x N scores in query blocks for fp32, bf16 and bits; one row per method."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)
    block = min(args.block, n)

    def blocks(a, b, out):
        for i in range(0, n, block):
            torch.matmul(a[i : i + block], b.T, out=out[: min(block, n - i)])

    out32 = torch.empty(block, n)
    fns = {"fp32-matmul": lambda: blocks(q, k, out32)}
    if "bf16" not in args.skip:
        qb, kb, outb = q.bfloat16(), k.bfloat16(), torch.empty(block, n, dtype=torch.bfloat16)
        fns["bf16-matmul"] = lambda: blocks(qb, kb, outb)
    pack_s = _time(lambda: (pack_signs(q), pack_signs(k)), args)
    qp, kp = pack_signs(q)[None], pack_signs(k)[None]  # (1, N, W): packed once
    outi = np.empty((1, block, n), dtype=smallest_exact_int(d))

    def bit_blocks():
        for i in range(0, n, block):
            m = min(block, n - i)
            binary_dot(qp[:, i : i + m], kp, d, out=outi[:, :m])

    fns["bits-popcount"] = bit_blocks
    times = interleaved_medians(fns, args.repeats, args.budget_s)
    fp32 = times["fp32-matmul"]
    return [dict(N=n, d=d, method=m, seconds=t, pack_seconds=pack_s if m.startswith("bits") else 0.0,
                 gmacs_per_s=n * n * d / t / 1e9, scores_per_ns=n * n / t / 1e9, speedup_vs_fp32=fp32 / t)
            for m, t in times.items()]


def _attention_inputs(n: int, d: int, dv: int, heads: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, w, generator=g) for w in (d, d, dv))
    w = torch.rand(1, heads, n, generator=g) + 0.5
    return q.to(dtype), k.to(dtype), v.to(dtype), w


def run_attention(method: str, n: int, d: int, dv: int, tile: int, heads: int = 1):
    """A zero-argument callable doing one whole-attention forward of ``method`` (1 batch, ``heads`` heads)."""
    dtype = torch.bfloat16 if method == "bf16-sdpa" else torch.float32
    q, k, v, w = _attention_inputs(n, d, dv, heads, dtype)
    if method.endswith("sdpa"):
        return lambda: F.scaled_dot_product_attention(q, k, v)
    weights = (w, w) if method == "bits-hamming" else (None, None)
    return lambda: binary_attention([(q, weights[0])], [(k, weights[1])], v, d**-0.5, None, tile)


def bench_attention(n: int, d: int, args) -> list[dict]:
    dv = args.value_dim or d
    methods = [m for m in ATTENTION_METHODS if not (m.startswith("bf16") and "bf16" in args.skip)]
    times = interleaved_medians({m: run_attention(m, n, d, dv, args.tile_size, args.heads) for m in methods},
                                args.repeats, args.budget_s)
    return [dict(N=n, d=d, heads=args.heads, value_dim=dv, method=m, seconds=t, speedup_vs_fp32=times["fp32-sdpa"] / t)
            for m, t in times.items()]


def run_layer(name: str, n: int, d: int, heads: int, tile: int):
    """A zero-argument callable doing one eval forward of the layer ``name`` of :data:`LAYERS` on (1, N, heads d)."""
    from medattn.attention import build_attention

    mechanism, value_dim = LAYERS[name]
    options = {} if mechanism == "softmax" else {"tile_size": tile, "value_dim": value_dim}
    layer = build_attention(mechanism, dim=heads * d, num_heads=heads, **options).eval()
    x = torch.randn(1, n, heads * d, generator=torch.Generator().manual_seed(0))

    def forward():
        with torch.no_grad():
            return layer(x)

    return forward


def bench_layer(n: int, d: int, args) -> list[dict]:
    times = interleaved_medians({m: run_layer(m, n, d, args.heads, args.tile_size) for m in LAYERS}, args.repeats,
                                args.budget_s)
    return [dict(N=n, d=d, heads=args.heads, dim=args.heads * d, value_dim=LAYERS[m][1] or d, method=m, seconds=t,
                 speedup_vs_softmax=times["softmax"] / t) for m, t in times.items()]


def probe_memory(method: str, sizes: list[int], d: int, dv: int, tile: int, heads: int = 1) -> dict[str, int]:
    """{N: peak RSS growth in bytes} of one forward per N (N ascending), for a fresh process."""
    run_attention(method, 64, d, dv, tile, heads)()  # compile and load everything first
    result = {}
    for n in sorted(sizes):
        fn = run_attention(method, n, d, dv, tile, heads)
        base = peak_rss_bytes()
        fn()
        result[str(n)] = max(peak_rss_bytes() - base, 0)
    return result


def bench_memory(d: int, args) -> dict[tuple[str, int], int]:
    dv = args.value_dim or d
    threads = {"OMP_NUM_THREADS": str(torch.get_num_threads())}  # this run's count, not the probe's
    peaks = {}
    for method in ("fp32-sdpa", "bits-sg"):
        kwargs = {"method": method, "sizes": list(args.sizes), "d": d, "dv": dv, "tile": args.tile_size,
                  "heads": args.heads}
        for n, b in run_isolated(probe_memory, kwargs, env=threads, check=True).items():
            peaks[(method, int(n))] = b
    return peaks


def _plot(scores: list[dict], attention: list[dict], out: OutputFolder) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, rows, title in ((axes[0], scores, "Q K^T scores"), (axes[1], attention, "attention forward")):
        for key in sorted({(r["method"], r["d"]) for r in rows}):
            pts = sorted((r["N"], r["seconds"]) for r in rows if (r["method"], r["d"]) == key)
            ax.loglog(*zip(*pts), marker="o", label=f"{key[0]} d={key[1]}")
        ax.set(xlabel="N", ylabel="seconds (median)", title=title)
        if rows:
            ax.legend(fontsize=7)
    fig.tight_layout()
    out.save_figure("binary.png", fig, dpi=120)
    plt.close(fig)


def run(args) -> int:
    _check(args)
    out = results_folder(args.out, ["binary_scores", "binary_attention", "binary_layer"], args.overwrite,
                         ("binary.png",))
    set_threads(args.threads)
    no_bf16 = cpu_bf16_support().unsupported_reason()
    if no_bf16 and "bf16" not in args.skip:
        print(no_bf16, flush=True)
        args.skip = [*args.skip, "bf16"]
    env = environment("fp32/bf16/int1")
    scores, attention, layers = [], [], []
    for d in args.dims:
        peaks = {} if "memory" in args.skip or "attention" in args.skip else bench_memory(d, args)
        for n in args.sizes:
            if "scores" not in args.skip:
                rows = bench_scores(n, d, args)
                scores += rows
                print(*(f"{r['method']}: {r['seconds']:.4f}s" for r in rows), sep="  ", flush=True)
            if "attention" not in args.skip:
                rows = bench_attention(n, d, args)
                for r in rows:
                    if (r["method"], n) in peaks:
                        r["peak_rss_growth_mb"] = peaks[(r["method"], n)] / 2**20
                attention += rows
                print(*(f"{r['method']}: {r['seconds']:.4f}s" for r in rows), sep="  ", flush=True)
            if "layer" not in args.skip:
                rows = bench_layer(n, d, args)
                layers += rows
                print(*(f"{r['method']} layer: {r['seconds']:.4f}s ({r['speedup_vs_softmax']:.2f}x)" for r in rows),
                      sep="  ", flush=True)
            print(f"done N={n} d={d}", flush=True)
    for stem, rows in (("binary_scores", scores), ("binary_attention", attention), ("binary_layer", layers)):
        if rows:
            print(*write_results(rows, out, stem, env), sep="\n")
    _plot(scores, attention, out)
    return 0
