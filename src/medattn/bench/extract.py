"""Tile-encoder throughput on this machine: tiles per second per encoder and precision, against its matmul rate.

For each encoder (random weights in the publisher's architecture, its card in
:data:`~medattn.slides.encoders.ENCODERS`; nothing is read or downloaded) and precision, batches of ``--batch-size``
224 x 224 tiles run through the encoder as ``medattn wsi extract`` runs them (inference mode; CNNs channels-last;
bf16 as autocast, timed only where the CPU multiplies bf16 in hardware,
:func:`~medattn.bench.common.cpu_bf16_support`; int8 as the dynamic quantisation of the ViTs' Linear layers that
``wsi extract --precision int8`` runs, compared with fp32's matmul rate). Timed in rounds, one batch of every
configuration and one matmul of every precision per round (:func:`~medattn.bench.roofline.matmul_probe`, a probe of
:func:`~medattn.bench.common.interleaved_rounds`), so the rate each encoder is compared with was measured beside it;
medians over the rounds.

Reported per row: ``tiles_per_s``, the FLOPs one tile costs (counted by PyTorch's ``FlopCounterMode``),
``fraction_of_matmul`` = achieved FLOP/s over the interleaved matmul rate (1.0: the encoder runs at the speed
of one large matrix product), ``hours_per_15k``: the hours a 15,000-tile slide (a 20x slide) takes, and
``min_cosine_to_fp32``: the smallest cosine similarity between a tile's features and fp32's (random weights: a
check of the arithmetic, not of a trained encoder's features).
Writes ``extract.csv`` and ``extract.json`` with the machine, threads and versions.

    medattn bench extract --encoders vit-b16,uni --precisions fp32 --rounds 3 --out reports/bench-extract
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.flop_counter import FlopCounterMode

from medattn.errors import UserError
from medattn.slides.encoders import ENCODERS
from medattn.slides.extractors import PRECISIONS, with_precision
from medattn.threads import set_threads

from .common import (
    add_overwrite,
    comma_list,
    cpu_bf16_support,
    environment,
    interleaved_rounds,
    results_folder,
    write_results,
)
from .roofline import matmul_probe

#: The encoders timed: every card whose whole architecture is known (a ViT card that leaves its shape open is not).
ARCHITECTURES = [name for name, card in ENCODERS.items() if card.buildable]
SLIDE_TILES = 15_000


def build(name: str) -> torch.nn.Module:
    """``name``'s encoder with random weights, in eval mode, as its card builds it (pooled as its publisher pools;
    convolutions channels-last)."""
    return ENCODERS[name].build()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--encoders", type=comma_list, default=["vit-b16", "uni", "resnet50"],
                        help=f"comma-separated, of {', '.join(ARCHITECTURES)} (default vit-b16,uni,resnet50)")
    parser.add_argument("--precisions", type=comma_list, default=["fp32", "bf16", "int8"],
                        help="fp32, bf16 (autocast), int8 (dynamic quantisation of the ViTs' Linear layers; matmul "
                             "rate: fp32's); default all")
    parser.add_argument("--batch-size", type=int, default=8, help="224 x 224 tiles per forward pass")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (one batch of each configuration)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the free cores)")
    parser.add_argument("--out", default="reports/bench-extract", help="output directory")
    add_overwrite(parser)


def run(args: argparse.Namespace) -> int:
    unknown = [e for e in args.encoders if e not in ARCHITECTURES]
    if unknown or any(p not in PRECISIONS for p in args.precisions) or args.batch_size < 1 or args.rounds < 1:
        raise UserError(f"--encoders of {', '.join(ARCHITECTURES)}; --precisions of fp32, bf16, int8; --batch-size and "
                        f"--rounds >= 1 (got encoders {args.encoders}, precisions {args.precisions})")
    out = results_folder(args.out, ["extract"], args.overwrite)
    set_threads(args.threads)
    precisions = list(args.precisions)
    reason = cpu_bf16_support().unsupported_reason()
    if reason and "bf16" in precisions:
        print(reason, flush=True)
        precisions.remove("bf16")
    tiles = torch.randn(args.batch_size, 3, 224, 224).contiguous(memory_format=torch.channels_last)
    configurations = []
    for name in args.encoders:
        model = build(name)
        with torch.inference_mode(), FlopCounterMode(display=False) as counter:
            model(tiles[:1])
        with torch.inference_mode():
            reference = model(tiles)
        for precision in precisions:
            if precision == "int8" and "int8" not in ENCODERS[name].precisions:
                print(f"{name}: int8 quantises Linear layers, and a ResNet's work is convolutions: not timed")
                continue
            forward = with_precision(model, precision, name)

            def batch(forward=forward) -> torch.Tensor:
                with torch.inference_mode():
                    return forward(tiles)

            cosine = torch.nn.functional.cosine_similarity(batch().float(), reference).min().item()  # + warm-up
            configurations.append({"encoder": name, "precision": precision, "batch": batch, "cosine": cosine,
                                   "gflop_per_tile": counter.get_total_flops() / 1e9})
    probes = {precision: matmul_probe("fp32" if precision == "int8" else precision, target_s=0.1)
              for precision in precisions}
    rounds = interleaved_rounds({index: configuration["batch"] for index, configuration in enumerate(configurations)},
                                args.rounds, warmup=0, probes=probes)
    seconds, rates = rounds.medians(), rounds.value_medians()
    rows = []
    for index, configuration in enumerate(configurations):
        tiles_per_s = args.batch_size / seconds[index]
        rate = rates[configuration["precision"]]
        rows.append({"encoder": configuration["encoder"], "precision": configuration["precision"],
                     "batch_size": args.batch_size, "tiles_per_s": tiles_per_s,
                     "gflop_per_tile": configuration["gflop_per_tile"], "matmul_gflops": rate,
                     "fraction_of_matmul": tiles_per_s * configuration["gflop_per_tile"] / rate,
                     "hours_per_15k": SLIDE_TILES / tiles_per_s / 3600,
                     "min_cosine_to_fp32": configuration["cosine"]})
        print(f"{configuration['encoder']:>14} {configuration['precision']}: {tiles_per_s:7.2f} tiles/s, "
              f"{configuration['gflop_per_tile']:6.1f} GFLOP/tile, {rows[-1]['fraction_of_matmul']:.2f} of the "
              f"matmul rate ({rate:.0f} GFLOP/s), {rows[-1]['hours_per_15k']:.2f} h per 15,000 tiles, cosine to fp32 "
              f">= {configuration['cosine']:.4f}", flush=True)
    csv_path, json_path = write_results(rows, out, "extract", environment("/".join(precisions)))
    print(f"wrote {csv_path} and {json_path}")
    return 0
