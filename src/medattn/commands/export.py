"""Export a checkpoint for deployment: medattn export CHECKPOINT --format onnx|pt2 --out FILE.

The file maps preprocessed inputs to probabilities and carries the preprocessing description, class
names, decision thresholds, model id and checkpoint hash as metadata (docs/deploy.md). ONNX files are
checked against onnxruntime on random inputs when it is installed (``--no-check`` skips that).
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="run folder, checkpoint folder or model.safetensors")
    parser.add_argument("--format", choices=("onnx", "pt2"), required=True,
                        help="onnx (ONNX Runtime, any language) or pt2 (a torch.export program for PyTorch)")
    parser.add_argument("--out", required=True, help="file to write (.onnx or .pt2)")
    parser.add_argument("--no-check", action="store_true", help="skip the onnxruntime check of an ONNX export")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out file")


def run(args: argparse.Namespace) -> int:
    from medattn.deploy.export import check_onnx, export_checkpoint

    meta = export_checkpoint(args.checkpoint, args.format, args.out, args.overwrite)
    print(f"wrote {args.out} ({args.format}; model {meta['model_id']}, checkpoint sha256 "
          f"{meta['checkpoint_sha256'][:12]}...)")
    if args.format == "onnx" and not args.no_check:
        error = check_onnx(args.checkpoint, args.out)
        print("onnxruntime check skipped: onnxruntime is not installed" if error is None else
              f"onnxruntime check: largest relative difference {error:.2e} on random inputs")
    return 0
