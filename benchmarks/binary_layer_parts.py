"""Where a binary-hamming layer's inference time goes, part by part, in one process.

Usage:  python benchmarks/binary_layer_parts.py [--tokens 4096] [--threads 2] [--rounds 9]

An eval binary-hamming layer (8 heads of 64, dim 512, batch 1) on SYNTHETIC input. Every part is timed in
rounds (one call of each per round; medians), on the tensors the layer hands it: the QKV projection, the
token-weight features built in PyTorch (sign, modified tanh, ``cat``) and by the Numba pass the layer uses
(``token_weight.token_features``, q and k), the whole token weights of q and k, packing q and k, the whole
bit-kernel attention (``binary_attention``) and the output projection, beside the whole layer. Prints one line
per part (milliseconds); the layer against fp32 SDPA is ``medattn bench binary``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from medattn.attention import build_attention
from medattn.attention.binary.bits import binary_attention
from medattn.attention.binary.packing import pack_signs
from medattn.attention.binary.sign import modified_tanh, sign
from medattn.attention.binary.token_weight import token_features
from medattn.threads import set_threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    set_threads(args.threads)
    torch.manual_seed(0)
    layer = build_attention("binary-hamming", dim=512, num_heads=8).eval()
    x = torch.randn(1, args.tokens, 512)
    with torch.no_grad():
        q, k, v = layer.split_heads(layer.qkv(x))  # (1, 8, N, 64) views of the projection, as the layer has them
        q_terms, k_terms = layer.kernel_terms(q, k)
        heads = layer.attend(q, k, v, None).transpose(1, 2).reshape(1, args.tokens, -1)
        parts = {
            "whole layer": lambda: layer(x),
            "QKV projection": lambda: layer.qkv(x),
            "features q, k in PyTorch": lambda: [torch.cat([modified_tanh(t), sign(t)], -1) for t in (q, k)],
            "features q, k by Numba": lambda: [token_features(t, layer.q_weight.beta) for t in (q, k)],
            "token weights q, k": lambda: (layer.q_weight(q), layer.k_weight(k)),
            "packing q, k": lambda: (pack_signs(q), pack_signs(k)),
            "bit-kernel attention": lambda: binary_attention(q_terms, k_terms, v, 64**-0.5, None, layer.tile_size),
            "output projection": lambda: layer.proj(heads),
        }
        for part in parts.values():
            part()  # compile and warm up
        times = {name: [] for name in parts}
        for _ in range(args.rounds):
            for name, part in parts.items():
                started = time.perf_counter()
                part()
                times[name].append(time.perf_counter() - started)
    print(f"binary-hamming layer, N = {args.tokens}, 8 heads of 64, {args.threads} threads, {args.rounds} rounds")
    for name, values in times.items():
        print(f"{name:>26}: {statistics.median(values) * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
