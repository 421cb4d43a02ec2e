"""Explain a checkpoint's predictions as heatmaps: medattn explain CHECKPOINT FILES... --out DIR.

Each file is prepared exactly as `medattn predict` prepares it: with the preprocessing description stored
in the checkpoint (:mod:`medattn.data.preprocessing`; subtraction models take the subtracted volume of
each file with --subtract); the library function is :func:`medattn.explain.files.explain_files`.
Methods (docs/explain.md): `auto` (default: `gradrollout` for transformers
whose attention forms weights, `gradxinput` otherwise), `gradrollout` (gradient-weighted rollout,
linear-time for SeqNorm/SimA), `rollout` (class-token attention rollout), `gradxinput` (gradient x
input, any model and mechanism) and `attention` (a bag model's own attention weights per tile: attention-MIL's
pooling weights, TransMIL's class-token attention). Writes to DIR, per file:
  2D images          <stem>.png (the image beside the map over it, with a colour bar)
  3D volumes         <stem>.nii.gz (the map on the input file's grid and affine) and <stem>_preview.png (a 3D
                     preview: sagittal, coronal and axial planes through the centre of the largest relevance,
                     the image above the map over it, at the voxels' physical aspect, with the colour bar)
  whole-slide bags   <stem>_tiles.csv (tile, x, y as the bag stores them, coords_unit of x and y: um or px,
  (HDF5)             x_level0_px, y_level0_px, score), <stem>_tiles.h5 (scores and coords), <stem>_tiles.geojson
                     (a square per tile in level-0 pixels with its score, for QuPath: File > Import objects) and
                     <stem>.png (the scores drawn on the tiles, over the slide's thumbnail with --slides)
With `auto`, a SeqNorm bag longer than --chunk-size tiles is explained by rollout
streamed in bounded memory (the gradient rule needs a backward over the whole bag). `summary.csv` lists
every file with the method used and its outputs as predict names them (prob_<class>; a survival model's risk; a
regression model's pred_<target> in the table's units); a model whose run did not learn says so on the terminal and
in a run_verdict column. --colour-scale percentile ends the colours at the 1st and
99th percentiles of the map (99th of |values| for a signed map), so a few extreme tiles or voxels do not wash the
rest out. --device picks where the model runs (default: the best this machine has), whatever device it was
trained on. --slides DIR: a folder that does not exist is refused; a bag whose slide is not in it, or whose file of
that name is not the slide the bag records it was extracted from (dimensions, size, digest: slide_identity), is
refused when it is the only file, and with several bags each such slide is a warning and counted in the summary; a
bag extracted before slide_identity was recorded is drawn on the slide of its name with a warning.
"""

from __future__ import annotations

import argparse

from medattn.cli_args import add_device_option, positive_int

# the registry's names without importing torch for --help (tests/explain/test_explain.py checks they are METHODS)
METHOD_CHOICES = ("auto", "gradrollout", "rollout", "gradxinput", "attention")
COLOUR_SCALES = ("full", "percentile")  # medattn.explain.outputs.COLOUR_SCALES (checked by the same test)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="run folder, checkpoint folder or model.safetensors")
    parser.add_argument("files", nargs="+", help="image, volume (file or DICOM folder) or HDF5 feature files")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--method", choices=METHOD_CHOICES, default="auto",
                        help="auto (default): gradrollout for transformers with attention weights, else gradxinput; "
                             "attention: the model's own attention weights per tile (attention-MIL, TransMIL)")
    parser.add_argument("--colour-scale", choices=COLOUR_SCALES, default="full",
                        help="where the pictures' colours end: full (default: the whole map) or percentile (the 1st "
                             "and 99th percentiles; 99th of |values| for a signed map)")
    parser.add_argument("--target", type=int, default=None,
                        help="gradrollout/gradxinput: the output explained (default: the predicted class; rollout and "
                             "attention are class-agnostic)")
    parser.add_argument("--subtract", nargs="+", metavar="FILE", default=None,
                        help="for subtraction models: the volume subtracted from each file, in the same order")
    parser.add_argument("--slides", default=None, metavar="DIR",
                        help="folder of the scanner files: bag maps are drawn on their slide's thumbnail (a folder "
                             "that does not exist, or a single bag's slide not in it, is refused)")
    parser.add_argument("--accept-features", action="store_true",
                        help="bag models: explain bags whose features were made otherwise than the training features "
                             "(another extractor, tile size, mpp or layout; refused by default); summary.csv's "
                             "features_accepted column says how each differs")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace outputs already in --out (inputs are never written over)")
    parser.add_argument("--chunk-size", type=positive_int, default=32_768,
                        help="with --method auto/rollout, SeqNorm bags longer than this stream in chunks of this "
                             "many tiles (plain rollout)")
    add_device_option(parser)


def run(args: argparse.Namespace) -> int:
    import sys

    from medattn.explain.files import explain_files

    report = explain_files(args.checkpoint, args.files, args.out, args.method, args.target, args.chunk_size,
                           args.subtract, args.overwrite, args.slides, args.colour_scale,
                           args.accept_features, args.device)
    for file, why in report.missing_slides:
        print(f"medattn: warning: {file}: --slides {args.slides}: {why}; its map is drawn at the tile coordinates "
              f"on a blank canvas", file=sys.stderr)
    tag = " [SYNTHETIC model]" if report.synthetic else ""
    used = "/".join(sorted({row["method"] for row in report.rows}))
    print(f"explained {len(report.rows)} file(s) with {used}{tag} -> {args.out} (checkpoint {report.checkpoint})")
    for note in report.notes:  # the DICOM annotations of DICOM slides written, or why not
        print(note)
    if report.slides_found is not None:
        print(f"slides: {report.slides_found} of {len(report.rows)} bag map(s) drawn on their slide, "
              f"{len(report.missing_slides)} slide(s) not found or not the bag's slide in {args.slides}")
        if report.by_name_only:
            print(f"medattn: warning: {len(report.by_name_only)} bag(s) drawn on a slide matched by file name only "
                  f"(extracted before medattn recorded slide_identity; re-extract to confirm which slide): "
                  f"{', '.join(report.by_name_only[:3])}{' ...' if len(report.by_name_only) > 3 else ''}",
                  file=sys.stderr)
    if report.streamed:
        print(f"{report.streamed} bag(s) longer than --chunk-size were explained by streamed rollout in bounded "
              f"memory (gradrollout needs a backward over the whole bag: ask for it with --method gradrollout)")
    return 0
