"""One attention layer and its core, forward and forward+backward, against this machine's roofline.

For each mechanism (every registered one by default, plus installed peers) and sequence length N,
batch 1, ``heads`` heads of ``head_dim``: the median time of the attention *core* (q, k, v given:
``Attention.attend``) and of the full *layer* (``qkv`` and ``proj`` included), forward and
forward+backward, the roofline time of that work (:mod:`medattn.bench.roofline`: FLOPs / measured
matmul rate + compulsory bytes / measured bandwidth), the fraction of roofline reached
(roofline / measured) and the peak memory.

Memory: each (mechanism, N, part) runs in a fresh Python process (``--no-isolate`` runs them in this
one). It records its RSS after imports, builds the module and inputs, then for each pass resets the
peak RSS (Linux ``/proc/self/clear_refs``), runs warmup and timed calls, and reports peak RSS minus
that post-import RSS: module, inputs and everything the pass allocated. Forward+backward runs after
forward in the same process. On CUDA it reports ``torch.cuda.max_memory_allocated`` instead.

Budgets: a configuration is skipped (and recorded as such) when a smaller N of the same mechanism and
part took longer than ``--time-budget`` seconds per call, when a power-law extrapolation from the
two largest smaller N (exponent at least 1; 2 from a single point) predicts that it would, or when the
memory extrapolated likewise (exponent at least 0; none from a single point) exceeds
``--memory-budget-gb``. A running process is killed past the memory budget plus 1 GiB for the
interpreter (the extrapolation underestimates where small N are dominated by fixed overhead) or past a
wall timeout; both are recorded as skipped.

Triton: on CUDA, where ``triton`` is installed, the mechanisms with Triton kernels (:data:`TRITON_MECHANISMS`,
:mod:`medattn.attention.triton_seqnorm` and :mod:`medattn.attention.triton_bits`) are measured twice, their rows
told apart by ``implementation``: ``torch`` (the kernels switched off,
:func:`~medattn.attention.triton_support.kernels_off`) and ``triton``; the table then has a ``kernels`` column.
Elsewhere rows carry no ``implementation``.

    medattn bench attention --mechanisms softmax,seqnorm --seq-lens 196,1024,4096 --out reports/bench-attention
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from contextlib import nullcontext

import torch

from medattn.attention import available_attentions, build_attention, get_attention_class, triton_support
from medattn.errors import UserError
from medattn.text import format_table

from .common import (
    add_device_options,
    add_overwrite,
    comma_list,
    current_rss_bytes,
    default_device,
    environment,
    median_time,
    peak_memory_bytes,
    reset_peak_memory,
    results_folder,
    row_environment,
    run_device,
    run_in_process,
    run_isolated,
    skip_reason,
    write_results,
)
from .roofline import DTYPES, MachineRates, attention_cost, measure_rates

DEFAULT_SEQ_LENS = (196, 1024, 4096, 16384, 65536)
PARTS = ("core", "layer")
PASSES = ("fwd", "fwd+bwd")
#: Peer implementations measured when installed: name -> the module to import (see _build_peer).
PEERS = {
    "peer:linear-attention-transformer": "linear_attention_transformer",
    "peer:nystrom-attention": "nystrom_attention",
    "peer:performer-pytorch": "performer_pytorch",
}
#: Memory a benchmark process may use beyond the budget before it is killed (interpreter, torch).
RUNTIME_ALLOWANCE_BYTES = 2**30
#: Mechanisms whose CUDA path runs Triton kernels where ``triton`` is installed (module docstring).
TRITON_MECHANISMS = ("seqnorm", "binary-ste", "binary-sg", "binary-hamming", "binary-bernoulli")


def implementations(mechanism: str, device: str) -> list[str | None]:
    """The implementations to measure of ``mechanism`` on ``device``: ``torch`` and ``triton`` where it has Triton
    kernels and they can run (CUDA, ``triton`` installed), else one unnamed (None)."""
    if device == "cuda" and mechanism in TRITON_MECHANISMS and triton_support.available():
        return ["torch", "triton"]
    return [None]


def installed_peers() -> list[str]:
    """Names of the peers in :data:`PEERS` whose package can be imported."""
    return [name for name, module in PEERS.items() if importlib.util.find_spec(module) is not None]


def _build_peer(name: str, dim: int, heads: int, head_dim: int) -> torch.nn.Module:
    """A peer's self-attention layer on (B, N, dim), configured like ours (no causal mask, no dropout)."""
    if name == "peer:linear-attention-transformer":
        from linear_attention_transformer.linear_attention_transformer import SelfAttention
        return SelfAttention(dim, heads, causal=False, dim_head=head_dim)
    if name == "peer:nystrom-attention":
        from nystrom_attention import NystromAttention
        return NystromAttention(dim=dim, dim_head=head_dim, heads=heads)
    from performer_pytorch import SelfAttention
    return SelfAttention(dim=dim, heads=heads, dim_head=head_dim, causal=False)


def measure_one(mechanism: str, seq_len: int, part: str, heads: int = 8, head_dim: int = 64, dim: int = 512,
                precision: str = "fp32", passes: tuple[str, ...] = PASSES, repeats: int = 5, warmup: int = 1,
                budget_s: float | None = None, device: str = "cpu", seed: int = 0,
                threads: int | None = None, implementation: str | None = None) -> dict:
    """Time and peak memory of one (mechanism, N, part) for each pass; run in a fresh process.
    ``implementation`` ``torch`` switches the Triton kernels off (:func:`implementations`).

    Returns ``{"results": {pass: {"median_s", "peak_mem_bytes"}}, "memory_method": str}``.
    """
    if threads:
        torch.set_num_threads(threads)
    baseline = current_rss_bytes() if device == "cpu" else 0
    torch.manual_seed(seed)
    dtype = DTYPES[precision]
    autocast = torch.autocast(device, dtype=dtype) if precision != "fp32" else nullcontext()
    if mechanism in PEERS:
        module = _build_peer(mechanism, dim, heads, head_dim).to(device)
    else:
        module = build_attention(mechanism, dim, num_heads=heads, inner_dim=heads * head_dim).to(device)
    if part == "core":
        inputs = [torch.randn(1, heads, seq_len, head_dim, device=device, dtype=dtype) for _ in range(3)]

        def forward():
            with autocast:
                return module.attend(*inputs, None)
    else:
        inputs = [torch.randn(1, seq_len, dim, device=device)]

        def forward():
            with autocast:
                return module(inputs[0])

    def forward_backward():
        for tensor in [*inputs, *module.parameters()]:
            tensor.grad = None
        forward().float().sum().backward()

    results = {}
    with triton_support.kernels_off() if implementation == "torch" else nullcontext():
        for pass_name in passes:
            for tensor in inputs:
                tensor.requires_grad_(pass_name == "fwd+bwd")
            fn = forward_backward if pass_name == "fwd+bwd" else forward
            reset_peak_memory(device)
            with torch.no_grad() if pass_name == "fwd" else nullcontext():
                seconds = median_time(fn, repeats=repeats, warmup=warmup, budget_s=budget_s)
            results[pass_name] = {"median_s": seconds, "peak_mem_bytes": peak_memory_bytes(device, baseline)}
    method = ("torch.cuda.max_memory_allocated" if device == "cuda"
              else "peak RSS minus RSS after imports, peak reset before each pass")
    return {"results": results, "memory_method": method}


def run_attention_bench(mechanisms: list[str] | None = None, seq_lens=DEFAULT_SEQ_LENS, heads: int = 8,
                        head_dim: int = 64, dim: int = 512, precision: str = "fp32", parts=PARTS, passes=PASSES,
                        repeats: int = 5, warmup: int = 1, budget_s: float = 30.0, memory_budget_gb: float = 8.0,
                        include_peers: bool = True, device: str | None = None, rates: MachineRates | None = None,
                        isolate: bool = True, threads: int | None = None, verbose: bool = False) -> list[dict]:
    """Benchmark attention cores and layers; one row per (mechanism, N, part, pass), see the module doc.

    ``mechanisms`` defaults to every registered mechanism (plus installed peers with ``include_peers``);
    names are registry names or keys of :data:`PEERS`. Peers absent from this environment, and peer
    cores (peers expose no separate core), are recorded as skipped rows. ``rates`` defaults to
    :func:`medattn.bench.roofline.measure_rates` run now. Rows carry the environment's machine,
    threads, allocator and torch version; ``precision`` is ``fp32`` or ``bf16`` (bf16 autocast).
    """
    mechanisms = _check_mechanisms(mechanisms, include_peers)
    seq_lens = sorted(_check_positive(seq_lens, "seq_lens"))
    _check_choice(precision, DTYPES, "precision")
    for values, allowed, name in ((parts, PARTS, "parts"), (passes, PASSES, "passes")):
        for value in values:
            _check_choice(value, allowed, name)
    if repeats < 1 or budget_s <= 0 or memory_budget_gb <= 0:
        raise UserError("repeats, the time budget and the memory budget must be positive")
    device = device or default_device()
    if threads:
        torch.set_num_threads(threads)
    env = environment(precision, str(device))
    env_fields = row_environment(env)
    rates = rates or measure_rates(device=device)
    memory_budget = memory_budget_gb * 2**30
    rows = []
    for mechanism in mechanisms:
        if mechanism in PEERS and importlib.util.find_spec(PEERS[mechanism]) is None:
            rows.append({"mechanism": mechanism, "precision": precision,
                         "status": f"skipped: {PEERS[mechanism]} not installed", **env_fields})
            continue
        for part, implementation in ((p, i) for p in parts for i in implementations(mechanism, device)):
            if mechanism in PEERS and part == "core":
                rows.append({"mechanism": mechanism, "part": part, "precision": precision,
                             "status": "skipped: peer exposes no separate core", **env_fields})
                continue
            named = {} if implementation is None else {"implementation": implementation}
            times: list[tuple[float, float]] = []
            memories: list[tuple[float, float]] = []
            for n in seq_lens:
                base = dict(mechanism=mechanism, **named, part=part, n=n, heads=heads, head_dim=head_dim, dim=dim,
                            precision=precision)
                status = skip_reason(n, times, budget_s, memories, memory_budget)
                if status is None:
                    kwargs = dict(mechanism=mechanism, seq_len=n, part=part, heads=heads, head_dim=head_dim,
                                  dim=dim, precision=precision, passes=tuple(passes), repeats=repeats,
                                  warmup=warmup, budget_s=budget_s, device=device, threads=threads, **named)
                    started = time.perf_counter()
                    if isolate:
                        timeout = (warmup + 2) * budget_s * len(passes) * 4 + 120
                        measured = run_isolated("medattn.bench.attention:measure_one", kwargs, timeout,
                                                memory_budget + RUNTIME_ALLOWANCE_BYTES)
                    else:
                        measured = run_in_process(measure_one, kwargs)
                    if verbose:
                        label = " ".join([mechanism, *named.values(), part])
                        print(f"  {label} N={n}: {time.perf_counter() - started:.1f} s wall", flush=True)
                    status = measured.get("status")
                if status is not None:
                    rows.extend({**base, "pass": p, "status": status, **env_fields} for p in passes)
                    continue
                for pass_name in passes:
                    result = measured["results"][pass_name]
                    rows.append(_row(base, pass_name, result, measured["memory_method"], rates, env_fields))
                slowest = max(measured["results"][p]["median_s"] for p in passes)
                largest = max(measured["results"][p]["peak_mem_bytes"] for p in passes)
                times.append((n, slowest))
                memories.append((n, largest))
    return rows


def _row(base: dict, pass_name: str, result: dict, memory_method: str, rates: MachineRates, env_fields) -> dict:
    backward = pass_name == "fwd+bwd"
    cost = None
    if base["mechanism"] not in PEERS:
        cost = attention_cost(base["mechanism"], base["n"], base["heads"], base["head_dim"], base["dim"],
                              backward=backward, layer=base["part"] == "layer", precision=base["precision"])
    roofline = rates.time_s(cost, base["precision"]) if cost is not None else None
    median = result["median_s"]
    return {
        **base, "pass": pass_name, "status": "ok", "median_s": median,
        "roofline_s": roofline, "roofline_fraction": roofline / median if roofline is not None else None,
        "gflop": cost.flops / 1e9 if cost is not None else None,
        "mbytes": cost.bytes / 1e6 if cost is not None else None,
        "peak_mem_mb": result["peak_mem_bytes"] / 2**20, "memory_method": memory_method, **env_fields,
    }


def _check_mechanisms(mechanisms, include_peers: bool) -> list[str]:
    if mechanisms is None:
        return available_attentions() + (list(PEERS) if include_peers else [])
    if not mechanisms:
        raise UserError("no mechanism given")
    for name in mechanisms:
        if name not in PEERS:
            try:
                get_attention_class(name)
            except ValueError as error:  # an unknown name: the message lists the valid ones
                raise UserError(str(error)) from None
    return list(mechanisms)


def _check_positive(values, name: str) -> list[int]:
    values = [int(v) for v in values]
    if not values or any(v <= 0 for v in values):
        raise UserError(f"{name} must be a non-empty list of positive integers, got {values}")
    return values


def _check_choice(value: str, allowed, name: str) -> None:
    if value not in allowed:
        raise UserError(f"{name}: {value!r} is not one of {', '.join(allowed)}")


TABLE = [("mechanism", "mechanism", ""), ("part", "part", ""), ("n", "N", ""), ("pass", "pass", ""),
         ("median_s", "median s", ".4f"), ("roofline_s", "roofline s", ".4f"),
         ("roofline_fraction", "of roofline", ".2f"), ("peak_mem_mb", "peak MiB", ".0f"), ("status", "status", "")]


def table_columns(rows: list[dict]) -> list[tuple[str, str, str]]:
    """:data:`TABLE`, with a ``kernels`` column (torch or triton) after the mechanism where rows name one."""
    if not any("implementation" in row for row in rows):
        return TABLE
    return [TABLE[0], ("implementation", "kernels", ""), *TABLE[1:]]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mechanisms", type=comma_list, default=None,
                        help="comma-separated registry names or peer:... names (default: all registered + peers)")
    parser.add_argument("--no-peers", action="store_true", help="leave out the peer implementations")
    parser.add_argument("--seq-lens", type=comma_list, default=[str(n) for n in DEFAULT_SEQ_LENS],
                        help="comma-separated sequence lengths N (default: %(default)s)")
    parser.add_argument("--heads", type=int, default=8, help="attention heads")
    parser.add_argument("--head-dim", type=int, default=64, help="width of each head")
    parser.add_argument("--dim", type=int, default=512, help="layer input/output width (default: 512)")
    parser.add_argument("--precision", choices=sorted(DTYPES), default="fp32", help="dtype of module and inputs")
    parser.add_argument("--parts", type=comma_list, default=list(PARTS), help="core, layer or both")
    parser.add_argument("--passes", type=comma_list, default=list(PASSES), help="fwd, fwd+bwd or both")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per configuration (the median is kept)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls before the timed ones")
    parser.add_argument("--time-budget", type=float, default=30.0, help="seconds per call before larger N are skipped")
    parser.add_argument("--memory-budget-gb", type=float, default=8.0,
                        help="GiB of peak memory before larger N are skipped")
    add_device_options(parser)
    parser.add_argument("--out", default="reports/bench-attention", help="output folder (default: %(default)s)")
    add_overwrite(parser)


def run(args: argparse.Namespace) -> int:
    device = run_device(args)
    _check_mechanisms(args.mechanisms, not args.no_peers)  # before measuring
    out = results_folder(args.out, ["attention"], args.overwrite)
    rates = measure_rates(device=device)
    print(f"matmul GFLOP/s: {rates.matmul_gflops}; bandwidth {rates.bandwidth_gbs:.1f} GB/s", flush=True)
    rows = run_attention_bench(
        args.mechanisms, _check_positive(args.seq_lens, "--seq-lens"), args.heads, args.head_dim, args.dim,
        args.precision, tuple(args.parts), tuple(args.passes), args.repeats, args.warmup, args.time_budget,
        args.memory_budget_gb, not args.no_peers, device, rates, not args.no_isolate, args.threads, verbose=True,
    )
    env = {**environment(args.precision, device), "rates": rates.as_dict()}
    csv_path, json_path = write_results(rows, out, "attention", env)
    print(format_table(rows, table_columns(rows)))
    print(f"wrote {csv_path} and {json_path}")
    return 0
