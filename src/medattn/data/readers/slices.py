"""Reading a file for a 2D model trained on slices of volumes (``nifti_slices``, ``synthetic_mri_slices``): a volume
as its validation volumes were, with the slicing axis last, or a 2D image as one slice (:class:`SliceFileLoader`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .images import match_channels, read_image
from .volumes import crop_or_pad, is_nifti, normalise, read_volume, resample

if TYPE_CHECKING:
    from ...vocabulary.record import Record


def in_plane(volume: torch.Tensor, axis: int, size: tuple[int, int]) -> torch.Tensor:
    """Centre crop or pad (with the minimum) the two axes other than ``axis`` of (H, W, D) to ``size``."""
    full = list(size)
    full.insert(axis, volume.shape[axis])
    return crop_or_pad(volume, tuple(full))


def is_volume_file(path: Path) -> bool:
    """A NIfTI file or a DICOM series folder (else a 2D image file)."""
    return path.is_dir() or is_nifti(path)


class SliceFileLoader:
    """record -> {"input": ...}: a file prepared for a 2D model trained on slices of volumes, as its validation
    volumes were (:class:`~medattn.data.kinds.slices.NiftiVolumes`,
    :class:`~medattn.data.kinds.slices.VolumeDataset`).

    A volume (NIfTI file or DICOM series folder): RAS+, resampled to ``spacing`` (when given), normalised as a
    whole, cropped or padded in-plane to ``size``, the slicing ``axis`` moved last: (1, h, w, S). A 2D image file
    (PNG, JPEG, TIFF, DICOM): one slice, grey in [0, 1], normalised as a whole, cropped or padded: (1, h, w).
    ``whole`` (a segmenter's prediction by sliding windows): padded up to ``size``, never cropped, so (h, w) is at
    least ``size``.
    """

    def __init__(self, spacing: tuple[float, ...] | None, size: tuple[int, int], method: str, axis: int,
                 whole: bool = False) -> None:
        self.spacing, self.size, self.method, self.axis, self.whole = spacing, size, method, axis, whole

    def _size(self, plane: tuple[int, ...]) -> tuple[int, ...]:
        """The in-plane size a slice of in-plane shape ``plane`` is cropped or padded to."""
        return tuple(map(max, plane, self.size)) if self.whole else self.size

    def __call__(self, record: Record) -> dict:
        path = record.paths[0]
        if not is_volume_file(path):
            image = match_channels(read_image(path), 1)[0]  # (H, W)
            return {"input": crop_or_pad(normalise(image, self.method), self._size(image.shape))[None].contiguous()}
        volume, spacing = read_volume(path)
        if self.spacing is not None:
            volume = resample(volume, spacing, self.spacing)
        plane = [n for a, n in enumerate(volume.shape) if a != self.axis]
        volume = in_plane(normalise(volume, self.method), self.axis, self._size(plane))
        return {"input": volume.movedim(self.axis, -1)[None].float().contiguous()}
