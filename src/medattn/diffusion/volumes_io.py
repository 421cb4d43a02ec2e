"""Inpainting NIfTI files with a diffusion checkpoint (the library behind ``medattn inpaint``).

A volume is read as stored (no reorientation, no resampling, so the output lies on the input grid and
keeps its affine), normalised as the checkpoint's training data were (``nifti_volumes``:
``data.normalize``, default percentile; ``synthetic_brain``: none), inpainted
(:func:`medattn.diffusion.inpaint.inpaint`) and written as float32 NIfTI in that normalised scale.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from medattn.data.files import check_regular
from medattn.data.readers.volumes import check_volume_header, is_nifti, normalise, write_nifti
from medattn.diffusion.inpaint import (
    centre_mask,
    inpaint,
    score_case,
    tokens_to_voxels,
    versus_random,
    voxel_mask_to_tokens,
)
from medattn.diffusion.model import load_stage
from medattn.diffusion.vqae import patch_grid
from medattn.errors import UserError
from medattn.outputs import OutputFolder

#: How far outside [0, 1] a normalised volume may reach before inpainting warns that its scale is not the model's.
UNIT_SLACK = 0.05
SCORE_FIELDS = ("case", "method", "masked_tokens", "psnr", "ssim", "psnr_masked", "psnr_recon", "ssim_recon")


def check_nifti(path: Path) -> None:
    """A regular NIfTI file whose header reads and whose data are not cut short (cheap: nothing decoded)."""
    if not is_nifti(path):
        raise UserError(f"{path}: expected a NIfTI file (.nii, .nii.gz)")
    try:
        check_regular(path)
        check_volume_header(path)
    except (OSError, ValueError) as error:
        if isinstance(error, UserError):
            raise
        raise UserError(f"{path}: unreadable NIfTI ({str(error).splitlines()[0]})") from None


def header_shape(path: Path) -> tuple[int, ...]:
    """The 3D shape a NIfTI file's header declares (a trailing axis of 1 dropped), checked by :func:`check_nifti`."""
    import nibabel as nib

    check_nifti(path)
    shape = tuple(int(n) for n in nib.load(path).shape)
    return shape[:3] if len(shape) == 4 and shape[3] == 1 else shape


def read_nifti(path: Path):
    """-> (array (H, W, D) float32 as stored, the nibabel image); UserError naming the file otherwise."""
    import nibabel as nib

    check_nifti(path)
    try:
        image = nib.load(path)
        array = np.asarray(image.dataobj, dtype=np.float32)
    except Exception as error:  # readers raise many types (zlib, gzip, nibabel) for damaged files
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UserError(f"{path}: unreadable NIfTI ({reason})") from None
    if array.ndim == 4 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim != 3 or not np.isfinite(array).all():
        raise UserError(f"{path}: expected a finite 3D volume, got shape {array.shape}")
    return array, image



def inpaint_files(checkpoint_path: str | Path, volumes: list[Path], out_dir: Path, *, mask: str = "centre",
                  method: str = "diffusion", mask_fraction: float | None = None, steps: int | None = None,
                  temperature: float | None = None, seed: int = 0, overwrite: bool = False,
                  log: Callable[[str], None] = print) -> list[dict]:
    """Inpaint every file of ``volumes`` into ``out_dir`` (see ``medattn inpaint --help``); -> score rows.

    Every volume and the mask are read, and every output name planned, before the first sampling step; outputs
    follow :class:`~medattn.outputs.OutputFolder` (never over an input; over an existing file only with
    ``overwrite``; volumes of one name get ``<name>``, ``<name>_2``, ...)."""
    model, meta = load_stage(checkpoint_path, want_transformer=method == "diffusion")
    config = meta["config"]
    diff_cfg = config["diffusion"]
    data_cfg = config["data"]
    method_norm = data_cfg.get("normalize", "percentile") if data_cfg.get("kind") == "nifti_volumes" else "none"
    expected = tuple(meta["diffusion"]["volume_shape"])
    vqae = model.vqae
    cell = vqae.patch_size // vqae.latent_size
    mask_file = None if mask in ("centre", "all") else Path(mask)
    mask_voxels = read_nifti(mask_file)[0] if mask_file is not None else None
    for path in volumes:  # every input before any output or compute
        shape = header_shape(path)
        try:
            patch_grid(shape, vqae.patch_size)
        except UserError as error:
            raise UserError(f"{path}: {error}") from None
        if method == "diffusion" and shape != expected:
            raise UserError(f"{path}: size {shape}, the transformer was trained on volumes of size {expected} "
                            f"(its positional embedding fixes the token grid)")
    out = OutputFolder(out_dir, [*volumes, *([mask_file] if mask_file else [])], overwrite)
    stems = [out.stem_for(path) for path in volumes]
    for stem in stems:
        out.path(f"{stem}_inpainted.nii.gz")
        out.path(f"{stem}_mask.nii.gz")
    out.path("scores.csv")
    rows = []
    for index, (path, stem) in enumerate(zip(volumes, stems)):
        array, image = read_nifti(path)
        volume = normalise(torch.from_numpy(array), method_norm)
        low, high = float(volume.min()), float(volume.max())
        if low < -UNIT_SLACK or high > 1 + UNIT_SLACK:  # the model and the scores work in [0, 1]
            log(f"WARNING: {path.name}: values {low:.3g} to {high:.3g} after the training data's normalisation "
                f"({method_norm}); the model was trained on [0, 1], so the output and its PSNR/SSIM mean nothing: "
                f"scale the volume to [0, 1] as the training data were")
        grid = tuple(n // cell for n in array.shape)
        if mask_voxels is not None:
            voxels = mask_voxels
            if voxels.shape != array.shape:
                raise UserError(f"{mask_file}: mask size {voxels.shape} differs from the volume's {array.shape} "
                                f"({path})")
            unknown = voxel_mask_to_tokens(torch.from_numpy(voxels != 0), cell)
        elif mask == "all":
            unknown = torch.ones(grid, dtype=torch.bool)
        else:
            unknown = centre_mask(grid, diff_cfg["mask_fraction"] if mask_fraction is None else mask_fraction)
        if not unknown.any():
            raise UserError(f"{mask_file}: the mask marks no voxel of {path} as unknown")
        result = inpaint(model, volume[None], unknown, method, steps or diff_cfg["sample_steps"],
                         temperature or diff_cfg["temperature"], seed + index)
        voxel_mask = tokens_to_voxels(unknown, cell)
        scores = score_case(result["output"], volume, result["reconstruction"], voxel_mask)
        if method == "diffusion":  # the same case with random codes: a model no better than them means nothing
            codes = inpaint(model, volume[None], unknown, "random", 1, 1.0, seed + index)
            warning = versus_random(scores, score_case(codes["output"], volume, codes["reconstruction"], voxel_mask),
                                    torch.equal(codes["output"], result["output"]))
            if warning:
                log(f"WARNING: {path.name}: {warning}")
        write_nifti(out, f"{stem}_inpainted.nii.gz", result["output"].numpy(), image.affine)
        write_nifti(out, f"{stem}_mask.nii.gz", voxel_mask.numpy().astype(np.uint8), image.affine)
        rows.append({"case": stem, "method": method, "masked_tokens": int(unknown.sum()), **scores})
    out.save_dicts("scores.csv", rows, SCORE_FIELDS)
    return rows
