"""bf16 against fp32 features of the tile encoders, on any CPU: the arithmetic check of ``--precision bf16``.

    python benchmarks/bf16_cosine.py --encoders vit-b16 ctranspath uni --tiles 4 4 2

Random weights in each publisher's architecture (:func:`medattn.bench.extract.build`), random 224 px tiles; prints
the smallest cosine similarity between a tile's bf16-autocast features and its fp32 features. Where the CPU has no
bf16 hardware the bf16 products are emulated (slow, but the same arithmetic); ``medattn bench extract`` times bf16
only where it is native. Trained weights may give other cosines.
"""

from __future__ import annotations

import argparse

import torch

from medattn.bench.extract import ARCHITECTURES, build
from medattn.slides.extractors import with_precision


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encoders", nargs="+", default=["vit-b16", "ctranspath", "uni"],
                        choices=sorted(ARCHITECTURES))
    parser.add_argument("--tiles", nargs="+", type=int, default=[4, 4, 2], help="tiles per encoder")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    for name, tiles in zip(args.encoders, args.tiles, strict=True):
        model = build(name)
        images = torch.randn(tiles, 3, 224, 224)
        with torch.inference_mode():
            reference = model(images)
            bf16 = with_precision(model, "bf16", name)(images)
        cosine = torch.nn.functional.cosine_similarity(bf16.float(), reference).min().item()
        print(f"{name}: {tiles} tiles, smallest cosine bf16 vs fp32 {cosine:.5f}", flush=True)


if __name__ == "__main__":
    main()
