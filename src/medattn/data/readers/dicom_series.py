"""A DICOM series folder read as a viewer reads it: one series, its slices ordered along their normal, on one grid.

:func:`series_geometry` reads the headers of every file of the folder (hidden files left out) and:

1. groups the instances by SeriesInstanceUID. A folder holding several series is refused with a line naming each
   (UID, modality, instance count, description), unless one of them was chosen (``medattn predict --dicom-series
   UID``, :func:`choose_series`); a folder holding none, or several, of the chosen UIDs is refused too. A folder of
   one series is read whatever was chosen.
2. requires of every instance an ImagePositionPatient, an ImageOrientationPatient, PixelSpacing, Rows and Columns:
   nothing is guessed (a missing one is refused naming the file). All instances must share the orientation (to
   1e-4), the pixel spacing and the image size.
3. orders the instances by their position projected on the slice normal ``n = row direction x column direction``
   (ascending), and refuses two slices at one position (a duplicate), slices whose spacing along ``n`` is uneven
   (a gap: a missing slice) and positions that do not lie along ``n`` (a tilted gantry or a sheared stack): on such a
   series one affine cannot place every slice, so a label map, a DICOM Segmentation or a volume in mm^3 would be
   wrong. Tolerances: duplicates closer than 1e-3 mm; spacing and in-plane offsets within 1 % of the median spacing
   (at least 1e-3 mm).

The grid: voxel (i, j, k) is column i, row j of the k-th slice along ``n``; its affine (RAS, as NIfTI) has columns
``row_direction * column_spacing``, ``column_direction * row_spacing``, ``n * slice_spacing`` and the first slice's
ImagePositionPatient as origin, LPS (DICOM) turned into RAS. A one-slice series takes SpacingBetweenSlices, else
SliceThickness, else 1 mm along ``n``. This is the geometry SimpleITK's ImageSeriesReader gives the series (LPS); the
tests compare the two on series written in each of these shapes.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import UserError

#: The SeriesInstanceUIDs chosen for folders holding several series (``--dicom-series``).
_CHOSEN: ContextVar[frozenset[str]] = ContextVar("chosen_dicom_series", default=frozenset())
DUPLICATE_MM = 1e-3
RELATIVE = 0.01
ORIENTATION = 1e-4


@contextlib.contextmanager
def choose_series(uids):
    """Within the block, a folder holding several series is read as its series whose SeriesInstanceUID is one of
    ``uids`` (an iterable of strings; empty: none chosen, such a folder is refused)."""
    token = _CHOSEN.set(frozenset(str(u) for u in uids or ()))
    try:
        yield
    finally:
        _CHOSEN.reset(token)


@dataclass(frozen=True)
class SeriesGeometry:
    """One DICOM series on its grid: ``files`` ordered along the slice normal (slice k is ``files[k]``), ``headers``
    (pydicom datasets without pixels, same order), ``shape`` (columns, rows, slices), ``affine`` (4, 4) RAS, ``uid``
    (its SeriesInstanceUID, "" when the files carry none)."""

    files: tuple[Path, ...]
    headers: tuple
    shape: tuple[int, int, int]
    affine: np.ndarray
    uid: str


def folder_files(folder: Path) -> list[Path]:
    """The files of a DICOM series folder, sorted, hidden files left out; a ValueError when there are none."""
    files = sorted(p for p in Path(folder).iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise ValueError("the DICOM series folder is empty")
    return files


def _headers(folder: Path) -> list[tuple[Path, object]]:
    """(file, header without pixels) of every file of ``folder``; a UserError naming a file that is not DICOM."""
    import pydicom
    from pydicom.errors import InvalidDicomError

    out = []
    for path in folder_files(folder):
        try:
            out.append((path, pydicom.dcmread(path, stop_before_pixels=True)))
        except InvalidDicomError:
            raise UserError(f"{path}: not a DICOM file (a DICOM series folder holds the series' files only)") from None
    return out


def _one_series(folder: Path, headers: list[tuple[Path, object]]) -> tuple[str, list[tuple[Path, object]]]:
    """(the SeriesInstanceUID, its instances) of the series to read: the folder's only one, or the chosen one."""
    groups: dict[str, list] = {}
    for path, ds in headers:
        groups.setdefault(str(ds.get("SeriesInstanceUID", "") or ""), []).append((path, ds))
    chosen = _CHOSEN.get()
    picked = [uid for uid in groups if uid in chosen]
    if len(groups) == 1:  # the option chooses among several series only
        return next(iter(groups.items()))
    if len(picked) == 1:
        return picked[0], groups[picked[0]]

    def described(uid: str) -> str:
        ds = groups[uid][0][1]
        what = " ".join(str(ds.get(k, "") or "") for k in ("Modality", "SeriesDescription")).strip()
        return f"{uid or '(no SeriesInstanceUID)'} ({len(groups[uid])} files{', ' + what if what else ''})"

    listed = "; ".join(described(uid) for uid in groups)
    if chosen:
        raise UserError(f"{folder}: holds {len(picked) or 'none'} of the series chosen by --dicom-series "
                        f"({', '.join(sorted(chosen))}), not one; it holds {listed}")
    raise UserError(f"{folder}: holds {len(groups)} DICOM series, read one at a time: {listed}; give each series its "
                    f"own folder, or choose one with predict's --dicom-series UID")


def _vector(path: Path, ds, keyword: str, size: int) -> np.ndarray:
    """The numbers of attribute ``keyword`` of ``ds`` (``size`` of them); a UserError naming ``path`` without it."""
    value = ds.get(keyword)
    try:
        out = np.array([float(v) for v in value], dtype=np.float64) if value is not None else None
    except (TypeError, ValueError):
        out = None
    if out is None or out.shape != (size,) or not np.isfinite(out).all():
        raise UserError(f"{path}: no valid {keyword}: the slice's place in the volume is unknown (nothing is guessed)")
    return out


def _slice_spacing(folder: Path, files: list[Path], along: np.ndarray, offsets: np.ndarray, first) -> float:
    """The spacing of slices at ``along`` (their sorted positions on the normal, mm) with in-plane ``offsets`` (k, 3)
    from the first slice; a UserError naming the files at a duplicate position, a gap or a position off the normal."""
    if len(along) == 1:
        return float(first.get("SpacingBetweenSlices", 0) or first.get("SliceThickness", 0) or 1.0)
    steps = np.diff(along)
    for k in np.flatnonzero(steps < DUPLICATE_MM):
        raise UserError(f"{folder}: {files[k].name} and {files[k + 1].name} lie at one position ({along[k]:.3f} mm "
                        f"along the slice normal): a duplicate slice, or two acquisitions in one series")
    spacing = float(np.median(steps))
    tolerance = max(DUPLICATE_MM, RELATIVE * spacing)
    for k in np.flatnonzero(np.abs(steps - spacing) > tolerance):
        raise UserError(f"{folder}: the slices are not evenly spaced: {files[k].name} and {files[k + 1].name} are "
                        f"{steps[k]:.3f} mm apart, the others {spacing:.3f} mm (a missing slice?); refused rather "
                        f"than put on a wrong grid")
    off = np.linalg.norm(offsets, axis=1)
    for k in np.flatnonzero(off > tolerance):
        raise UserError(f"{folder}: {files[k].name} lies {off[k]:.3f} mm off the line of the first slice's normal "
                        f"(a tilted gantry or a sheared stack): one affine cannot place its slices")
    return spacing


def series_geometry(folder: Path) -> SeriesGeometry:
    """The series of DICOM folder ``folder`` and its grid, from the headers alone (the steps of the module
    docstring); a UserError naming the folder or file for what it refuses."""
    folder = Path(folder)
    uid, instances = _one_series(folder, _headers(folder))
    first_path, first = instances[0]
    orientation = _vector(first_path, first, "ImageOrientationPatient", 6)
    spacing_rc = _vector(first_path, first, "PixelSpacing", 2)
    size = (int(first.get("Rows", 0) or 0), int(first.get("Columns", 0) or 0))
    positions = []
    for path, ds in instances:
        if np.abs(_vector(path, ds, "ImageOrientationPatient", 6) - orientation).max() > ORIENTATION:
            raise UserError(f"{folder}: {path.name} is oriented otherwise than {first_path.name} "
                            f"(ImageOrientationPatient {list(ds.ImageOrientationPatient)} vs "
                            f"{list(first.ImageOrientationPatient)}): one series, one orientation")
        if not np.allclose(_vector(path, ds, "PixelSpacing", 2), spacing_rc, rtol=1e-4, atol=1e-6):
            raise UserError(f"{folder}: {path.name} has another PixelSpacing than {first_path.name}")
        if (int(ds.get("Rows", 0) or 0), int(ds.get("Columns", 0) or 0)) != size or not all(size):
            raise UserError(f"{folder}: {path.name} is {ds.get('Rows')} x {ds.get('Columns')} pixels, "
                            f"{first_path.name} {size[0]} x {size[1]}: the slices of a series share one size")
        positions.append(_vector(path, ds, "ImagePositionPatient", 3))
    row_dir, col_dir = orientation[:3], orientation[3:]
    if abs(np.linalg.norm(row_dir) - 1) > 1e-3 or abs(np.linalg.norm(col_dir) - 1) > 1e-3 \
            or abs(row_dir @ col_dir) > 1e-3:
        raise UserError(f"{first_path}: ImageOrientationPatient {list(orientation)} is not two orthogonal unit vectors")
    normal = np.cross(row_dir, col_dir)
    positions = np.array(positions)
    order = np.argsort(positions @ normal, kind="stable")
    positions = positions[order]
    files = [instances[i][0] for i in order]
    along = positions @ normal
    offsets = (positions - positions[0]) - np.outer(along - along[0], normal)
    slice_spacing = _slice_spacing(folder, files, along, offsets, first)
    affine = np.eye(4)
    affine[:3, 0] = row_dir * spacing_rc[1]  # the column index runs along the row direction
    affine[:3, 1] = col_dir * spacing_rc[0]
    affine[:3, 2] = normal * slice_spacing
    affine[:3, 3] = positions[0]
    affine[:2] *= -1  # LPS (DICOM) -> RAS (NIfTI)
    return SeriesGeometry(tuple(files), tuple(instances[i][1] for i in order), (size[1], size[0], len(files)),
                          affine, uid)


def read_dicom_series(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """DICOM series folder -> (array (columns, rows, slices) float32 with RescaleSlope/RescaleIntercept applied,
    affine (4, 4) in RAS) on the grid of :func:`series_geometry`."""
    import pydicom

    geometry = series_geometry(folder)
    planes = []
    for path in geometry.files:
        ds = pydicom.dcmread(path)
        pixels = ds.pixel_array
        if pixels.ndim != 2:
            raise ValueError(f"{path.name}: every file of a DICOM series must hold one 2D slice, got shape "
                             f"{pixels.shape}")
        slope, intercept = float(ds.get("RescaleSlope", 1) or 1), float(ds.get("RescaleIntercept", 0) or 0)
        planes.append(pixels.astype(np.float32) * slope + intercept)
    array = np.stack(planes, axis=-1).transpose(1, 0, 2)  # (rows, cols, k) -> (cols, rows, k)
    return np.ascontiguousarray(array), geometry.affine
