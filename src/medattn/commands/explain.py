"""Explain a checkpoint's predictions as heatmaps: medattn explain CHECKPOINT FILES... --out DIR.

Each file is prepared exactly as `medattn predict` prepares it: with the preprocessing description stored
in the checkpoint (:mod:`medattn.data.preprocessing`; subtraction models take the subtracted volume of
each file with --subtract). Methods (docs/explain.md): `auto` (default: `gradrollout` for transformers
whose attention forms weights, `gradxinput` otherwise), `gradrollout` (gradient-weighted rollout,
linear-time for SeqNorm/SimA), `rollout` (class-token attention rollout) and `gradxinput` (gradient x
input, any model and mechanism). Writes to DIR, per file: 2D images `<stem>.png` (overlay on the image at
its own size); 3D volumes `<stem>.nii.gz` (the map on the input file's grid and affine); whole-slide bags
(HDF5) `<stem>_tiles.csv` and `<stem>_tiles.h5` (a score per tile) and `<stem>.png` (the scores drawn on
the tile coordinates). With `auto`, a SeqNorm bag longer than --chunk-size tiles is explained by rollout
streamed in bounded memory (the gradient rule needs a backward over the whole bag). `summary.csv` lists
every file with the method used and its probabilities.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from medattn.errors import UserError, writing

from .evaluate import positive_int

METHOD_CHOICES = ("auto", "gradrollout", "rollout", "gradxinput")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="run folder, checkpoint folder or model.safetensors")
    parser.add_argument("files", nargs="+", help="image, volume (file or DICOM folder) or HDF5 feature files")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--method", choices=METHOD_CHOICES, default="auto",
                        help="auto (default): gradrollout for transformers with attention weights, else gradxinput")
    parser.add_argument("--target", type=int, default=None,
                        help="gradrollout/gradxinput: the output explained (default: the predicted class)")
    parser.add_argument("--subtract", nargs="+", metavar="FILE", default=None,
                        help="for subtraction models: the volume subtracted from each file, in the same order")
    parser.add_argument("--chunk-size", type=positive_int, default=32_768,
                        help="with --method auto/rollout, SeqNorm bags longer than this stream in chunks of this "
                             "many tiles (plain rollout)")


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".nii.gz", ".nii", ".h5", ".hdf5"):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def _streams(model) -> bool:
    """Whether every block of ``model`` streams and has factorised rows (streamed rollout applies)."""
    from medattn.explain.rows import FactorisedRows, rows_for

    blocks = getattr(getattr(model, "encoder", None), "blocks", [])
    return len(blocks) > 0 and all(
        block.attn.stream_passes > 0 and isinstance(rows_for(block.attn), FactorisedRows) for block in blocks)


def streamed_bag(model, path: Path, chunk_size: int):
    """(logits (1, K), scores (N,), coords (N, 2), HDF5 attributes) by :func:`streaming_rollout`, the bag read
    chunk by chunk from the file; coords are zeros where the file has none (as the bag loader gives them)."""
    import h5py
    import numpy as np
    import torch

    from medattn.data.bags import feature_key
    from medattn.explain import streaming_rollout

    rows, attrs = bag_header(path)
    try:
        with h5py.File(path, "r") as f:
            coords = (np.asarray(f["coords"][:rows], dtype=np.float32) if "coords" in f
                      else np.zeros((rows, 2), np.float32))
            logits, scores = streaming_rollout(model, f[feature_key(f)], torch.from_numpy(coords), chunk_size)
    except (OSError, ValueError) as error:
        if isinstance(error, UserError):
            raise
        raise UserError(f"{path}: {error}") from None
    return logits, scores, coords, attrs


def bag_header(path: Path) -> tuple[int, dict]:
    """(tiles, HDF5 attributes) of a bag file, from its header; UserError naming the file otherwise."""
    import h5py

    from medattn.data.bags import slide_shape

    try:
        rows, _ = slide_shape(path)
        with h5py.File(path, "r") as f:
            return rows, dict(f.attrs)
    except (OSError, ValueError) as error:
        if isinstance(error, UserError):
            raise
        raise UserError(f"{path}: {error}") from None


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from medattn.data.files import check_regular
    from medattn.data.images import read_image
    from medattn.data.preprocessing import inference_dataset
    from medattn.data.volumes import to_native_grid, write_nifti
    from medattn.explain import default_method, explain, outputs
    from medattn.runtime.predictor import probabilities
    from medattn.runtime.trained import load_checkpoint

    from .predict import sample_inputs

    trained = load_checkpoint(args.checkpoint)
    model, prep = trained.model, trained.file_preprocessing("explain")
    if prep.task_type == "segmentation":
        raise UserError("explain explains class predictions; this is a segmentation checkpoint")
    if prep.split_sides:
        raise UserError("this checkpoint was trained on left/right halves; explain does not map a half's heatmap "
                        "back to the file yet (medattn predict gives both sides' probabilities)")
    inputs = sample_inputs(args.files, args.subtract, prep.inputs_per_sample)
    for paths in inputs:  # every file before anything is written
        for path in paths:
            try:
                check_regular(path, folders=prep.input_kind == "volume3d")
            except (FileNotFoundError, ValueError) as error:
                raise UserError(f"{path}: {'no such file' if isinstance(error, FileNotFoundError) else error}") \
                    from None
    out_dir = Path(args.out)
    with writing(out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
    label = "SYNTHETIC" if prep.synthetic else None
    method = default_method(model) if args.method == "auto" else args.method
    dataset = inference_dataset(prep, inputs)
    summary, streamed = [], 0
    for index, item in enumerate(dataset.items):
        path = item.paths[0]
        stem = out_dir / _stem(path)
        used = method
        if prep.input_kind == "bag":
            rows, attrs = bag_header(path)
            if args.method in ("auto", "rollout") and rows > args.chunk_size and _streams(model):
                logits, scores, coords, attrs = streamed_bag(model, path, args.chunk_size)
                used, target, streamed = "rollout", "", streamed + 1
            else:
                sample = dataset[index]
                result = explain(model, sample["input"][None], method, args.target, coords=sample["coords"][None])
                logits, scores, coords = result.logits, result.relevance[0].numpy(), sample["coords"].numpy()
                target = "" if result.target is None else int(result.target[0])
            outputs.write_tile_scores(stem.with_name(f"{stem.name}_tiles"), coords, scores, used)
            written = [f"{stem.name}_tiles.csv", f"{stem.name}_tiles.h5"]
            if np.ptp(coords, axis=0).any():
                image = outputs.tile_map(coords, scores, outputs.tile_size(coords, attrs), label)
                with writing(stem.with_suffix(".png")):
                    image.save(stem.with_suffix(".png"))
                written.append(f"{stem.name}.png")
        else:
            result = explain(model, dataset[index]["input"][None], method, args.target)
            logits, heat = result.logits, result.relevance[0]
            target = "" if result.target is None else int(result.target[0])
            if prep.input_kind == "image2d":
                image = outputs.overlay(read_image(path).numpy(), heat.numpy(), label=label)
                with writing(stem.with_suffix(".png")):
                    image.save(stem.with_suffix(".png"))
                written = [f"{stem.name}.png"]
            else:
                array, affine = to_native_grid(heat.float(), path, prep.spacing)
                write_nifti(out_dir / f"{stem.name}.nii.gz", array, affine)
                written = [f"{stem.name}.nii.gz"]
        with torch.no_grad():
            probs = probabilities(logits.detach().float(), prep.task_type)[0].tolist()
        summary.append({"file": item.id, "method": used, "target": target,
                        **{f"prob_{n}": f"{p:.6f}" for n, p in zip(prep.output_names, probs)},
                        "outputs": " ".join(written)})
    outputs.write_summary(out_dir / "summary.csv", summary)
    tag = " [SYNTHETIC model]" if prep.synthetic else ""
    used = "/".join(sorted({row["method"] for row in summary}))
    print(f"explained {len(summary)} file(s) with {used}{tag} -> {out_dir} (checkpoint {trained.folder})")
    if streamed:
        print(f"{streamed} bag(s) longer than --chunk-size were explained by streamed rollout in bounded memory "
              f"(gradrollout needs a backward over the whole bag: ask for it with --method gradrollout)")
    return 0
