"""Inpaint 3D volumes with a diffusion checkpoint: medattn inpaint CHECKPOINT VOLUMES... --mask ... --out DIR.

CHECKPOINT is a diffusion_transformer run (or, with --method random, also a diffusion_vqae run; see
docs/diffusion.md). Each VOLUME (NIfTI) must have the size the model was trained on (a multiple of the
patch size along every axis); it is read as stored (no reorientation or resampling) and normalised as
the training data were (nifti_volumes: data.normalize; SYNTHETIC data: none, values in [0, 1]). The
unknown tokens are the centre box (--mask centre, --mask-fraction of each latent axis), every token
(--mask all: unconditional synthesis), or the tokens whose cell holds a nonzero voxel of a NIfTI mask
FILE of the volume's size. Writes, per volume, DIR/<name>_inpainted.nii.gz (in the normalised
intensity scale, on the input grid with its affine) and DIR/<name>_mask.nii.gz (the unknown cells),
and DIR/scores.csv with PSNR and SSIM per case.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="diffusion run folder or checkpoint folder")
    parser.add_argument("volumes", nargs="+", metavar="VOLUME", help="NIfTI volumes (.nii, .nii.gz)")
    parser.add_argument("--mask", default="centre", help="centre, all, or a NIfTI mask file (nonzero = unknown)")
    parser.add_argument("--mask-fraction", type=float, default=None,
                        help="centre mask: share of each latent axis (default: the checkpoint's mask_fraction)")
    parser.add_argument("--method", choices=("diffusion", "random"), default="diffusion",
                        help="diffusion: the transformer reveals the tokens; random: uniform random codes (baseline)")
    parser.add_argument("--steps", type=int, default=None, help="sampling steps (default: the checkpoint's, 200)")
    parser.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: 0.8)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampler (case i uses seed + i)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the free cores)")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace outputs already in --out (inputs are never written over)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from medattn.diffusion.volumes_io import inpaint_files
    from medattn.errors import UserError
    from medattn.threads import set_threads

    if args.steps is not None and args.steps < 1:
        raise UserError("--steps must be at least 1")
    if args.temperature is not None and not args.temperature > 0:
        raise UserError("--temperature must be > 0")
    if args.mask_fraction is not None and not 0 < args.mask_fraction <= 1:
        raise UserError("--mask-fraction must be in (0, 1]")
    set_threads(args.threads)
    rows = inpaint_files(args.checkpoint, [Path(v) for v in args.volumes], Path(args.out), mask=args.mask,
                         method=args.method, mask_fraction=args.mask_fraction, steps=args.steps,
                         temperature=args.temperature, seed=args.seed, overwrite=args.overwrite)
    for row in rows:
        print(f"{row['case']}: PSNR {row['psnr']:.2f} dB, SSIM {row['ssim']:.4f} ({row['method']}, "
              f"{row['masked_tokens']} unknown tokens)")
    print(f"wrote {len(rows)} volume(s) and scores.csv to {args.out}")
    return 0
