"""Absorbing-diffusion transformer: time and peak memory of a training and a sampling step versus token count.

For each mechanism and latent grid (BinaryFormer §3.2: 10 x 14 x 12 = 1,680 tokens for a 160 x 224 x 192 brain,
20 x 28 x 24 = 13,440 at twice the resolution per axis), in one run:

* ``train_step_s``: forward, backward (the absorbing loss at a random mask ratio) and an AdamW step;
* ``sample_step_s``: one reveal step of the sampler (eval, no_grad: one forward, softmax, multinomial);
* ``train_peak_mib`` / ``sample_peak_mib``: peak memory of each (CUDA: ``max_memory_allocated``; CPU: the peak RSS
  over the size after building the model and inputs).

Each (mechanism, grid, phase) is :func:`measure_case` in a fresh Python process
(:func:`medattn.bench.common.run_isolated`; ``--in-process`` to skip that): memory a process freed is reused without
raising its RSS, so a second case in the same process under-reports. Medians over ``--repeats``
(:func:`medattn.bench.common.median_time`); a case predicted (power law from the smaller grids,
:func:`medattn.bench.common.skip_reason`) to exceed ``--max-case-s`` is skipped and recorded as such. Results:
``diffusion_scaling.csv`` / ``.json`` in ``--out``, each row with the machine, threads and torch version.

    # CPU (small grids, a small model: minutes on 2 cores)
    medattn bench diffusion --grids 5x7x6,10x7x6,10x14x6,10x14x12 --dim 128 --depth 2
    # the paper's model on a GPU, 1,680 ... 13,440 tokens
    medattn bench diffusion --grids 10x14x12,20x14x12,20x28x12,20x28x24 --device cuda
"""

from __future__ import annotations

import argparse
import math

import torch

from medattn.bench.common import (
    add_overwrite,
    comma_list,
    default_device,
    environment,
    median_time,
    peak_memory_bytes,
    peak_rss_bytes,
    reset_peak_memory,
    results_folder,
    row_environment,
    run_in_process,
    run_isolated,
    skip_reason,
    write_results,
)
from medattn.diffusion.sampling import sample_tokens
from medattn.diffusion.transformer import AbsorbingTransformer, absorbing_loss
from medattn.text import format_table
from medattn.threads import set_threads

MECHANISMS = "softmax,binary-sg,binary-hamming,binary-ste,binary-bernoulli"
GRIDS = "10x14x12,20x14x12,20x28x12,20x28x24"
TABLE = [("mechanism", "mechanism", ""), ("tokens", "N", ""), ("train_step_s", "train s", ".3f"),
         ("sample_step_s", "sample s", ".3f"), ("train_peak_mib", "train MiB", ".0f"),
         ("sample_peak_mib", "sample MiB", ".0f"), ("status", "status", "")]


def measure_case(attention: str, grid: list[int], phase: str, dim: int = 384, depth: int = 8, heads: int = 8,
                 batch: int = 1, repeats: int = 3, budget_s: float = 30.0, device: str = "cpu",
                 threads: int | None = None) -> dict:
    """-> {"<phase>_step_s": median seconds, "<phase>_peak_mib": peak memory} for one mechanism and grid."""
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    dev = torch.device(device)
    model = AbsorbingTransformer(tuple(grid), 8, 64, dim=dim, depth=depth, num_heads=heads,
                                 attention=attention).to(dev)
    tokens = torch.randint(64, (batch, model.num_tokens, 8), device=dev)
    if phase == "train":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        generator = torch.Generator().manual_seed(0)

        def step():
            optimizer.zero_grad(set_to_none=True)
            absorbing_loss(model, tokens, 256, generator).backward()
            optimizer.step()
    else:
        model.eval()

        def step():
            sample_tokens(model, batch=batch, steps=1, temperature=0.8, seed=0)
    reset_peak_memory(dev.type)
    baseline = 0 if dev.type == "cuda" else peak_rss_bytes()
    seconds = median_time(step, repeats=repeats, warmup=1, budget_s=budget_s)
    return {f"{phase}_step_s": seconds, f"{phase}_peak_mib": peak_memory_bytes(dev.type, baseline) / 2**20}


def _grids(text: str) -> list[tuple[int, int, int]]:
    """``"10x14x12,20x14x12"`` -> [(10, 14, 12), (20, 14, 12)]: the argparse type of ``--grids``."""
    grids = []
    for item in comma_list(text):
        sizes = tuple(int(n) for n in item.lower().split("x"))
        if len(sizes) != 3 or min(sizes) < 1:
            raise argparse.ArgumentTypeError(f"a grid is HxWxD, got {item!r}")
        grids.append(sizes)
    return grids


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mechanisms", type=comma_list, default=comma_list(MECHANISMS),
                        help=f"comma-separated registry names (default: {MECHANISMS})")
    parser.add_argument("--grids", type=_grids, default=_grids(GRIDS),
                        help=f"latent grids HxWxD (default: {GRIDS}: 1,680 ... 13,440 tokens)")
    parser.add_argument("--dim", type=int, default=384, help="transformer width (default 384)")
    parser.add_argument("--depth", type=int, default=8, help="transformer blocks (default 8)")
    parser.add_argument("--heads", type=int, default=8, help="attention heads (default 8)")
    parser.add_argument("--batch", type=int, default=1, help="volumes per step (default 1)")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per case (the median is kept)")
    parser.add_argument("--budget-s", type=float, default=30.0, help="stop repeating a case after this long")
    parser.add_argument("--max-case-s", type=float, default=120.0, help="skip a case predicted to take longer")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the free cores)")
    parser.add_argument("--device", default=None,
                        help="where to run: cpu, cuda or cuda:N (default: cuda when available, else cpu)")
    parser.add_argument("--in-process", action="store_true",
                        help="measure in this process (CPU memory then under-reports cases after the first)")
    parser.add_argument("--out", default="reports/bench-diffusion", help="output folder (CSV + JSON)")
    add_overwrite(parser)


def scaling_rows(args: argparse.Namespace, env: dict) -> list[dict]:
    """One row per (mechanism, grid): both phases measured, or the reason they were skipped."""
    rows = []
    for attention in args.mechanisms:
        done: list[tuple[float, float]] = []
        for grid in sorted(args.grids, key=math.prod):
            n = math.prod(grid)
            row = {"mechanism": attention, "tokens": n, "grid": "x".join(map(str, grid)), "batch": args.batch,
                   "dim": args.dim, "depth": args.depth, **row_environment(env)}
            status = skip_reason(n, done, args.max_case_s / (args.repeats + 1), per=" per training step")
            if status is not None:
                row["status"] = status
            else:
                for phase in ("train", "sample"):
                    kwargs = {"attention": attention, "grid": list(grid), "phase": phase, "dim": args.dim,
                              "depth": args.depth, "heads": args.heads, "batch": args.batch,
                              "repeats": args.repeats, "budget_s": args.budget_s, "device": env["device"],
                              "threads": args.threads}
                    row.update(run_in_process(measure_case, kwargs) if args.in_process else
                               run_isolated(measure_case, kwargs, timeout_s=args.max_case_s * 3))
                row.setdefault("status", "ok")
                if "train_step_s" in row:
                    done.append((n, row["train_step_s"]))
            rows.append(row)
            print(f"{attention} N={n}: {row['status']}", flush=True)
    return rows


def run(args: argparse.Namespace) -> int:
    out = results_folder(args.out, ["diffusion_scaling"], args.overwrite)
    args.threads = set_threads(args.threads)  # each fresh process gets the same count
    env = environment("fp32", args.device or default_device())
    rows = scaling_rows(args, env)
    csv_path, json_path = write_results(rows, out, "diffusion_scaling", env)
    print(format_table(rows, TABLE))
    print(f"wrote {csv_path} and {json_path}")
    return 0
