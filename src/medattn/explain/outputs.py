"""Files a reader opens: PNG overlays (2D), NIfTI maps on the input's grid (3D), tile tables and maps (bags).

Colours: a map with negative values (signed rollout of linear attention, gradient x input) is drawn with
the diverging ``RdBu_r`` map symmetric about 0 (red adds, blue takes away); a map >= 0 with ``inferno``
from 0 to its maximum. ``label`` (e.g. "SYNTHETIC") is written in the top-left corner.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from ..errors import UserError, writing
from ..runtime.outputs import atomic, save_csv, save_dicts, save_json

#: Longest side of a tile heatmap drawn without a slide.
TILE_MAP_PX = 2048


def colour_range(values: np.ndarray) -> tuple[str, float, float]:
    """(colour map, vmin, vmax) for a map (module docstring)."""
    low, high = float(np.min(values)), float(np.max(values))
    if low < 0:
        bound = max(-low, high, 1e-30)
        return "RdBu_r", -bound, bound
    return "inferno", 0.0, max(high, 1e-30)


def _label(image: Image.Image, label: str | None) -> Image.Image:
    if label:
        draw = ImageDraw.Draw(image)
        draw.rectangle([0, 0, 8 + 6 * len(label), 14], fill=(0, 0, 0))
        draw.text((4, 2), label, fill=(255, 255, 255))
    return image


def overlay(image: np.ndarray, heat: np.ndarray, alpha: float = 0.5, label: str | None = None) -> Image.Image:
    """image (C, H, W) in [0, 1] (C = 1 or 3), heat (h, w) on any grid -> RGB overlay of the image's size
    (the map resized by nearest neighbour, so each patch keeps its one value)."""
    import matplotlib

    image = np.asarray(image, dtype=np.float32)
    if image.ndim != 3 or image.shape[0] not in (1, 3):
        raise UserError(f"overlay: expected an image (C, H, W) with C = 1 or 3, got {image.shape}")
    rgb = np.repeat(image, 3, axis=0) if image.shape[0] == 1 else image
    rgb = np.clip(rgb.transpose(1, 2, 0), 0, 1) * 255
    heat = np.asarray(heat, dtype=np.float32)
    if heat.ndim != 2 or not np.isfinite(heat).all():
        raise UserError(f"overlay: the map must be 2D and finite, got shape {heat.shape}")
    size = (rgb.shape[1], rgb.shape[0])
    heat = np.asarray(Image.fromarray(heat, mode="F").resize(size, Image.NEAREST))
    cmap, low, high = colour_range(heat)
    colours = matplotlib.colormaps[cmap](np.clip((heat - low) / (high - low), 0, 1))[..., :3] * 255
    out = Image.fromarray(np.clip((1 - alpha) * rgb + alpha * colours, 0, 255).round().astype(np.uint8))
    return _label(out, label)


#: Side of each panel of a readable heatmap figure, in pixels (small images are enlarged, pixels kept square).
PANEL_PX = 420
SYNTHETIC_NOTE = "model trained on SYNTHETIC data (not a clinical result)"


def _meaning(heat: np.ndarray, method: str) -> str:
    """The colour bar's label: what the colours mean for this map."""
    if float(np.min(heat)) < 0:
        return f"{method} relevance: red adds to the prediction, blue takes away"
    return f"{method} relevance (>= 0: brighter matters more)"


def _colour_bar(fig, axes, cmap: str, low: float, high: float, meaning: str, fraction: float) -> None:
    """An opaque colour bar of ``cmap`` from ``low`` to ``high`` beside ``axes``, labelled with ``meaning`` (the
    map itself is drawn translucent over the image; its bar is not)."""
    import matplotlib

    colours = matplotlib.cm.ScalarMappable(norm=matplotlib.colors.Normalize(low, high), cmap=cmap)
    fig.colorbar(colours, ax=axes, fraction=fraction, pad=0.02).set_label(meaning, fontsize=8)


def _pyplot():
    """matplotlib's pyplot on the Agg backend (figures drawn to files, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(fig, title: str, synthetic: bool) -> Image.Image:
    """``title`` above the panels, the SYNTHETIC note below them (never over the data), the figure as an RGB image;
    the figure is closed."""
    fig.suptitle(title, fontsize=9)
    if synthetic:
        fig.text(0.5, 0.01, SYNTHETIC_NOTE, ha="center", va="bottom", fontsize=8, color="#b00000")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    _pyplot().close(fig)
    buffer.seek(0)
    return Image.open(buffer).convert("RGB")


def readable_overlay(image: np.ndarray, heat: np.ndarray, title: str, method: str, synthetic: bool = False,
                     alpha: float = 0.45) -> Image.Image:
    """A figure a person can read: the image (C, H, W) in [0, 1] beside the map ``heat`` (h, w, any grid,
    resized by nearest neighbour) over it, each panel about :data:`PANEL_PX` px, a colour bar saying what the
    colours mean, ``title`` above (model, method, file) and the SYNTHETIC note below the panels, not over them."""
    plt = _pyplot()
    plain = np.asarray(overlay(image, heat, alpha=0.0))  # the image as RGB at its size (checked there)
    size = (plain.shape[1], plain.shape[0])
    heat = np.asarray(Image.fromarray(np.asarray(heat, dtype=np.float32), mode="F").resize(size, Image.NEAREST))
    cmap, low, high = colour_range(heat)
    scale = PANEL_PX / max(size)
    fig, axes = plt.subplots(1, 2, figsize=(2 * size[0] * scale / 100 + 1.6, size[1] * scale / 100 + 1.1))
    axes[0].imshow(plain, interpolation="nearest")
    axes[0].set_title("image", fontsize=9)
    axes[1].imshow(plain, interpolation="nearest")
    axes[1].imshow(heat, cmap=cmap, vmin=low, vmax=high, alpha=alpha, interpolation="nearest")
    axes[1].set_title("relevance over the image", fontsize=9)
    for axis in axes:
        axis.set_axis_off()
    _colour_bar(fig, axes, cmap, low, high, _meaning(heat, method), 0.035)
    return _finish(fig, title, synthetic)


def volume_preview(volume: np.ndarray, heat: np.ndarray, title: str, method: str, synthetic: bool = False,
                   alpha: float = 0.45) -> Image.Image:
    """Three orthogonal slices of ``volume`` (H, W, D) with ``heat`` (same grid) over them, through the voxel of
    the largest |relevance|, with a colour bar, ``title`` and the SYNTHETIC note below the panels."""
    plt = _pyplot()
    volume, heat = np.asarray(volume, dtype=np.float32), np.asarray(heat, dtype=np.float32)
    if volume.shape != heat.shape or volume.ndim != 3:
        raise UserError(f"preview: volume {volume.shape} and map {heat.shape} must be one 3D grid")
    centre = np.unravel_index(int(np.argmax(np.abs(heat))), heat.shape)
    low_v, high_v = np.percentile(volume, [1, 99])
    cmap, low, high = colour_range(heat)
    cuts = [(volume[centre[0]], heat[centre[0]], f"axis 0 = {centre[0]}"),
            (volume[:, centre[1]], heat[:, centre[1]], f"axis 1 = {centre[1]}"),
            (volume[:, :, centre[2]], heat[:, :, centre[2]], f"axis 2 = {centre[2]}")]
    fig, axes = plt.subplots(1, 3, figsize=(11, 4.2))
    for axis, (image, relevance, name) in zip(axes, cuts):
        axis.imshow(image.T, cmap="gray", vmin=low_v, vmax=max(high_v, low_v + 1e-6), origin="lower",
                    interpolation="nearest")
        axis.imshow(relevance.T, cmap=cmap, vmin=low, vmax=high, alpha=alpha, origin="lower",
                    interpolation="nearest")
        axis.set_title(f"slice {name}", fontsize=9)
        axis.set_axis_off()
    _colour_bar(fig, axes, cmap, low, high, _meaning(heat, method), 0.025)
    return _finish(fig, title + " (through the voxel of largest |relevance|)", synthetic)


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


def tile_map(coords: np.ndarray, scores: np.ndarray, size: float) -> Image.Image:
    """Scores drawn on the tile coordinates (top-left (x, y), squares of side ``size``) on a white canvas
    whose longest side is :data:`TILE_MAP_PX`, by :func:`medattn.slides.heatmap.draw_heatmap`, coloured as
    :func:`colour_range` says."""
    from ..slides.heatmap import draw_heatmap

    coords = np.asarray(coords, dtype=np.float64)
    origin = coords.min(axis=0)
    extent = coords.max(axis=0) - origin + size
    step = max(float(extent.max()) / TILE_MAP_PX, 1e-9)
    canvas = np.full((max(1, int(np.ceil(extent[1] / step))), max(1, int(np.ceil(extent[0] / step))), 3), 255,
                     np.uint8)
    cmap, low, high = colour_range(scores)
    return draw_heatmap(canvas, (step, step), coords - origin, scores, size, alpha=0.85, cmap=cmap, vmin=low,
                        vmax=high)


def slide_map_figure(picture: Image.Image, scores: np.ndarray, title: str, method: str,
                     synthetic: bool = False) -> Image.Image:
    """A tile map a person can read: ``picture`` (the scores drawn over the slide's thumbnail, or on a blank
    canvas, coloured by :func:`colour_range` of ``scores``) shown at its aspect, a colour bar saying what the
    colours mean, ``title`` above (model, method, file) and the SYNTHETIC note below, not over the tissue."""
    plt = _pyplot()
    cmap, low, high = colour_range(scores)
    width, height = picture.size
    scale = 900 / max(width, height)
    fig, axis = plt.subplots(figsize=(width * scale / 100 + 1.8, height * scale / 100 + 1.0))
    axis.imshow(np.asarray(picture), interpolation="nearest")
    axis.set_axis_off()
    _colour_bar(fig, axis, cmap, low, high, _meaning(np.asarray(scores), method) + " per tile", 0.035)
    return _finish(fig, title, synthetic)


#: The columns of a bag's ``<stem>_tiles.csv`` (:func:`write_tile_scores`).
TILE_COLUMNS = ("tile", "x", "y", "coords_unit", "x_level0_px", "y_level0_px", "score")


def coords_unit(attrs: dict | None) -> str:
    """The unit of a bag's stored tile coordinates: ``um`` (microns, STAMP layout: attribute ``unit``), else ``px``
    (level-0 pixels, CLAM layout and bags without attributes)."""
    return "um" if str((attrs or {}).get("unit", "")) == "um" else "px"


def write_tile_scores(csv_path: Path, h5_path: Path, coords: np.ndarray, scores: np.ndarray, method: str,
                      attrs: dict | None = None) -> None:
    """A bag's scores as a CSV and an HDF5 file. CSV columns (:data:`TILE_COLUMNS`): ``tile`` (the tile's index in
    the bag), ``x``, ``y`` (its top-left corner as the bag stores it), ``coords_unit`` (of ``x`` and ``y``:
    :func:`coords_unit`), ``x_level0_px``, ``y_level0_px`` (the corner in level-0 pixels, as the GeoJSON's polygons;
    empty for microns in a bag without ``mpp``), ``score``. HDF5: datasets ``scores`` (N,) and ``coords`` (N, 2, as
    the bag stores them), attributes ``method`` and ``coords_unit``."""
    import h5py

    scores = np.asarray(scores, dtype=np.float32)
    coords = np.asarray(coords, dtype=np.float64).reshape(len(scores), 2)
    unit = coords_unit(attrs)
    converted = unit == "px" or "mpp" in (attrs or {})
    level0 = level0_tiles(coords, attrs or {})[0] if converted else np.full_like(coords, np.nan)
    rows = [[index, f"{x:.10g}", f"{y:.10g}", unit, *("" if np.isnan(v) else f"{v:.10g}" for v in corner),
             f"{score:.7g}"]
            for index, ((x, y), corner, score) in enumerate(zip(coords.tolist(), level0, scores.tolist()))]
    save_csv(csv_path, TILE_COLUMNS, rows)
    with writing(h5_path), atomic(h5_path) as tmp, h5py.File(tmp, "w") as f:
        f.create_dataset("scores", data=scores)
        f.create_dataset("coords", data=np.asarray(coords, dtype=np.float32))
        f.attrs["method"] = method
        f.attrs["coords_unit"] = unit


def level0_tiles(coords: np.ndarray, attrs: dict) -> tuple[np.ndarray, float]:
    """(top-left corners in level-0 pixels, tile side in level-0 pixels) of a bag's tiles: CLAM-layout coordinates
    are level-0 pixels already, STAMP-layout ones microns (divided by the file's ``mpp``); without the attributes,
    the coordinates as they are and the smallest step between them (:func:`tile_size`)."""
    coords = np.asarray(coords, dtype=np.float64)
    if str(attrs.get("unit", "")) == "um" and "mpp" in attrs:
        return coords / float(attrs["mpp"]), float(attrs.get("patch_size_level0", tile_size(coords, attrs)
                                                          / float(attrs["mpp"])))
    return coords, tile_size(coords, attrs)


def write_tile_geojson(path: Path, corners: np.ndarray, side: float, scores: np.ndarray, method: str) -> None:
    """A GeoJSON FeatureCollection QuPath imports (File > Import objects): one square tile object per tile
    (``objectType`` "tile"; polygon in level-0 pixels, corners (N, 2) top-left (x, y)) with its score as the
    measurement ``<method> score``."""
    features = [{"type": "Feature",
                 "geometry": {"type": "Polygon", "coordinates": [[[x, y], [x + side, y], [x + side, y + side],
                                                                  [x, y + side], [x, y]]]},
                 "properties": {"objectType": "tile", "measurements": {f"{method} score": float(score)}}}
                for (x, y), score in zip(np.asarray(corners, dtype=np.float64).tolist(), np.asarray(scores).ravel())]
    save_json(path, {"type": "FeatureCollection", "features": features}, indent=None)


def write_summary(path: Path, rows: list[dict]) -> None:
    """One row per explained file (file, method, target, probabilities, outputs written)."""
    save_dicts(path, rows, list(rows[0]))
