"""Explain a checkpoint's predictions as heatmaps: medattn explain CHECKPOINT FILES... --out DIR.

Each file is read and preprocessed as `medattn predict` reads it. Methods (docs/explain.md): `rollout`
(default; class-token attention rollout, exact and linear-time for SeqNorm/SimA, from the weights for
softmax) and `gradxinput` (gradient x input, any model and mechanism). Writes to DIR, per file:
2D images `<stem>.png` (overlay on the image at its own size); 3D volumes `<stem>.nii.gz` (the map on the
input file's grid and affine); whole-slide bags (HDF5) `<stem>_tiles.csv` and `<stem>_tiles.h5` (a score
per tile) and `<stem>.png` (the scores drawn on the tile coordinates). A SeqNorm bag longer than
--chunk-size tiles is streamed in bounded memory. `summary.csv` lists every file with its probabilities.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from medattn.errors import UserError, writing

from .evaluate import positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="run folder, checkpoint folder or model.safetensors")
    parser.add_argument("files", nargs="+", help="image, volume (file or DICOM folder) or HDF5 feature files")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--method", choices=("rollout", "gradxinput"), default="rollout")
    parser.add_argument("--target", type=int, default=None,
                        help="gradxinput: the output explained (default: the predicted class)")
    parser.add_argument("--chunk-size", type=positive_int, default=32_768,
                        help="bags longer than this stream in chunks of this many tiles (SeqNorm rollout)")


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".nii.gz", ".nii", ".h5", ".hdf5"):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def _streams(model, method: str) -> bool:
    from medattn.explain.rows import FactorisedRows, rows_for

    blocks = getattr(getattr(model, "encoder", None), "blocks", [])
    return method == "rollout" and len(blocks) > 0 and all(
        block.attn.stream_passes > 0 and isinstance(rows_for(block.attn), FactorisedRows) for block in blocks)


def explain_bag_file(model, path: Path, method: str, target, chunk_size: int):
    """-> (probability logits (1, K), scores (N,) numpy, coords (N, 2) numpy, HDF5 attributes) for one bag file."""
    import h5py
    import numpy as np
    import torch

    from medattn.data.bags import feature_key, read_slide, slide_shape
    from medattn.explain import explain, streaming_rollout

    try:
        rows, _ = slide_shape(path)
        with h5py.File(path, "r") as f:
            attrs = dict(f.attrs)
            coords = np.asarray(f["coords"][:rows], dtype=np.float64) if "coords" in f else None
            if rows > chunk_size and _streams(model, method):
                logits, scores = streaming_rollout(model, f[feature_key(f)], coords, chunk_size)
                return logits, scores, coords, attrs
        features, _ = read_slide(path)
    except (OSError, ValueError) as error:
        if isinstance(error, UserError):
            raise
        raise UserError(f"{path}: {error}") from None
    if features.shape[1] != model.feature_dim:
        raise UserError(f"{path}: features have dimension {features.shape[1]}, the model takes {model.feature_dim}")
    tensor_coords = None if coords is None else torch.from_numpy(coords).float()[None]
    out = explain(model, features[None], method, target, coords=tensor_coords)
    return out.logits, out.relevance[0].numpy(), coords, attrs


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from medattn.data.files import check_regular
    from medattn.data.images import read_image
    from medattn.explain import explain, outputs
    from medattn.train.objectives import probabilities

    from .evaluate import load_trained
    from .predict import file_loader

    model, config, task, folder = load_trained(args.checkpoint)
    if task.task_type == "segmentation":
        raise UserError("explain explains class predictions; this is a segmentation checkpoint")
    if task.input_kind == "volume3d" and config["data"].get("split_sides"):
        raise UserError("this checkpoint was trained on left/right halves; give one half-volume per file")
    paths = [Path(f) for f in args.files]
    for path in paths:
        try:
            check_regular(path, folders=task.input_kind == "volume3d")
        except (FileNotFoundError, ValueError) as error:
            raise UserError(f"{path}: {'no such file' if isinstance(error, FileNotFoundError) else error}") from None
    out_dir = Path(args.out)
    with writing(out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
    label = "SYNTHETIC" if task.synthetic else None
    names = task.class_names if len(task.class_names) == task.num_outputs else [str(i) for i in
                                                                                 range(task.num_outputs)]
    read = file_loader(config["data"], task) if task.input_kind != "bag" else None
    summary = []
    for path in paths:
        stem = out_dir / _stem(path)
        if task.input_kind == "bag":
            logits, scores, coords, attrs = explain_bag_file(model, path, args.method, args.target, args.chunk_size)
            coords = np.zeros((len(scores), 2)) if coords is None else coords
            outputs.write_tile_scores(stem.with_name(f"{stem.name}_tiles"), coords, scores, args.method)
            written = [f"{stem.name}_tiles.csv", f"{stem.name}_tiles.h5"]
            if np.ptp(coords, axis=0).any():
                image = outputs.tile_map(coords, scores, outputs.tile_size(coords, attrs), label)
                with writing(stem.with_suffix(".png")):
                    image.save(stem.with_suffix(".png"))
                written.append(f"{stem.name}.png")
            target = "" if args.method == "rollout" else args.target
        else:
            sample = read(path)
            result = explain(model, sample["input"][None], args.method, args.target)
            logits, heat = result.logits, result.relevance[0]
            target = "" if result.target is None else int(result.target[0])
            if task.input_kind == "image2d":
                image = outputs.overlay(read_image(path).numpy(), heat.numpy(), label=label)
                with writing(stem.with_suffix(".png")):
                    image.save(stem.with_suffix(".png"))
                written = [f"{stem.name}.png"]
            else:
                spacing = config["data"].get("target_spacing")
                array, affine = outputs.volume_map_to_input(heat, path, tuple(spacing) if spacing else None)
                outputs.write_nifti(out_dir / f"{stem.name}.nii.gz", array, affine)
                written = [f"{stem.name}.nii.gz"]
        with torch.no_grad():
            probs = probabilities(logits.detach().float(), task.task_type)[0].tolist()
        summary.append({"file": str(path), "method": args.method, "target": target,
                        **{f"prob_{n}": f"{p:.6f}" for n, p in zip(names, probs)}, "outputs": " ".join(written)})
    outputs.write_summary(out_dir / "summary.csv", summary)
    tag = " [SYNTHETIC model]" if task.synthetic else ""
    print(f"explained {len(summary)} file(s) with {args.method}{tag} -> {out_dir} (checkpoint {folder})")
    return 0
