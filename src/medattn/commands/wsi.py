"""Whole-slide images from the scanner file: medattn wsi tile | extract | synthetic.

  medattn wsi tile SLIDES... --out TILES_DIR        coordinates (CSV), metadata (JSON), grid thumbnail (PNG)
  medattn wsi extract SLIDES... --out FEATURES_DIR  <slide stem>.h5 per slide (CLAM or STAMP layout, for wsi_bags)
  medattn wsi synthetic OUT_DIR [--format F]        SYNTHETIC demo slides (tiff, dicom, ome-tiff) with tables

SLIDES are slide files or folders of them (SVS, NDPI, MRXS, tiled TIFF, ... through OpenSlide).
`extract` tiles by itself unless given --tiles, defaults to the weight-free descriptor, skips slides
already done and takes its share of the slides under torchrun (RANK, WORLD_SIZE). See docs/slides.md.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import fields
from pathlib import Path

from medattn.errors import UserError
from medattn.text import bars_off

TILE_DESCRIPTION = """Tissue mask, patch grid and quality filter per slide: medattn wsi tile SLIDES... --out DIR.

Writes per slide, named by its stem: <stem>.csv (every candidate patch: x, y its level-0 top-left corner in pixels,
tissue_fraction, white_fraction, sharpness, status kept, white or blurry), <stem>.json (slide, microns per pixel,
geometry, settings, counts; written last, it marks the slide done) and <stem>.png (the thumbnail with the grid
outlined by status, a legend with the counts and a scale bar). A slide whose tiles exist with the same settings is
skipped; with other settings it is refused (--overwrite tiles it again). `medattn wsi extract --tiles DIR` reads
these tiles. See docs/slides.md."""
EXTRACT_DESCRIPTION = """Patch features per slide: medattn wsi extract SLIDES... --out DIR [--tiles TILES_DIR].

Writes <slide stem>.h5 per slide: with --layout clam, `features` (N, F) and `coords` (N, 2; level-0 top-left
corner in pixels); with --layout stamp, `feats` and `coords` in microns. Both record the extractor, patch size
in microns and pixels, mpp and the tiling settings. Without --tiles it tiles by itself (same options and filter
as `wsi tile`). A slide already done with the same settings is skipped, one done otherwise refused (--overwrite).
Under torchrun each process takes its share of the slides (RANK, WORLD_SIZE). See docs/slides.md."""
SYNTHETIC_DESCRIPTION = """Write SYNTHETIC demo slides (not tissue): medattn wsi synthetic DIR [--count N] [--format F].

Small pyramidal slides at 1 um per pixel (stroma and nuclei blobs, one out of focus, a dust smudge; a planted
tumour region on every other slide) as tiled TIFFs (default), DICOM whole-slide images (--format dicom: per slide a
folder of one VL Whole Slide Microscopy instance per level) or OME-TIFFs (--format ome-tiff), with
slide_table.csv (PATIENT, FILENAME) and clinical_table.csv (PATIENT, TUMOUR) beside them and truth/<stem>.npz (the
ground-truth masks), as the packaged config synthetic_slides reads them after `wsi extract`. Each slide's
description (TIFF ImageDescription, OME Description, DICOM ImageComments) marks it SYNTHETIC; `wsi tile` and `wsi
extract` carry the mark into the tiles' JSON and the bags' HDF5 attribute `synthetic`. Nothing here is a statement
about real slides. See docs/slides.md."""

#: The options of the tiling settings (``slides.settings.TileSettings``): (field, type, help); the flag is the field
#: with dashes, its default the field's.
TILING_OPTIONS = (
    ("patch_um", float, "patch side in microns"),
    ("patch_px", int, "patch side after resizing"),
    ("thumbnail_px", int, "longer side of the thumbnail for the tissue mask"),
    ("min_saturation", float, "floor of the Otsu saturation threshold"),
    ("min_tissue_area_um2", float, "smaller tissue pieces are ignored"),
    ("min_tissue_fraction", float, "tissue fraction for a grid cell to be read"),
    ("white_level", int, "a pixel is white when R, G, B >= this"),
    ("max_white", float, "drop patches with more white than this fraction"),
    ("min_sharpness", float, "drop patches whose Laplacian variance is below this"),
)


def _tiling_arguments(parser: argparse.ArgumentParser) -> None:
    from medattn.slides.settings import TileSettings

    d = TileSettings()
    parser.add_argument("slides", nargs="+", type=Path, help="slide files or folders of slides")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--mpp", type=float, help="microns per level-0 pixel (overrides the slide's metadata)")
    for field, kind, text in TILING_OPTIONS:  # --patch-um sets patch_um, ...
        parser.add_argument(f"--{field.replace('_', '-')}", type=kind, default=getattr(d, field),
                            help=f"{text} (default %(default)s)")
    parser.add_argument("--num-workers", type=int, default=0,
                        help="DataLoader workers reading patches; 0 reads them in the main process")
    parser.add_argument("--skip-bad", action="store_true", help="report bad slides and continue with the others")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from medattn.slides.encoders import PRECISIONS, extractor_help  # the cards, without torch

    sub = parser.add_subparsers(dest="wsi_command", required=True)
    tile = sub.add_parser("tile", help="tissue mask, patch grid and quality filter per slide",
                          description=TILE_DESCRIPTION)
    _tiling_arguments(tile)
    tile.add_argument("--overwrite", action="store_true", help="tile slides again whose tiles exist")
    tile.set_defaults(wsi_run=run_tile)
    extract = sub.add_parser("extract", help="patch features per slide as CLAM- or STAMP-layout HDF5",
                             description=EXTRACT_DESCRIPTION)
    _tiling_arguments(extract)
    extract.add_argument("--tiles", type=Path, help="use the tiles written by `medattn wsi tile` to this folder")
    extract.add_argument("--extractor", default="descriptor", help=extractor_help())
    extract.add_argument("--input-norm", choices=("imagenet", "none"), default="imagenet",
                         help="normalisation of CNN inputs (default imagenet; the descriptor takes raw pixels)")
    extract.add_argument("--stain-norm", choices=("none", "macenko"), default="none", help="stain normalisation")
    extract.add_argument("--layout", choices=("clam", "stamp"), default="clam",
                         help="HDF5 layout: clam (features, coords in level-0 px; default) or stamp (feats, coords "
                              "in microns)")
    extract.add_argument("--batch-size", type=int, default=64,
                         help="patches per forward pass of the extractor (default %(default)s)")
    extract.add_argument("--device", default="auto",
                         help="auto (default: cuda when available, one GPU per torchrun process), cpu, cuda, cuda:1")
    extract.add_argument("--precision", choices=PRECISIONS, default="fp32",
                         help="transformer encoders: bf16 autocast (fast only on CPUs with bf16 hardware and GPUs) "
                              "or int8 dynamic quantisation of the Linear layers (CPU; cosine to fp32: docs/slides.md)")
    extract.add_argument("--overwrite", action="store_true", help="extract slides again whose features exist")
    extract.set_defaults(wsi_run=run_extract)
    synthetic = sub.add_parser("synthetic", help="write SYNTHETIC demo slides (not real tissue)",
                               description=SYNTHETIC_DESCRIPTION)
    synthetic.add_argument("out", type=Path, nargs="?", help="output folder (or --out, as the other commands)")
    synthetic.add_argument("--out", type=Path, dest="out_option", help="output folder")
    synthetic.add_argument("--count", type=int, default=8,
                           help="number of slides, every other with a tumour (default %(default)s)")
    synthetic.add_argument("--seed", type=int, default=0, help="seed of the generated slides (default %(default)s)")
    synthetic.add_argument("--format", choices=("tiff", "dicom", "ome-tiff"), default="tiff",
                           help="tiff: generic tiled TIFF (OpenSlide; default); dicom: per slide a folder of DICOM "
                                "VL Whole Slide Microscopy instances (wsidicom); ome-tiff: .ome.tif, the pyramid in "
                                "SubIFDs (tifffile)")
    synthetic.add_argument("--overwrite", action="store_true",
                           help="replace slides and tables of the same names already in the folder")
    synthetic.set_defaults(wsi_run=run_synthetic)


def _settings(args: argparse.Namespace):
    from medattn.slides.settings import TileSettings

    settings = TileSettings(**{f.name: getattr(args, f.name) for f in fields(TileSettings)})
    settings.check()
    return settings


def _summary(results: list, started: float, tail: str = "") -> str:
    """The run's last line(s): counts and speed, and, when slides failed (``--skip-bad``), a last line that says so."""
    done = [r for r in results if r.status == "done"]
    kept = sum(r.kept for r in done)
    seconds = time.perf_counter() - started
    failed = sum(r.status == "failed" for r in results)
    white, blurry = (sum(r.dropped.get(reason, 0) for r in done) for reason in ("white", "blurry"))
    dropped = f"{white} white and {blurry} blurry dropped"
    if done and all(r.filtered_when == "tiling" for r in done):  # extract --tiles: the filter ran in `wsi tile`
        dropped += " when tiled (wsi tile)"
    line = (f"{len(done)} done, {sum(r.status == 'skipped' for r in results)} already done, {failed} failed; "
            f"{kept} patches kept, {dropped}; {kept / max(seconds, 1e-9):.1f} patches/s{tail}")
    if failed:
        line += f"\nWARNING: {failed} of {len(results)} slide(s) failed and were left out (--skip-bad): see above"
    return line


def run_tile(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from medattn.runtime.distributed import rank_and_world
    from medattn.slides.extract import SlideResult, shard
    from medattn.slides.reader import list_slides
    from medattn.slides.tiling import tile_slide, tiles_done, write_tiles

    settings = _settings(args)
    rank, world = rank_and_world()
    started, results = time.perf_counter(), []
    slides = shard(list_slides(args.slides), rank, world)
    for path in tqdm(slides, desc="slides", disable=bars_off(not args.no_progress)):
        if tiles_done(args.out, path, settings, args.overwrite):  # other settings: refused, even with --skip-bad
            results.append(SlideResult(path, "skipped"))
            continue
        try:
            tiles = tile_slide(path, settings, args.num_workers)
            write_tiles(tiles, args.out)
        except UserError as error:
            if not args.skip_bad:
                raise
            print(f"skipped {error}")
            results.append(SlideResult(path, "failed", message=str(error)))
            continue
        counts = tiles.counts()
        results.append(SlideResult(path, "done", counts["kept"], counts))
    print(_summary(results, started))
    return 0


def run_extract(args: argparse.Namespace) -> int:
    from medattn.runtime.distributed import rank_and_world
    from medattn.slides.extract import extract_slides
    from medattn.slides.extractors import build_extractor
    from medattn.slides.reader import list_slides

    settings = _settings(args)
    if args.batch_size < 1 or args.num_workers < 0:
        raise UserError("--batch-size must be >= 1 and --num-workers >= 0")
    rank, world = rank_and_world()
    slides = list_slides(args.slides)
    extractor = build_extractor(args.extractor, args.device, imagenet=args.input_norm == "imagenet",
                                precision=args.precision)
    patch_mpp = settings.patch_um / settings.patch_px
    if extractor.mpp and abs(patch_mpp - extractor.mpp) > 0.05 * extractor.mpp:  # another magnification than its own
        side = extractor.input_px or settings.patch_px
        print(f"WARNING: {extractor.name} was trained on tiles of {extractor.mpp:g} um per pixel; these patches are "
              f"{patch_mpp:g} um per pixel (--patch-um {settings.patch_um:g}, --patch-px {settings.patch_px}); for its "
              f"magnification use --patch-um {extractor.mpp * side:g} --patch-px {side}", flush=True)
    started = time.perf_counter()
    results = extract_slides(slides, args.out, extractor, settings, args.tiles, args.stain_norm, args.batch_size,
                             args.num_workers, args.skip_bad, args.overwrite, rank, world, not args.no_progress,
                             args.layout)
    for result in results:
        if result.status == "failed":
            print(f"skipped {result.message}")
    print(_summary(results, started, f" ({extractor.name} on {extractor.device})"))
    return 0


def run_synthetic(args: argparse.Namespace) -> int:
    from medattn.generators.slides import write_synthetic_cohort

    if args.count < 1:
        raise UserError(f"--count must be >= 1, got {args.count}")
    if (args.out is None) == (args.out_option is None):
        raise UserError("give the output folder once: medattn wsi synthetic DIR, or --out DIR")
    out = args.out or args.out_option
    paths = write_synthetic_cohort(out, args.count, args.seed, overwrite=args.overwrite, format=args.format)
    what = {"tiff": "tiled TIFF", "dicom": "DICOM whole-slide image (a folder of .dcm instances each)",
            "ome-tiff": "OME-TIFF"}[args.format]
    print(f"wrote {len(paths)} SYNTHETIC slides ({what}: {paths[0].name}, ...), slide_table.csv and "
          f"clinical_table.csv to {out}")
    return 0


def run(args: argparse.Namespace) -> int:
    return args.wsi_run(args)
