"""Segmentation outputs on the input's own grid: label maps as NIfTI (or PNG) files and per-structure sizes.

The model sees the volume after :mod:`medattn.data.readers.volumes`' steps: reoriented to RAS+, resampled to the
target spacing (optional), centre-cropped or padded to the target size. :func:`to_input_grid` undoes them
in reverse order for a label map: un-crop/un-pad (voxels the crop cut away are background, 0), nearest-
neighbour resampling back to the RAS+ grid, and the inverse reorientation, so the map has the input
file's array shape and is saved with the input's affine (voxel (i, j, k) of the map is voxel (i, j, k)
of the input). A structure's volume is its voxel count times ``|det(affine[:3, :3])|`` (mm^3 per voxel).

A 2D model trained on slices (``slice_axis``) segments a volume slice by slice, its map coming back with the
slicing axis last ((h, w, S)); :func:`write_label_map` puts the axis back first. A 2D image file given to such
a model gets a PNG label map (pixel value = class index) on the image's own size, its sizes in pixels only (and, a DICOM
image, a DICOM Segmentation of that map referencing it).

A segmentation model segments the **whole** input, never only its training crop: a 3D model's volume is prepared
uncropped (padded up to the model's input size where smaller, :class:`~medattn.data.readers.volumes.VolumeLoader`
``whole``), a slice model's volume or image uncropped in-plane, and, where it is larger than that size along an axis,
predicted by sliding windows of the model's input size (a slice model's windows in-plane, every slice at once)
(:func:`whole_volume_probabilities`): windows overlapping by half (:data:`~medattn.runtime.sliding.DEFAULT_OVERLAP`,
nnU-Net's), their probabilities blended with a Gaussian importance map (MONAI's ``sliding_window_inference``
conventions, :mod:`medattn.runtime.sliding`), the same for a checkpoint and an exported graph. A model trained on
patches slides its own patch window (logits blended, as eval predicts). The label map and the volumes in the CSV
cover every voxel of the input.

A DICOM series gets the RAS affine the volume reader builds from its slice positions and orientation, and its label map
also as a DICOM Segmentation referencing the series (:mod:`medattn.runtime.dicom_results`, with highdicom).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from medattn.data.preprocessing import Preprocessing
from medattn.data.readers.volumes import to_native_grid
from medattn.runtime.dicom_report import is_dicom_input
from medattn.runtime.dicom_results import is_dicom_series


def whole_volume_probabilities(runner, batch: dict) -> tuple[np.ndarray, bool]:
    """A segmentation model's probabilities of one whole input ``batch["input"]`` (a 3D model's volume (1, 1, H, W, D)
    -> (1, K, H, W, D); a slice model's volume (1, 1, H, W, S) -> (1, K, H, W, S), or image (1, 1, H, W)
    -> (1, K, H, W)) by :class:`~medattn.deploy.runtime.Runner` ``runner``, and whether sliding windows of the model's
    input size made them (the module docstring; a slice model's windows are in-plane, over all slices at once): the
    runner's own forward where the input fits that size, or where the runner slides its own patch window."""
    from medattn.runtime.sliding import DEFAULT_OVERLAP, sliding_window_logits

    window = tuple(runner.preprocessing.input_shape[1:])
    inputs = batch["input"]
    if runner.window is not None or all(n <= m for n, m in zip(inputs.shape[2:], window)):
        return runner.probabilities(batch), False

    def run(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.asarray(runner.probabilities({**batch, "input": x}), dtype=np.float32))

    if inputs.ndim == len(window) + 2:  # windows of the model's own input
        return sliding_window_logits(run, inputs, window, DEFAULT_OVERLAP).numpy(), True
    slices = inputs.shape[-1]  # a slice model's volume: the slices as channels, in-plane windows

    def in_plane(windows: torch.Tensor) -> torch.Tensor:  # (n, S, h, w) -> (n, S K, h, w)
        volumes = windows.permute(0, 2, 3, 1)[:, None]  # (n, 1, h, w, S)
        return torch.cat([run(v[None])[0].permute(3, 0, 1, 2).flatten(0, 1)[None] for v in volumes])

    planes = inputs[:, 0].permute(0, 3, 1, 2)  # (1, S, H, W)
    blended = sliding_window_logits(in_plane, planes, window, DEFAULT_OVERLAP)  # (1, S K, H, W)
    blended = blended.unflatten(1, (slices, -1)).permute(0, 2, 3, 4, 1)  # (1, K, H, W, S)
    return blended.numpy(), True


def sliding_note(count: int, prep: Preprocessing) -> str:
    """The line telling that ``count`` volumes larger than the model's input were segmented whole by sliding windows
    of its size (the module docstring)."""
    from medattn.runtime.sliding import DEFAULT_OVERLAP

    size = " x ".join(map(str, prep.input_shape[1:]))
    what = "volume(s)" if prep.slice_axis is None else "input(s) (in-plane)"
    return (f"segmented {count} {what} larger than the model's {size} input whole, by sliding windows of that size "
            f"(overlap {DEFAULT_OVERLAP:g}, Gaussian-weighted blending of the probabilities, MONAI's "
            f"sliding_window_inference convention)")


def to_input_grid(labels: torch.Tensor, path: Path, prep: Preprocessing) -> tuple[np.ndarray, np.ndarray]:
    """Label map (H, W, D) on the model's grid -> (label map on the input file's grid (uint8/int16), affine)."""
    array, affine = to_native_grid(labels.to(torch.int64), path, prep.spacing)
    return array.astype(np.uint8 if prep.num_outputs <= 256 else np.int16), affine


def structure_volumes(array: np.ndarray, affine: np.ndarray, num_classes: int) -> list[float]:
    """Volume in mm^3 of classes 1..K-1 (voxel count x |det(affine[:3, :3])|)."""
    voxel = abs(float(np.linalg.det(affine[:3, :3])))
    return [float(n) * voxel for n in structure_counts(array, num_classes)]


def structure_counts(array: np.ndarray, num_classes: int) -> list[int]:
    """Voxels (pixels) of classes 1..K-1."""
    counts = np.bincount(array.ravel().astype(np.int64), minlength=num_classes)
    return [int(counts[k]) for k in range(1, num_classes)]


def label_map_name(path: Path, prep: Preprocessing, stem: str) -> str:
    """The file name of input ``path``'s label map: ``<stem>_labels.png`` for a 2D image given to a slice model,
    else ``<stem>_labels.nii.gz``."""
    from medattn.data.readers.slices import is_volume_file

    image = prep.slice_axis is not None and not is_volume_file(path)
    return f"{stem}_labels.png" if image else f"{stem}_labels.nii.gz"


def write_label_map(labels: torch.Tensor, path: Path, prep: Preprocessing, out, stem: str, dicom=None
                    ) -> tuple[Path, list[int], list[float] | None]:
    """Label map on the model's grid ((H, W, D); a slice model's (h, w, S) or (h, w)) -> written into ``out``
    (:class:`~medattn.outputs.OutputFolder`) on the input's grid as :func:`label_map_name`; for a DICOM series,
    or a 2D DICOM image, the same map also as a DICOM Segmentation by ``dicom``
    (:class:`~medattn.runtime.dicom_results.SegmentationWriter`, when given). Returns (the file, voxels per class
    1..K-1, mm^3 per class or None for 2D images)."""
    from medattn.data.readers.slices import is_volume_file
    from medattn.data.readers.volumes import uncrop_or_unpad, write_nifti

    if prep.slice_axis is not None and not is_volume_file(path):
        from PIL import Image

        from medattn.data.readers.images import read_image

        size = tuple(read_image(path).shape[1:])
        array = uncrop_or_unpad(labels.to(torch.int64), size).numpy().astype(np.uint8)
        with out.write(label_map_name(path, prep, stem)) as tmp:
            Image.fromarray(array).save(tmp, format="PNG")
        if dicom is not None and is_dicom_input(path):  # a 2D DICOM image: its Segmentation too
            dicom.write_image(array, path, prep.output_names, out, stem)
        return out.path(label_map_name(path, prep, stem)), structure_counts(array, prep.num_outputs), None
    if prep.slice_axis is not None:
        labels = labels.movedim(-1, prep.slice_axis)
    array, affine = to_input_grid(labels, path, prep)
    write_nifti(out, label_map_name(path, prep, stem), array, affine)
    if dicom is not None and is_dicom_series(path):
        dicom.write(array, affine, path, prep.output_names, out, stem)
    volumes = structure_volumes(array, affine, prep.num_outputs)
    return out.path(label_map_name(path, prep, stem)), structure_counts(array, prep.num_outputs), volumes
