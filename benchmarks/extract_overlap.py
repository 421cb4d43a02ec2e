"""Reading against computing in `medattn wsi extract`: what the slide costs beside the encoder, and what reading
ahead in a thread saves.

    python benchmarks/extract_overlap.py --encoders resnet50 vit-b16 --threads 2 --rounds 3

A SYNTHETIC pyramidal TIFF slide (:mod:`medattn.generators.slides`, 0.5 um per pixel) is tiled once (tissue
mask, 112 um / 224 px patches: the input of the ViT encoders at 20x). Per encoder (random weights in the
publisher's architecture, :data:`medattn.bench.extract.ARCHITECTURES`), timed in rounds in this process:

* ``read``: the patches read, decoded, measured (white, sharpness) and batched, no encoder;
* ``encode``: the encoder on as many tiles, already in memory, as extraction keeps (white and blurry patches
  are dropped before the encoder);
* ``extract``: :func:`medattn.slides.extract.extract_slide` without DataLoader workers, reading ahead in a thread
  (``read_ahead``) and not (the reads alternate with the batches).

``overlap_saved`` = 1 - extract_read_ahead / extract_alternating; ``vs_encoder`` = extract time over the
encoder's alone (1.0: reading is hidden). Writes ``extract_overlap.json`` / ``.csv``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from medattn.bench.common import environment, write_results
from medattn.bench.extract import build
from medattn.generators.slides import write_synthetic_slide
from medattn.slides.extract import extract_slide
from medattn.slides.extractors import Extractor
from medattn.slides.reader import open_slide
from medattn.slides.settings import TileSettings
from medattn.slides.tiling import PatchDataset, loader, tissue_candidates


def measure(name: str, slide: Path, coords, geometry, settings: TileSettings, args, tmp: Path) -> dict:
    """One encoder's row: the four parts timed in rounds, their medians and ratios."""
    extractor = Extractor(name, build(name), torch.device("cpu"), imagenet=True, input_px=224)
    pixels = torch.randint(0, 256, (args.batch_size, 224, 224, 3), dtype=torch.uint8)
    tiles, _ = extract_slide(slide, tmp / f"{name}.h5", extractor, settings, batch_size=args.batch_size)  # kept

    def read() -> None:
        for _ in loader(PatchDataset(slide, coords, geometry), args.batch_size, 0):
            pass

    def encode() -> None:
        for start in range(0, tiles, args.batch_size):
            extractor(pixels[: min(args.batch_size, tiles - start)])

    def extract(ahead: bool) -> None:
        extract_slide(slide, tmp / f"{name}.h5", extractor, settings, batch_size=args.batch_size, read_ahead=ahead)

    parts = {"read": read, "encode": encode, "extract_alternating": lambda: extract(False),
             "extract_read_ahead": lambda: extract(True)}
    times = {part: [] for part in parts}
    for _ in range(args.rounds):
        for part, fn in parts.items():
            started = time.perf_counter()
            fn()
            times[part].append(time.perf_counter() - started)
    median = {part: statistics.median(values) for part, values in times.items()}
    return dict(encoder=name, candidates=len(coords), tiles=tiles, batch_size=args.batch_size, threads=args.threads,
                **{f"{part}_s": round(t, 3) for part, t in median.items()},
                read_fraction=round(median["read"] / (median["read"] + median["encode"]), 3),
                overlap_saved=round(1 - median["extract_read_ahead"] / median["extract_alternating"], 3),
                vs_encoder=round(median["extract_read_ahead"] / median["encode"], 3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encoders", nargs="+", default=["resnet50", "vit-b16"])
    parser.add_argument("--side", type=int, default=6144, help="slide side in level-0 pixels")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/issue20_overlap")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    settings = TileSettings(patch_um=112.0, patch_px=224)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        slide = write_synthetic_slide(Path(tmp) / "slide.tif", shape=(args.side, args.side), mpp=0.5).path
        _, geometry, coords, *_ = tissue_candidates(open_slide(slide), slide, settings)
        print(f"SYNTHETIC slide {args.side} x {args.side} px: {len(coords)} candidate tiles", flush=True)
        for name in args.encoders:
            rows.append(measure(name, slide, coords, geometry, settings, args, Path(tmp)))
            print(rows[-1], flush=True)
    print(*write_results(rows, args.out, "extract_overlap", environment("fp32")), sep="\n")


if __name__ == "__main__":
    main()
