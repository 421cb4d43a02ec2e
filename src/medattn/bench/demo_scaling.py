"""The scaling section of `medattn demo` (not a bench of its own: not in ``cli.BENCHES``): why one would pick
linear attention, measured in the demo's run with the attention bench.

It lives here, not beside the demo's runs in :mod:`medattn.experiments.demo`, because ``experiments`` and ``bench``
share a floor (docs/architecture.md) and neither imports the other; the command hands this function to
:func:`medattn.experiments.demo.run_demo`.
"""

from __future__ import annotations

from medattn.outputs import OutputFolder

#: Why one would pick SeqNorm: one attention layer (dim 512, 8 heads of 64, forward + backward, batch 1) as the
#: token count grows, measured in this run (--quick: small N, numbers mean little).
SCALING = {"mechanisms": ["softmax", "seqnorm"], "seq_lens": (1024, 4096), "quick_seq_lens": (256, 512)}


def scaling_section(out: OutputFolder, quick: bool, threads: int) -> str:
    """Time and memory of one SeqNorm and one softmax attention layer as N grows (:data:`SCALING`), measured now,
    each (mechanism, N) in a fresh process for its memory; writes scaling.csv, scaling.json and scaling.png."""
    from medattn.bench.attention import run_attention_bench
    from medattn.bench.plots import attention_scaling_figure, close
    from medattn.bench.roofline import measure_rates
    from medattn.text import format_table

    seq_lens = SCALING["quick_seq_lens"] if quick else SCALING["seq_lens"]
    rows = run_attention_bench(SCALING["mechanisms"], seq_lens, parts=("layer",), passes=("fwd+bwd",), repeats=2,
                               budget_s=20.0, memory_budget_gb=4.0, include_peers=False, threads=threads,
                               rates=measure_rates(("fp32",), matmul_size=1024, bandwidth_megabytes=64, repeats=3))
    keys = ["mechanism", "n", "status", "median_s", "peak_mem_mb"]
    out.save_csv("scaling.csv", keys, [[row.get(k) for k in keys] for row in rows])
    out.save_json("scaling.json", rows, default=str)
    title = (f"one attention layer (dim 512, 8 heads), forward+backward, batch 1, {threads} thread(s)"
             + (" [--quick: small N]" if quick else ""))
    figure = attention_scaling_figure(rows, title)
    if figure is not None:
        out.save_figure("scaling.png", figure, dpi=figure.dpi)
        close(figure)
    by = {(r["mechanism"], r["n"]): r for r in rows}
    table = [{"n": n, **{f"{m}_ms": by[m, n].get("median_s", 0) * 1000 if by[m, n]["status"] == "ok" else None
                         for m in SCALING["mechanisms"]},
              **{f"{m}_mb": by[m, n].get("peak_mem_mb") if by[m, n]["status"] == "ok" else None
                 for m in SCALING["mechanisms"]}} for n in seq_lens]
    columns = [("n", "tokens N", "")] + [(f"{m}_ms", f"{m} ms", ".1f") for m in SCALING["mechanisms"]] + \
        [(f"{m}_mb", f"{m} MiB", ".0f") for m in SCALING["mechanisms"]]
    lines = ["", f"why linear attention: {title} (scaling.png, scaling.csv)", format_table(table, columns)]
    if quick:  # at a few hundred tokens the linear form's fixed costs can outweigh the N^2 work it saves
        lines.append(f"[--quick] at N = {', '.join(map(str, seq_lens))} a linear layer's fixed costs can outweigh the "
                     f"N^2 work it saves; `medattn demo` measures N = {', '.join(map(str, SCALING['seq_lens']))}")
    return "\n".join(lines)
