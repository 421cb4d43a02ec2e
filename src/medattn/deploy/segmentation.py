"""Segmentation outputs on the input's own grid: label maps as NIfTI files and per-structure volumes in mm^3.

The model sees the volume after :mod:`medattn.data.volumes`' steps: reoriented to RAS+, resampled to the
target spacing (optional), centre-cropped or padded to the target size. :func:`to_input_grid` undoes them
in reverse order for a label map: un-crop/un-pad (voxels the crop cut away are background, 0), nearest-
neighbour resampling back to the RAS+ grid, and the inverse reorientation, so the map has the input
file's array shape and is saved with the input's affine (voxel (i, j, k) of the map is voxel (i, j, k)
of the input). A structure's volume is its voxel count times ``|det(affine[:3, :3])|`` (mm^3 per voxel).

Inputs must be NIfTI files here (a DICOM series has no single affine to write back; convert it with
dcm2niix first).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from medattn.data.preprocessing import Preprocessing
from medattn.errors import UserError


def uncrop(labels: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Inverse of :func:`medattn.data.volumes.crop_or_pad` for a label map: (target size) -> ``shape``,
    background (0) where the centre crop had cut voxels away."""
    out = labels.new_zeros(shape)
    src, dst = [], []
    for n, m in zip(shape, labels.shape):  # n: the grid before crop/pad, m: the model's size
        if n >= m:  # the crop kept [start, start + m) of n
            start = (n - m) // 2
            dst.append(slice(start, start + m))
            src.append(slice(0, m))
        else:  # the pad put n voxels at [start, start + n) of m
            start = (m - n) // 2
            dst.append(slice(0, n))
            src.append(slice(start, start + n))
    out[tuple(dst)] = labels[tuple(src)]
    return out


def geometry(path: Path) -> tuple[tuple[int, int, int], np.ndarray]:
    """(array shape, affine) of a NIfTI input, from its header."""
    import nibabel as nib

    from medattn.data.volumes import is_nifti

    if not is_nifti(path):
        raise UserError(f"{path}: label maps are written for NIfTI inputs (convert a DICOM series with dcm2niix)")
    image = nib.load(path)
    return tuple(int(n) for n in image.shape[:3]), np.asarray(image.affine, dtype=np.float64)


def to_input_grid(labels: torch.Tensor, path: Path, prep: Preprocessing) -> tuple[np.ndarray, np.ndarray]:
    """Label map (H, W, D) on the model's grid -> (label map on the input file's grid (uint8/int16), affine)."""
    from nibabel import orientations as ornt

    shape, affine = geometry(path)
    io = ornt.io_orientation(affine)
    forward = ornt.ornt_transform(io, ornt.axcodes2ornt("RAS"))
    ras_shape = [0, 0, 0]
    spacing = np.linalg.norm(affine[:3, :3], axis=0)
    ras_spacing = [0.0, 0.0, 0.0]
    for axis, (target, _) in enumerate(forward):
        ras_shape[int(target)] = shape[axis]
        ras_spacing[int(target)] = float(spacing[axis])
    grid = ras_shape
    if prep.spacing is not None:  # as medattn.data.volumes.resample sizes the resampled grid
        grid = [max(1, round(n * s / t)) for n, s, t in zip(ras_shape, ras_spacing, prep.spacing)]
    labels = uncrop(labels.to(torch.int64), tuple(grid))
    if list(labels.shape) != ras_shape:
        labels = F.interpolate(labels[None, None].float(), size=ras_shape, mode="nearest-exact")[0, 0].long()
    array = ornt.apply_orientation(labels.numpy(), ornt.ornt_transform(ornt.axcodes2ornt("RAS"), io))
    dtype = np.uint8 if prep.num_outputs <= 256 else np.int16
    return np.ascontiguousarray(array).astype(dtype), affine


def write_label_map(array: np.ndarray, affine: np.ndarray, out: Path) -> None:
    """Save a label map as NIfTI with the input's affine (sform and qform code 1, scanner space)."""
    import nibabel as nib

    image = nib.Nifti1Image(array, affine)
    image.set_sform(affine, code=1)
    image.set_qform(affine, code=1)
    nib.save(image, str(out))


def structure_volumes(array: np.ndarray, affine: np.ndarray, num_classes: int) -> list[float]:
    """Volume in mm^3 of classes 1..K-1 (voxel count x |det(affine[:3, :3])|)."""
    voxel = abs(float(np.linalg.det(affine[:3, :3])))
    counts = np.bincount(array.ravel().astype(np.int64), minlength=num_classes)
    return [float(counts[k]) * voxel for k in range(1, num_classes)]
