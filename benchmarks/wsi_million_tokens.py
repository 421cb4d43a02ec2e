"""Streaming seqnorm inference over one synthetic bag of 1,000,000 patch features (F = 2048).

Usage:  python benchmarks/wsi_million_tokens.py [--tokens 1000000] [--chunk-size 32768] [--bf16] [--out DIR]

The bag is SYNTHETIC: deterministic Gaussian features generated chunk by chunk from a seed (a real
bag would be an h5py dataset, read the same way), so the process never holds the whole bag. The
script reports time, the process's peak RSS and, on a prefix small enough for the unchunked model,
the largest difference between streamed and unchunked logits. Results go to DIR/wsi_streaming.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from medattn.bench.common import environment, peak_rss_bytes
from medattn.models import create_model


class SyntheticBag:
    """(N, F) features made on demand: rows [a, b) come from a generator seeded with (seed, a // block)."""

    def __init__(self, num_tokens: int, feature_dim: int, seed: int = 0, block: int = 4096) -> None:
        self.shape = (num_tokens, feature_dim)
        self.seed, self.block = seed, block

    def __getitem__(self, rows: slice) -> torch.Tensor:
        start, stop, _ = rows.indices(self.shape[0])
        parts = []
        for first in range(start - start % self.block, stop, self.block):
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + first // self.block)
            block = torch.randn(min(self.block, self.shape[0] - first), self.shape[1], generator=generator)
            parts.append(block[max(start - first, 0):stop - first])
        return torch.cat(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--chunk-size", type=int, default=32_768)
    parser.add_argument("--check-tokens", type=int, default=20_000, help="prefix compared with the unchunked model")
    parser.add_argument("--bf16", action="store_true", help="projections under bf16 autocast (statistics stay fp32+)")
    parser.add_argument("--out", default="reports/bench-wsi-streaming")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = create_model("vitwsi", attention="seqnorm", num_classes=2).eval()

    small = SyntheticBag(args.check_tokens, 2048)
    with torch.no_grad():
        unchunked = model(small[0:args.check_tokens][None])
    streamed = model.forward_streaming(small, chunk_size=args.chunk_size // 4)
    difference = (streamed - unchunked).abs().max().item()
    rss_before = peak_rss_bytes()

    started = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
        logits = model.forward_streaming(SyntheticBag(args.tokens, 2048), chunk_size=args.chunk_size)
    seconds = time.perf_counter() - started
    result = {
        "tokens": args.tokens, "chunk_size": args.chunk_size, "seconds": round(seconds, 2),
        "precision": "bf16 autocast" if args.bf16 else "fp32",
        "peak_rss_gb": round(peak_rss_bytes() / 1e9, 3), "peak_rss_gb_before_streaming": round(rss_before / 1e9, 3),
        "logits": logits.tolist(), "check_tokens": args.check_tokens,
        "max_abs_difference_streamed_vs_unchunked": difference, "data": "synthetic",
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "wsi_streaming.json").write_text(json.dumps({"environment": environment(), "result": result}, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
