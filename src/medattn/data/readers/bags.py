"""A bag of tile features: one HDF5 file per slide, CLAM (``features``) or STAMP (``feats``) layout, with ``coords``
(N, 2); a patient's slides are joined into one bag (:class:`BagLoader`). The layouts are read here and written
here (:func:`write_bag`, the one writer of a bag file)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ...errors import UserError
from ...outputs import OutputFolder
from ..bag_rows import check_stored
from ..files import check_regular

if TYPE_CHECKING:
    from ...vocabulary.record import Record

LAYOUTS = ("features", "feats")  # CLAM, STAMP
WRITTEN_LAYOUTS = ("clam", "stamp")  # what write_bag writes, by name


def subsample(features: torch.Tensor, coords: torch.Tensor, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep a random ``limit`` instances of a bag (all if it is shorter), in their original order.

    Uses torch's global RNG (seeded by :mod:`medattn.train.loop` per epoch and worker)."""
    if features.shape[0] <= limit:
        return features, coords
    keep = torch.randperm(features.shape[0])[:limit].sort().values
    return features[keep], coords[keep]


def feature_key(h5file) -> str:
    """The features dataset of an open HDF5 file: "features" (CLAM) or "feats" (STAMP)."""
    for key in LAYOUTS:
        if key in h5file:
            return key
    raise ValueError(f"no features dataset ('features' as CLAM writes, or 'feats' as STAMP writes); "
                     f"datasets are {sorted(h5file.keys())}")


def slide_shape(path: Path) -> tuple[int, int]:
    """Cheap check: -> (N, F) from the HDF5 header; ValueError for a bad layout, an empty bag or a dataset
    not stored in full (:func:`~medattn.data.bag_rows.stored_rows`)."""
    import h5py

    check_regular(path)
    with h5py.File(path, "r") as f:
        key = feature_key(f)
        features = f[key]
        if features.ndim != 2:
            raise ValueError(f"features must be (N, F), got shape {features.shape}")
        if features.shape[0] == 0:
            raise ValueError("empty bag: the slide has no patches")
        check_stored(key, features)
        if "coords" in f:
            if f["coords"].ndim != 2 or f["coords"].shape != (features.shape[0], 2):
                raise ValueError(f"coords must be ({features.shape[0]}, 2), got {f['coords'].shape}")
            check_stored("coords", f["coords"])
        return tuple(features.shape)


def bag_header(path: Path) -> tuple[int, dict]:
    """(tiles, HDF5 attributes) of a bag file, from its header; UserError naming the file otherwise."""
    import h5py

    try:
        rows, _ = slide_shape(path)
        with h5py.File(path, "r") as f:
            return rows, dict(f.attrs)
    except (OSError, ValueError) as error:
        if isinstance(error, UserError):
            raise
        raise UserError(f"{path}: {error}") from None


def read_slide(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (features (N, F) float32, coords (N, 2) float32, zeros if the file has none)."""
    import h5py

    rows = slide_shape(path)[0]  # refuses datasets not stored in full: no fill values are read as patches
    with h5py.File(path, "r") as f:
        features = torch.from_numpy(np.asarray(f[feature_key(f)][:rows], dtype=np.float32))
        coords = (torch.from_numpy(np.asarray(f["coords"][:rows], dtype=np.float32)) if "coords" in f
                  else torch.zeros(features.shape[0], 2))
    if not torch.isfinite(features).all():
        bad = int((~torch.isfinite(features)).any(dim=1).sum())
        raise ValueError(f"NaN or Inf in the features of {bad} of {features.shape[0]} patches")
    return features, coords


class BagLoader:
    """record -> {"input": (N, F), "coords": (N, 2)}: the patient's slides concatenated."""

    def __init__(self, feature_dim: int, max_instances: int | None = None) -> None:
        self.feature_dim, self.max_instances = feature_dim, max_instances

    def __call__(self, record: Record) -> dict:
        slides = [read_slide(path) for path in record.paths]
        for path, (features, _) in zip(record.paths, slides):  # named: a patient's slides may differ among themselves
            if features.shape[1] != self.feature_dim:
                raise ValueError(f"{path}: features have dimension {features.shape[1]}, the other bags "
                                 f"{self.feature_dim}")
        features = torch.cat([s[0] for s in slides])
        coords = torch.cat([s[1] for s in slides])
        if self.max_instances is not None:
            features, coords = subsample(features, coords, self.max_instances)
        return {"input": features, "coords": coords}


def bag_synthetic(path: Path) -> bool:
    """Whether a bag says it comes from a SYNTHETIC slide: HDF5 attribute ``synthetic`` true (``medattn wsi extract``
    of a slide written by ``medattn wsi synthetic``); False for a file without it or one that does not open."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            return bool(f.attrs.get("synthetic", False))
    except OSError:
        return False


def write_bag(out: OutputFolder, name: str, features: np.ndarray, coords: np.ndarray, attrs: dict,
              layout: str = "clam") -> None:
    """Write the bag file ``name`` in ``out`` atomically (a temporary name, then a rename:
    :meth:`medattn.outputs.OutputFolder.write`; its policy decides whether ``name`` may be written).

    * ``clam``: ``features`` (N, F) float32 and ``coords`` (N, 2) int64, level-0 top-left (x, y) pixels;
    * ``stamp``: ``feats`` (N, F) float32 and ``coords`` (N, 2) float32 in microns (level-0 px x ``attrs["mpp"]``),
      with STAMP's attributes ``unit`` = "um", ``tile_size_um`` and ``tile_size_px`` (``attrs["patch_size_um"]``,
      ``attrs["patch_size_px"]``) and ``feat_type`` = "tile";

    then ``attrs`` as the file's attributes. ``coords`` are given in level-0 pixels for either layout."""
    import h5py

    if layout not in WRITTEN_LAYOUTS:
        raise ValueError(f"layout must be one of {WRITTEN_LAYOUTS}, got {layout!r}")
    with out.write(name) as tmp, h5py.File(tmp, "w") as f:
        if layout == "clam":
            f.create_dataset("features", data=np.asarray(features, dtype=np.float32))
            f.create_dataset("coords", data=np.asarray(coords, dtype=np.int64))
        else:
            f.create_dataset("feats", data=np.asarray(features, dtype=np.float32))
            microns = np.asarray(coords, dtype=np.float64) * attrs["mpp"]
            f.create_dataset("coords", data=microns.astype(np.float32))
            f.attrs.update({"unit": "um", "tile_size_um": attrs["patch_size_um"],
                            "tile_size_px": attrs["patch_size_px"], "feat_type": "tile"})
        f.attrs.update(attrs)
