"""Reading a 3D volume: a NIfTI file (nibabel) or a DICOM series folder (pydicom), and the way back to its grid.

Loading one sample (:class:`VolumeLoader`, in this order):

1. read the volume and its voxel-to-world affine and reorient it to RAS+ (nibabel's closest canonical
   orientation), so that axis 0 (H) runs from the patient's left to right, axis 1 (W) from posterior to
   anterior and axis 2 (D) from inferior to superior. DICOM series: slices are ordered by their position
   along the slice normal (one series, evenly spaced, every position and orientation given: refused otherwise,
   :mod:`medattn.data.readers.dicom_series`), RescaleSlope/RescaleIntercept are applied, LPS is converted to RAS.
2. subtraction (optional): the volume in ``subtract_column`` (same grid) is subtracted:
   ``input = volume(path_column) - volume(subtract_column)``. For the paper's DUKE images, "subtracting
   the post-contrast scans from the pre-contrast scans", put the pre-contrast series in ``path_column``
   and the post-contrast series in ``subtract_column``; swap them for the usual post minus pre.
3. resampling (optional) to ``target_spacing`` in mm (trilinear, ``F.interpolate``).
4. left/right split (optional, ``split_sides``): at the median plane of axis 0 into two samples;
   ``left`` = the lower half of axis 0 (the patient's left in RAS+), ``right`` = the upper half (with
   an odd size the middle plane goes to the right half). Their labels come from the columns
   ``<label column>_left`` and ``<label column>_right``.
5. centre crop or pad (with the volume's minimum) to ``target_size`` (per side when split); a segmentation model's
   prediction (``whole``) only pads, so the whole volume is segmented (by sliding windows of ``target_size``).
6. intensity normalisation: ``zscore`` (mean 0, std 1 over the sample), ``percentile`` (clip to the
   0.5 and 99.5 percentiles, scale to [0, 1]) or ``none``.
7. training augmentation (``augment``): flips along every axis with p = 0.5 (the paper's), by default
   followed by crops, elastic and intensity transforms (``strong``).

The sample is (1, H, W, D). :func:`to_native_grid` takes a map on that grid back to the file's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from ...errors import UserError
from ...outputs import OutputFolder
from ..files import check_regular
from ..transforms import Augmentation
from .dicom_series import read_dicom_series, series_geometry

if TYPE_CHECKING:
    from ...vocabulary.record import Record

NIFTI_SUFFIXES = (".nii", ".nii.gz")
NORMALISATIONS = ("zscore", "percentile", "none")


def is_nifti(path: Path) -> bool:
    return path.name.lower().endswith(NIFTI_SUFFIXES)


def _read_nifti(path: Path) -> tuple[np.ndarray, np.ndarray]:
    import nibabel as nib

    image = nib.load(path)
    array = np.asarray(image.dataobj, dtype=np.float32)  # applies scl_slope / scl_inter
    if array.ndim == 4 and array.shape[-1] == 1:
        array = array[..., 0]
    return array, image.affine


def ras_grid(shape: tuple[int, ...], affine: np.ndarray) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """A stored 3D array's (H, W, D) shape and voxel spacing in mm (the affine's column norms) once reoriented
    to RAS+ as :func:`read_volume` does."""
    from nibabel import orientations as ornt

    to_ras = ornt.ornt_transform(ornt.io_orientation(affine), ornt.axcodes2ornt("RAS"))
    spacing = np.linalg.norm(np.asarray(affine)[:3, :3], axis=0)
    ras_shape, ras_spacing = [0, 0, 0], [0.0, 0.0, 0.0]
    for axis, (target, _) in enumerate(to_ras):
        ras_shape[int(target)], ras_spacing[int(target)] = int(shape[axis]), float(spacing[axis])
    return tuple(ras_shape), tuple(ras_spacing)


def resampled_shape(shape: tuple[int, ...], spacing: tuple[float, ...], target: tuple[float, ...]) -> list[int]:
    """The grid :func:`resample` makes of ``shape`` voxels of ``spacing`` mm at ``target`` mm (same extent)."""
    return [max(1, round(n * s / t)) for n, s, t in zip(shape, spacing, target)]


def read_volume(path: Path) -> tuple[torch.Tensor, tuple[float, float, float]]:
    """-> (volume (H, W, D) float32 in RAS+ orientation, voxel spacing in mm along H, W, D)."""
    from nibabel import orientations as ornt

    check_regular(path, folders=True)
    if path.is_dir():
        array, affine = read_dicom_series(path)
    elif is_nifti(path):
        array, affine = _read_nifti(path)
    else:
        raise ValueError("expected a NIfTI file (.nii, .nii.gz) or a folder holding one DICOM series")
    if array.ndim != 3:
        raise ValueError(f"expected a 3D volume, got an array of shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError("the volume holds NaN or Inf values")
    _, spacing = ras_grid(array.shape, affine)
    array = ornt.apply_orientation(array, ornt.ornt_transform(ornt.io_orientation(affine), ornt.axcodes2ornt("RAS")))
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32)), spacing


def _check_nifti_complete(path: Path, image) -> None:
    """The data the header declares are in the file: ``.nii``: the file size; ``.nii.gz``: the gzip
    trailer's length of the uncompressed data (mod 2^32), and only when it differs (a truncated file,
    or a file of several gzip members) the whole stream is decompressed once to decide."""
    import gzip
    import zlib

    header = image.header
    expected = int(header.get_data_offset()) + int(np.prod(header.get_data_shape())) * header.get_data_dtype().itemsize
    if not path.name.lower().endswith(".gz"):
        if path.stat().st_size < expected:
            raise ValueError(f"the NIfTI file is truncated: the header declares {expected} bytes, the file has "
                             f"{path.stat().st_size}")
        return
    with path.open("rb") as f:
        f.seek(-4, 2)
        if int.from_bytes(f.read(4), "little") == expected % 2**32:
            return
    try:
        with gzip.open(path, "rb") as f:
            total = sum(len(block) for block in iter(lambda: f.read(1 << 22), b""))
    except (OSError, EOFError, zlib.error) as exc:
        raise ValueError(f"the NIfTI file is truncated or corrupt ({exc})") from None
    if total < expected:
        raise ValueError(f"the NIfTI file is truncated: the header declares {expected} bytes, it holds {total}")


def check_volume_header(path: Path) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
    """Cheap check at build time: a DICOM series folder whose headers make one regular grid
    (:func:`~medattn.data.readers.dicom_series.series_geometry`), or a regular NIfTI file whose header describes a 3D
    volume and whose data are not cut short. Returns the grid in RAS+ axis order as the loader reorients it,
    ((H, W, D), voxel spacing in mm)."""
    check_regular(path, folders=True)
    if path.is_dir():
        geometry = series_geometry(path)
        return ras_grid(geometry.shape, geometry.affine)
    if not is_nifti(path):
        raise ValueError("expected a NIfTI file (.nii, .nii.gz) or a folder holding one DICOM series")
    import nibabel as nib

    try:
        image = nib.load(path)
    except nib.filebasedimages.ImageFileError:  # nibabel's word for a header cut short: "cannot work out file type"
        raise ValueError("its header does not read: the file is truncated, or not NIfTI") from None
    shape = image.shape
    if not (len(shape) == 3 or (len(shape) == 4 and shape[-1] == 1)):
        raise ValueError(f"expected a 3D volume, the header says shape {shape}")
    _check_nifti_complete(path, image)
    return ras_grid(shape[:3], image.affine)


def resample(volume: torch.Tensor, spacing: tuple[float, ...], target: tuple[float, ...]) -> torch.Tensor:
    """(H, W, D) with voxel ``spacing`` -> the grid with voxel ``target`` (trilinear, same extent)."""
    size = resampled_shape(volume.shape, spacing, target)
    if list(volume.shape) == size:
        return volume
    return F.interpolate(volume[None, None], size=size, mode="trilinear", align_corners=False)[0, 0]


def crop_or_pad(volume: torch.Tensor, size: tuple[int, ...]) -> torch.Tensor:
    """Centre crop or pad (with the minimum value) (H, W, D) to ``size``."""
    fill = float(volume.min()) if volume.numel() else 0.0
    out = volume.new_full(size, fill)
    src, dst = [], []
    for n, m in zip(volume.shape, size):
        if n >= m:
            start = (n - m) // 2
            src.append(slice(start, start + m))
            dst.append(slice(0, m))
        else:
            start = (m - n) // 2
            src.append(slice(0, n))
            dst.append(slice(start, start + n))
    out[tuple(dst)] = volume[tuple(src)]
    return out


def uncrop_or_unpad(x: torch.Tensor, size: tuple[int, ...], fill: float = 0) -> torch.Tensor:
    """Inverse of :func:`crop_or_pad`: the grid ``x`` (the loader's size) put back on a grid of ``size`` (the
    grid before crop/pad) with the same centring, so each voxel returns to where it came from; voxels the
    crop cut away get ``fill``."""
    out = x.new_full(size, fill)
    src, dst = [], []
    for n, m in zip(size, x.shape):  # the loader took m voxels from n
        if n >= m:  # the crop kept [start, start + m) of n
            src.append(slice(0, m))
            dst.append(slice((n - m) // 2, (n - m) // 2 + m))
        else:  # the pad put n voxels at [start, start + n) of m
            src.append(slice((m - n) // 2, (m - n) // 2 + n))
            dst.append(slice(0, n))
    out[tuple(dst)] = x[tuple(src)]
    return out


def native_grid(path: Path) -> tuple[tuple[int, int, int], np.ndarray]:
    """(array shape, voxel-to-world affine) of a volume as stored: a NIfTI file's header, or the (columns, rows,
    slices) array and RAS affine :func:`read_volume` builds for a DICOM series folder."""
    if path.is_dir():
        geometry = series_geometry(path)
        return geometry.shape, geometry.affine
    if not is_nifti(path):
        raise UserError(f"{path}: expected a NIfTI file or a DICOM series folder")
    import nibabel as nib

    image = nib.load(path)
    return tuple(int(n) for n in image.shape[:3]), np.asarray(image.affine, dtype=np.float64)


def to_native_grid(values: torch.Tensor, path: Path, spacing: tuple[float, ...] | None) -> tuple[np.ndarray,
                                                                                                  np.ndarray]:
    """A map (H, W, D) on the loader's grid (heatmap, label map) -> (the map on the file's own array grid,
    the file's affine), so voxel (i, j, k) of the map is voxel (i, j, k) of the input.

    Undoes :class:`VolumeLoader`'s steps in reverse: un-crop/un-pad (:func:`uncrop_or_unpad`, 0 where the crop
    cut voxels away), the resampling to ``spacing`` (nearest neighbour, to the RAS+ grid's exact size), and the
    reorientation to RAS+. The dtype of ``values`` is kept."""
    from nibabel import orientations as ornt

    shape, affine = native_grid(path)
    ras_shape, ras_spacing = ras_grid(shape, affine)
    resampled = ras_shape if spacing is None else resampled_shape(ras_shape, ras_spacing, spacing)
    values = uncrop_or_unpad(values, tuple(resampled))
    if tuple(values.shape) != ras_shape:
        values = F.interpolate(values[None, None].float(), size=ras_shape, mode="nearest-exact")[0, 0].to(values.dtype)
    back = ornt.ornt_transform(ornt.axcodes2ornt("RAS"), ornt.io_orientation(affine))
    return np.ascontiguousarray(ornt.apply_orientation(values.numpy(), back)), affine


def write_nifti(out: OutputFolder, name: str, array: np.ndarray, affine: np.ndarray) -> None:
    """Save ``array`` as the NIfTI file ``name`` in ``out`` with ``affine`` as its sform and qform (code 1, scanner
    space), atomically."""
    import nibabel as nib

    image = nib.Nifti1Image(array, affine)
    image.set_sform(affine, code=1)
    image.set_qform(affine, code=1)
    with out.write(name) as tmp:
        nib.save(image, str(tmp))


def normalise(volume: torch.Tensor, method: str) -> torch.Tensor:
    """``zscore``, ``percentile`` (0.5-99.5 clipped to [0, 1]) or ``none``."""
    if method == "zscore":
        return (volume - volume.mean()) / volume.std().clamp_min(1e-6)
    if method == "percentile":
        low, high = torch.quantile(volume.flatten()[:: max(1, volume.numel() // 1_000_000)],
                                   torch.tensor([0.005, 0.995])).tolist()
        return ((volume - low) / max(high - low, 1e-6)).clamp(0, 1)
    return volume


class VolumeLoader:
    """record -> {"input": (1, H, W, D)}: the steps of the module docstring. ``whole``: step 5 pads up to ``size``
    and never crops (a segmentation model predicting a whole volume by sliding windows), so (H, W, D) is at least
    ``size`` along every axis."""

    def __init__(self, spacing: tuple[float, ...] | None, size: tuple[int, ...], method: str,
                 augment: Augmentation | None = None, whole: bool = False) -> None:
        self.spacing, self.size, self.method, self.augment, self.whole = spacing, size, method, augment, whole

    def __call__(self, record: Record) -> dict:
        volume, spacing = read_volume(record.paths[0])
        if len(record.paths) > 1:
            other, _ = read_volume(record.paths[1])
            if other.shape != volume.shape:
                raise ValueError(f"cannot subtract volumes of shapes {tuple(volume.shape)} and {tuple(other.shape)}")
            volume = volume - other
        if self.spacing is not None:
            volume = resample(volume, spacing, self.spacing)
        side = record.extra.get("side")
        if side is not None:
            middle = volume.shape[0] // 2
            volume = volume[:middle] if side == "left" else volume[middle:]
        size = tuple(map(max, volume.shape, self.size)) if self.whole else self.size
        volume = normalise(crop_or_pad(volume, size), self.method)[None]
        if self.augment is not None:
            volume = self.augment(volume)
        return {"input": volume.contiguous()}
