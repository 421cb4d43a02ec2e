"""A bag's tile scores: where its tiles lie, drawn at their coordinates or over the slide, and written as files.

Where: the tiles' side and level-0 corners from the bag's HDF5 attributes (CLAM layout: level-0 pixels; STAMP layout:
microns, turned to pixels with the file's ``mpp``). Drawn: squares on a blank canvas (:func:`tile_map`) or over the
thumbnail of the scanner file (:func:`slide_picture`), coloured by :func:`~medattn.explain.outputs.colour_range`
(the readable figure around them is :func:`~medattn.explain.outputs.slide_map_figure`). Written: the tile table and
HDF5 (:func:`write_tile_scores`) and the GeoJSON QuPath imports (:func:`write_tile_geojson`).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from ..outputs import OutputFolder
from .outputs import colour_range

#: Longest side of a tile heatmap drawn without a slide.
TILE_MAP_PX = 2048


def tile_size(coords: np.ndarray, attrs: dict | None = None) -> float:
    """Side of a tile in the coords' unit: the HDF5 attributes ``patch_size_level0`` (CLAM layout, level-0
    px) or ``tile_size_um`` (STAMP layout, microns), else the smallest step between distinct coordinates."""
    attrs = attrs or {}
    if attrs.get("unit") == "um" and "tile_size_um" in attrs:
        return float(attrs["tile_size_um"])
    if "patch_size_level0" in attrs:
        return float(attrs["patch_size_level0"])
    steps = [np.diff(np.unique(coords[:, axis])) for axis in (0, 1)]
    steps = np.concatenate([s[s > 0] for s in steps])
    return float(steps.min()) if len(steps) else 1.0


def tile_map(coords: np.ndarray, scores: np.ndarray, size: float, scale: str = "full") -> Image.Image:
    """Scores drawn on the tile coordinates (top-left (x, y), squares of side ``size``) on a white canvas
    whose longest side is :data:`TILE_MAP_PX`, by :func:`medattn.slides.heatmap.draw_heatmap`, coloured as
    :func:`~medattn.explain.outputs.colour_range` says on the colour ``scale``."""
    from ..slides.heatmap import draw_heatmap

    coords = np.asarray(coords, dtype=np.float64)
    origin = coords.min(axis=0)
    extent = coords.max(axis=0) - origin + size
    step = max(float(extent.max()) / TILE_MAP_PX, 1e-9)
    canvas = np.full((max(1, int(np.ceil(extent[1] / step))), max(1, int(np.ceil(extent[0] / step))), 3), 255,
                     np.uint8)
    cmap, low, high = colour_range(scores, scale)
    return draw_heatmap(canvas, (step, step), coords - origin, scores, size, alpha=0.85, cmap=cmap, vmin=low,
                        vmax=high)


def slide_picture(slide: Path, coords: np.ndarray, scores: np.ndarray, attrs: dict, scale: str = "full") \
        -> Image.Image:
    """A bag's scores (N,) drawn over the thumbnail of its ``slide`` (the scanner file), tiles outlined, with a scale
    bar (:func:`medattn.slides.heatmap.slide_overlay`), coloured as :func:`~medattn.explain.outputs.colour_range`
    says on the colour ``scale``; ``coords`` (N, 2) as the bag stores them, turned to level-0 pixels with its ``attrs``
    (:func:`level0_tiles`)."""
    from ..slides.heatmap import slide_overlay

    level0, side = level0_tiles(coords, attrs)
    cmap, low, high = colour_range(scores, scale)
    return slide_overlay(slide, level0, scores, round(side), cmap=cmap, vmin=low, vmax=high)


#: The columns of a bag's ``<stem>_tiles.csv`` (:func:`write_tile_scores`).
TILE_COLUMNS = ("tile", "x", "y", "coords_unit", "x_level0_px", "y_level0_px", "score")


def coords_unit(attrs: dict | None) -> str:
    """The unit of a bag's stored tile coordinates: ``um`` (microns, STAMP layout: attribute ``unit``), else ``px``
    (level-0 pixels, CLAM layout and bags without attributes)."""
    return "um" if str((attrs or {}).get("unit", "")) == "um" else "px"


def write_tile_scores(out: OutputFolder, stem: str, coords: np.ndarray, scores: np.ndarray, method: str,
                      attrs: dict | None = None) -> list[str]:
    """A bag's scores as ``<stem>_tiles.csv`` and ``<stem>_tiles.h5`` in ``out`` (-> their names). CSV columns
    (:data:`TILE_COLUMNS`): ``tile`` (the tile's index in the bag), ``x``, ``y`` (its top-left corner as the bag
    stores it), ``coords_unit`` (of ``x`` and ``y``: :func:`coords_unit`), ``x_level0_px``, ``y_level0_px`` (the
    corner in level-0 pixels, as the GeoJSON's polygons; empty for microns in a bag without ``mpp``), ``score``.
    HDF5: datasets ``scores`` (N,) and ``coords`` (N, 2, as the bag stores them), attributes ``method`` and
    ``coords_unit``."""
    import h5py

    scores = np.asarray(scores, dtype=np.float32)
    coords = np.asarray(coords, dtype=np.float64).reshape(len(scores), 2)
    unit = coords_unit(attrs)
    converted = unit == "px" or "mpp" in (attrs or {})
    level0 = level0_tiles(coords, attrs or {})[0] if converted else np.full_like(coords, np.nan)
    rows = [[index, f"{x:.10g}", f"{y:.10g}", unit, *("" if np.isnan(v) else f"{v:.10g}" for v in corner),
             f"{score:.7g}"]
            for index, ((x, y), corner, score) in enumerate(zip(coords.tolist(), level0, scores.tolist()))]
    names = [f"{stem}_tiles.csv", f"{stem}_tiles.h5"]
    with out.write(names[1]) as tmp:
        with h5py.File(tmp, "w") as f:
            f.create_dataset("scores", data=scores)
            f.create_dataset("coords", data=np.asarray(coords, dtype=np.float32))
            f.attrs["method"] = method
            f.attrs["coords_unit"] = unit
        out.save_csv(names[0], TILE_COLUMNS, rows)  # the table in place just before the HDF5 is renamed
    return names


def level0_tiles(coords: np.ndarray, attrs: dict) -> tuple[np.ndarray, float]:
    """(top-left corners in level-0 pixels, tile side in level-0 pixels) of a bag's tiles: CLAM-layout coordinates
    are level-0 pixels already, STAMP-layout ones microns (divided by the file's ``mpp``); without the attributes,
    the coordinates as they are and the smallest step between them (:func:`tile_size`)."""
    coords = np.asarray(coords, dtype=np.float64)
    if str(attrs.get("unit", "")) == "um" and "mpp" in attrs:
        return coords / float(attrs["mpp"]), float(attrs.get("patch_size_level0", tile_size(coords, attrs)
                                                          / float(attrs["mpp"])))
    return coords, tile_size(coords, attrs)


def write_tile_geojson(out: OutputFolder, name: str, corners: np.ndarray, side: float, scores: np.ndarray,
                       method: str) -> None:
    """``name`` in ``out``: a GeoJSON FeatureCollection QuPath imports (File > Import objects): one square tile object
    per tile (``objectType`` "tile"; polygon in level-0 pixels, corners (N, 2) top-left (x, y)) with its score as the
    measurement ``<method> score``."""
    features = [{"type": "Feature",
                 "geometry": {"type": "Polygon", "coordinates": [[[x, y], [x + side, y], [x + side, y + side],
                                                                  [x, y + side], [x, y]]]},
                 "properties": {"objectType": "tile", "measurements": {f"{method} score": float(score)}}}
                for (x, y), score in zip(np.asarray(corners, dtype=np.float64).tolist(), np.asarray(scores).ravel())]
    out.save_json(name, {"type": "FeatureCollection", "features": features}, indent=None)
