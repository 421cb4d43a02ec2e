"""Real-size bags on a CPU: one training step, predict and explain of a 15,000-40,000-tile slide, per bag model.

    python benchmarks/real_size_bags.py --tiles 15000 20000 40000 --models seqnorm softmax abmil --threads 2

Each (model, bag size, phase) runs in a fresh process (peak RSS above the process's size after the model and
the bag were built): ``train`` = forward, loss, backward and an AdamW step on one bag; ``predict`` = the
eval-mode forward without gradients; ``explain`` = the default explanation (:func:`medattn.explain.explain`,
gradient-weighted rollout for the ViTs, gradient x input for attention-MIL). Models: the paper's ``vitwsi``
preset (2 layers, D = 512, 8 heads) with SeqNorm or softmax attention, and gated attention-MIL (``abmil``), on
1,024-d features (UNI's width); the bag is SYNTHETIC Gaussian features, since time and memory do not depend on
the values. Medians of ``--repeats`` calls after one warm-up. Results: ``real_size_bags.json`` / ``.csv``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from medattn.bench.common import environment, peak_rss_bytes, reset_peak_rss, run_isolated, write_results

MODELS = {"seqnorm": ("vitwsi", "seqnorm"), "softmax": ("vitwsi", "softmax"), "abmil": ("abmil", None)}


def measure(model_key: str, tiles: int, phase: str, repeats: int, threads: int, feature_dim: int = 1024) -> dict:
    """One configuration in this (fresh) process -> {"seconds", "peak_mib"}."""
    from medattn.explain import explain
    from medattn.models import create_model

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    name, attention = MODELS[model_key]
    kwargs = {"attention": attention} if attention else {}
    model = create_model(name, num_classes=1, feature_dim=feature_dim, **kwargs)
    bag = torch.randn(1, tiles, feature_dim)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def call() -> None:
        if phase == "train":
            model.train()
            optimizer.zero_grad(set_to_none=True)
            F.binary_cross_entropy_with_logits(model(bag), torch.ones(1, 1)).backward()
            optimizer.step()
        elif phase == "predict":
            model.eval()
            with torch.inference_mode():
                model(bag)
        else:
            model.eval()
            explain(model, bag)

    call()  # warm-up (and the first call's allocations)
    reset_peak_rss()
    base = peak_rss_bytes()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return {"seconds": statistics.median(times), "peak_mib": max(peak_rss_bytes() - base, 0) / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiles", type=int, nargs="+", default=[15_000, 20_000, 40_000])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    parser.add_argument("--phases", nargs="+", choices=("train", "predict", "explain"),
                        default=["train", "predict", "explain"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per configuration before it is stopped")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/issue20_bags")
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parent)  # the fresh processes import this file as real_size_bags
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    rows = []
    for tiles in args.tiles:
        for model_key in args.models:
            for phase in args.phases:
                result = run_isolated("real_size_bags:measure", {"model_key": model_key, "tiles": tiles,
                                                                 "phase": phase, "repeats": args.repeats,
                                                                 "threads": args.threads}, timeout_s=args.timeout)
                rows.append({"tiles": tiles, "model": model_key, "phase": phase, **result})
                print(rows[-1], flush=True)
    write_results(rows, args.out, "real_size_bags", environment("fp32"))


if __name__ == "__main__":
    main()
