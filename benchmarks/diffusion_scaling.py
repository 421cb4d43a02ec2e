"""Time and peak memory of the 3D absorbing-diffusion transformer versus token count, per mechanism.

For each mechanism and latent grid (BinaryFormer §3.2: 10 x 14 x 12 = 1,680 tokens for a 160 x 224 x 192
brain, 20 x 28 x 24 = 13,440 at twice the resolution per axis), in one run:

* ``train_step_s``: forward, backward (the absorbing loss at a random mask ratio) and an AdamW step;
* ``sample_step_s``: one reveal step of the sampler (eval, no_grad: one forward, softmax, multinomial);
* ``train_peak_mib`` / ``sample_peak_mib``: peak memory of each (CUDA: ``max_memory_allocated``; CPU:
  the peak RSS over the size after building the model and inputs).

Each (mechanism, grid, phase) runs in a fresh Python process (:func:`medattn.bench.common.run_isolated`;
``--in-process`` to skip that), so freed memory of an earlier case cannot hide a later case's peak. The
measurement is :func:`medattn.diffusion.benchmark.measure_case`. Medians over ``--repeats``; a case
predicted (power law from the smaller grids) to exceed ``--max-case-s`` is skipped and recorded as such.
Results: ``diffusion_scaling.csv`` / ``.json`` in ``--out``, each row with the machine, threads and torch
version (:mod:`medattn.bench.common`).

    # CPU (small grids, a small model: minutes on 2 cores)
    .venv/bin/python benchmarks/diffusion_scaling.py --grids 5x7x6,10x7x6,10x14x6,10x14x12 --dim 128 --depth 2
    # the paper's model on a GPU, 1,680 ... 13,440 tokens
    .venv/bin/python benchmarks/diffusion_scaling.py --grids 10x14x12,20x14x12,20x28x12,20x28x24 --device cuda
"""

from __future__ import annotations

import argparse
import math

import torch

from medattn.bench.common import (
    comma_list,
    environment,
    extrapolate,
    row_environment,
    run_in_process,
    run_isolated,
    write_results,
)
from medattn.diffusion.benchmark import measure_case
from medattn.text import format_table
from medattn.threads import set_threads

MECHANISMS = "softmax,binary-sg,binary-hamming,binary-ste,binary-bernoulli"


def _grid(text: str) -> tuple[int, int, int]:
    sizes = tuple(int(n) for n in text.lower().split("x"))
    if len(sizes) != 3 or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"a grid is HxWxD, got {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mechanisms", type=comma_list, default=comma_list(MECHANISMS))
    parser.add_argument("--grids", type=lambda t: [_grid(g) for g in comma_list(t)],
                        default=[_grid(g) for g in ("10x14x12", "20x14x12", "20x28x12", "20x28x24")],
                        help="latent grids HxWxD (default: 1,680 ... 13,440 tokens)")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=30.0, help="stop repeating a case after this long")
    parser.add_argument("--max-case-s", type=float, default=120.0, help="skip a case predicted to take longer")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--in-process", action="store_true", help="measure in this process (CPU memory then "
                        "under-reports cases after the first)")
    parser.add_argument("--out", default="reports/bench-diffusion")
    args = parser.parse_args(argv)
    threads = set_threads(args.threads)
    env = environment("fp32")
    rows = []
    for attention in args.mechanisms:
        done: list[tuple[float, float]] = []
        for grid in sorted(args.grids, key=math.prod):
            n = math.prod(grid)
            row = {"mechanism": attention, "tokens": n, "grid": "x".join(map(str, grid)), "batch": args.batch,
                   "dim": args.dim, "depth": args.depth, **row_environment(env)}
            predicted = extrapolate(done, n)
            if predicted is not None and predicted * (args.repeats + 1) > args.max_case_s:
                row["status"] = f"skipped: predicted {predicted:.1f} s per training step"
            else:
                for phase in ("train", "sample"):
                    kwargs = {"attention": attention, "grid": list(grid), "phase": phase, "dim": args.dim,
                              "depth": args.depth, "heads": args.heads, "batch": args.batch,
                              "repeats": args.repeats, "budget_s": args.budget_s, "device": args.device,
                              "threads": threads}
                    result = (run_in_process(measure_case, kwargs) if args.in_process else
                              run_isolated("medattn.diffusion.benchmark:measure_case", kwargs,
                                           timeout_s=args.max_case_s * 3))
                    row.update(result)
                row.setdefault("status", "ok")
                if "train_step_s" in row:
                    done.append((n, row["train_step_s"]))
            rows.append(row)
            print(f"{attention} N={n}: {row['status']}", flush=True)
    write_results(rows, args.out, "diffusion_scaling", env)
    print(format_table(rows, [("mechanism", "mechanism", ""), ("tokens", "N", ""), ("train_step_s", "train s", ".3f"),
                              ("sample_step_s", "sample s", ".3f"), ("train_peak_mib", "train MiB", ".0f"),
                              ("sample_peak_mib", "sample MiB", ".0f"), ("status", "status", "")]))
    return rows


if __name__ == "__main__":
    main()
