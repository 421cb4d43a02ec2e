"""Segmentation outputs on the input's own grid: label maps as NIfTI files and per-structure volumes in mm^3.

The model sees the volume after :mod:`medattn.data.volumes`' steps: reoriented to RAS+, resampled to the
target spacing (optional), centre-cropped or padded to the target size. :func:`to_input_grid` undoes them
in reverse order for a label map: un-crop/un-pad (voxels the crop cut away are background, 0), nearest-
neighbour resampling back to the RAS+ grid, and the inverse reorientation, so the map has the input
file's array shape and is saved with the input's affine (voxel (i, j, k) of the map is voxel (i, j, k)
of the input). A structure's volume is its voxel count times ``|det(affine[:3, :3])|`` (mm^3 per voxel).

A DICOM series gets the RAS affine the volume reader builds from its slice positions and orientation.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from medattn.data.preprocessing import Preprocessing
from medattn.data.volumes import to_native_grid


def to_input_grid(labels: torch.Tensor, path: Path, prep: Preprocessing) -> tuple[np.ndarray, np.ndarray]:
    """Label map (H, W, D) on the model's grid -> (label map on the input file's grid (uint8/int16), affine)."""
    array, affine = to_native_grid(labels.to(torch.int64), path, prep.spacing)
    return array.astype(np.uint8 if prep.num_outputs <= 256 else np.int16), affine


def structure_volumes(array: np.ndarray, affine: np.ndarray, num_classes: int) -> list[float]:
    """Volume in mm^3 of classes 1..K-1 (voxel count x |det(affine[:3, :3])|)."""
    voxel = abs(float(np.linalg.det(affine[:3, :3])))
    counts = np.bincount(array.ravel().astype(np.int64), minlength=num_classes)
    return [float(counts[k]) * voxel for k in range(1, num_classes)]
