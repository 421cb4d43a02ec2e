"""Pictures a reader opens, and the summary table: PNG overlays (2D), the three planes of a volume (3D), a bag's tile
map as a readable figure; a bag's tiles themselves (where they lie, drawn, and their table, HDF5 and GeoJSON) are
:mod:`medattn.explain.tile_scores`'s.

Colours: a map with negative values (signed rollout of linear attention, gradient x input) is drawn with
the diverging ``RdBu_r`` map symmetric about 0 (red adds, blue takes away); a map >= 0 with ``inferno``.
The colour scale (:data:`COLOUR_SCALES`, ``medattn explain --colour-scale``) sets where the colours end:
``full`` (the default) spans the whole map, from 0 to its maximum (>= 0) or to its largest |value| (signed);
``percentile`` clips at :data:`CLIP_PERCENTILES`: a map >= 0 runs from its 1st to its 99th percentile, a signed
map from -P99 to +P99 of |values|, so a few extreme tiles or voxels do not wash the rest out (values beyond the
ends take the end colours; the colour bar shows arrows there). ``label`` (e.g. "SYNTHETIC") is written in the
top-left corner.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from ..errors import UserError
from ..outputs import OutputFolder
from ..vocabulary import task_types

#: The colour scales of a map (module docstring): ``full`` (default) or ``percentile``.
COLOUR_SCALES = ("full", "percentile")
#: The percentiles at which ``percentile`` colouring clips a map >= 0 (the upper one alone, of |values|, for a signed
#: map).
CLIP_PERCENTILES = (1.0, 99.0)


def colour_range(values: np.ndarray, scale: str = "full") -> tuple[str, float, float]:
    """(colour map, vmin, vmax) for a map on the colour ``scale`` (module docstring)."""
    if scale not in COLOUR_SCALES:
        raise UserError(f"unknown colour scale {scale!r}; choose one of {', '.join(COLOUR_SCALES)}")
    values = np.asarray(values, dtype=np.float64)
    low, high = float(np.min(values)), float(np.max(values))
    if low < 0:
        bound = max(-low, high)
        if scale == "percentile":
            bound = float(np.percentile(np.abs(values), CLIP_PERCENTILES[1]))
        bound = max(bound, 1e-30)
        return "RdBu_r", -bound, bound
    if scale == "percentile":
        clip_low, clip_high = (float(v) for v in np.percentile(values, CLIP_PERCENTILES))
        if clip_high > clip_low:
            return "inferno", clip_low, clip_high
    return "inferno", 0.0, max(high, 1e-30)


def _extend(values: np.ndarray, low: float, high: float) -> str:
    """matplotlib's colour bar ``extend``: arrows at the ends the map's values pass (clipped colours)."""
    below, above = float(np.min(values)) < low, float(np.max(values)) > high
    return {(True, True): "both", (True, False): "min", (False, True): "max"}.get((below, above), "neither")


def _label(image: Image.Image, label: str | None) -> Image.Image:
    if label:
        draw = ImageDraw.Draw(image)
        draw.rectangle([0, 0, 8 + 6 * len(label), 14], fill=(0, 0, 0))
        draw.text((4, 2), label, fill=(255, 255, 255))
    return image


def overlay(image: np.ndarray, heat: np.ndarray, alpha: float = 0.5, label: str | None = None,
            scale: str = "full") -> Image.Image:
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
    cmap, low, high = colour_range(heat, scale)
    colours = matplotlib.colormaps[cmap](np.clip((heat - low) / (high - low), 0, 1))[..., :3] * 255
    out = Image.fromarray(np.clip((1 - alpha) * rgb + alpha * colours, 0, 255).round().astype(np.uint8))
    return _label(out, label)


#: Side of each panel of a readable heatmap figure, in pixels (small images are enlarged, pixels kept square).
PANEL_PX = 420
SYNTHETIC_NOTE = "model trained on SYNTHETIC data (not a clinical result)"


def _meaning(heat: np.ndarray, method: str, scale: str = "full", what: str = "relevance") -> str:
    """The colour bar's label: what the colours mean for this map (and where they are clipped)."""
    signed = float(np.min(heat)) < 0
    if signed:
        text = f"{method} {what}: red adds to the prediction, blue takes away"
    else:
        text = f"{method} {what} (>= 0: brighter matters more)"
    if scale == "percentile":
        low, high = CLIP_PERCENTILES
        text += f"; colours end at P{high:g} of |values|" if signed else f"; colours from P{low:g} to P{high:g}"
    return text


def _colour_bar(fig, axes, cmap: str, low: float, high: float, meaning: str, fraction: float,
                values: np.ndarray | None = None) -> None:
    """An opaque colour bar of ``cmap`` from ``low`` to ``high`` beside ``axes``, labelled with ``meaning`` (the
    map itself is drawn translucent over the image; its bar is not), with arrows where ``values`` pass its ends."""
    import matplotlib

    colours = matplotlib.cm.ScalarMappable(norm=matplotlib.colors.Normalize(low, high), cmap=cmap)
    extend = "neither" if values is None else _extend(values, low, high)
    fig.colorbar(colours, ax=axes, fraction=fraction, pad=0.02, extend=extend).set_label(meaning, fontsize=8)


def _pyplot():
    """matplotlib's pyplot on the Agg backend (figures drawn to files, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(fig, title: str, synthetic: bool) -> Image.Image:
    """``title`` above the panels, the SYNTHETIC note below them (never over the data), the figure as an RGB image;
    the figure is closed."""
    fig.suptitle(title, fontsize=9, wrap=True)  # a long title (a case's risk and observed time) on two lines
    if synthetic:
        fig.text(0.5, 0.01, SYNTHETIC_NOTE, ha="center", va="bottom", fontsize=8, color="#b00000")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    _pyplot().close(fig)
    buffer.seek(0)
    return Image.open(buffer).convert("RGB")


def readable_overlay(image: np.ndarray, heat: np.ndarray, title: str, method: str, synthetic: bool = False,
                     alpha: float = 0.45, scale: str = "full") -> Image.Image:
    """A figure a person can read: the image (C, H, W) in [0, 1] beside the map ``heat`` (h, w, any grid,
    resized by nearest neighbour) over it, each panel about :data:`PANEL_PX` px, a colour bar saying what the
    colours mean (on the colour ``scale``), ``title`` above (model, method, file) and the SYNTHETIC note below the
    panels, not over them."""
    plt = _pyplot()
    plain = np.asarray(overlay(image, heat, alpha=0.0))  # the image as RGB at its size (checked there)
    size = (plain.shape[1], plain.shape[0])
    heat = np.asarray(Image.fromarray(np.asarray(heat, dtype=np.float32), mode="F").resize(size, Image.NEAREST))
    cmap, low, high = colour_range(heat, scale)
    zoom = PANEL_PX / max(size)
    fig, axes = plt.subplots(1, 2, figsize=(2 * size[0] * zoom / 100 + 1.6, size[1] * zoom / 100 + 1.1))
    axes[0].imshow(plain, interpolation="nearest")
    axes[0].set_title("image", fontsize=9)
    axes[1].imshow(plain, interpolation="nearest")
    axes[1].imshow(heat, cmap=cmap, vmin=low, vmax=high, alpha=alpha, interpolation="nearest")
    axes[1].set_title("relevance over the image", fontsize=9)
    for axis in axes:
        axis.set_axis_off()
    _colour_bar(fig, axes, cmap, low, high, _meaning(heat, method, scale), 0.035, heat)
    return _finish(fig, title, synthetic)


#: The preview's centre is found on the map smoothed by a Gaussian of this sigma, in units of the finest voxel side
#: (in mm on every axis: sigma_i = PREVIEW_SIGMA * min(spacing) / spacing_i voxels along axis i).
PREVIEW_SIGMA = 1.0
#: Plane cut across an axis, by the axis' nibabel code; how each plane is shown: (axis to the right, axis upwards)
#: by the codes they run towards (neurological view: the patient's right on the right, anterior and superior up).
_PLANES = {"L": "sagittal", "R": "sagittal", "A": "coronal", "P": "coronal", "S": "axial", "I": "axial"}
_SHOWN = {"sagittal": ("A", "S"), "coronal": ("R", "S"), "axial": ("R", "A")}
_OPPOSITE = {"L": "R", "R": "L", "A": "P", "P": "A", "S": "I", "I": "S"}


@dataclass
class PreviewCut:
    """One panel of the 3D preview: the ``plane`` (sagittal, coronal, axial) cut across ``axis`` at ``index``; shown
    with array axis ``right`` to the right and ``up`` upwards, each ``flipped`` or not so that they run towards the
    codes ``towards`` (e.g. ("R", "A") for an axial panel); ``aspect``: the drawn height of a voxel over its width,
    spacing[up] / spacing[right], so voxels keep their physical shape."""

    plane: str
    axis: int
    index: int
    right: int
    up: int
    flipped: tuple[bool, bool]
    towards: tuple[str, str]
    aspect: float

    def take(self, array: np.ndarray) -> np.ndarray:
        """The panel of ``array`` (the volume's grid) as an image (rows upwards from row 0, columns to the right):
        draw it with ``origin="lower"``."""
        cut = np.take(array, self.index, axis=self.axis)  # the two remaining axes, in their order
        remaining = [a for a in range(3) if a != self.axis]
        image = cut.transpose(remaining.index(self.up), remaining.index(self.right))  # (up, right)
        if self.flipped[0]:
            image = image[:, ::-1]
        if self.flipped[1]:
            image = image[::-1]
        return image


def preview_centre(heat: np.ndarray, spacing=(1.0, 1.0, 1.0)) -> tuple[int, int, int]:
    """The voxel the 3D preview goes through: the maximum of |heat| smoothed by a Gaussian (:data:`PREVIEW_SIGMA`,
    zero outside the volume); voxels that tie for it (within 1e-7 relative) are resolved by their centre of mass (the
    tied voxel nearest to it), so a plateau of equal maxima gives its middle, not its first voxel."""
    from scipy.ndimage import gaussian_filter

    spacing = np.asarray(spacing, dtype=np.float64)
    magnitude = np.abs(np.asarray(heat, dtype=np.float64))
    smooth = gaussian_filter(magnitude, PREVIEW_SIGMA * spacing.min() / spacing, mode="constant")
    top = float(smooth.max())
    tied = np.argwhere(smooth >= top - 1e-7 * abs(top))
    middle = tied.mean(axis=0)
    return tuple(int(v) for v in tied[np.argmin(((tied - middle) ** 2).sum(axis=1))])


def preview_cuts(heat: np.ndarray, affine: np.ndarray | None = None) -> list[PreviewCut]:
    """The three panels of the 3D preview of ``heat`` (H, W, D) on a grid with voxel-to-world ``affine`` (default: the
    identity, i.e. RAS+ axes of 1 mm, the loader's orientation): through :func:`preview_centre`, named from the
    affine's axis codes (``nibabel.aff2axcodes``), in the order sagittal, coronal, axial, each with the physical aspect
    of its voxels (spacing: the affine's column norms)."""
    import nibabel as nib

    affine = np.eye(4) if affine is None else np.asarray(affine, dtype=np.float64)
    spacing = np.linalg.norm(affine[:3, :3], axis=0)
    codes = nib.aff2axcodes(affine)
    if None in codes:
        raise UserError(f"preview: the affine gives no orientation to every axis ({codes})")
    centre = preview_centre(heat, spacing)
    by_code = {code: axis for axis, code in enumerate(codes)}
    cuts = []
    for axis, code in sorted(enumerate(codes), key=lambda item: list(_SHOWN).index(_PLANES[item[1]])):
        plane = _PLANES[code]
        towards = _SHOWN[plane]
        right, up = (by_code.get(c, by_code.get(_OPPOSITE[c])) for c in towards)
        flipped = (codes[right] != towards[0], codes[up] != towards[1])
        cuts.append(PreviewCut(plane, axis, int(centre[axis]), right, up, flipped, towards,
                               float(spacing[up] / spacing[right])))
    return cuts


def volume_preview(volume: np.ndarray, heat: np.ndarray, title: str, method: str, synthetic: bool = False,
                   alpha: float = 0.45, affine: np.ndarray | None = None, scale: str = "full") -> Image.Image:
    """The sagittal, coronal and axial planes of ``volume`` (H, W, D) through the centre of the largest relevance of
    ``heat`` (same grid; :func:`preview_cuts`, planes named from ``affine``, the grid's voxel-to-world matrix, default
    RAS+ 1 mm), each at its voxels' physical aspect: the image alone in the top row, ``heat`` over it below (as the 2D
    figure shows image and map side by side), with a colour bar (colour ``scale``), ``title`` and the SYNTHETIC note
    below the panels. Each panel is shown in the neurological view (the patient's right on the right, anterior or
    superior up), its edges lettered with the directions."""
    plt = _pyplot()
    volume, heat = np.asarray(volume, dtype=np.float32), np.asarray(heat, dtype=np.float32)
    if volume.shape != heat.shape or volume.ndim != 3:
        raise UserError(f"preview: volume {volume.shape} and map {heat.shape} must be one 3D grid")
    cuts = preview_cuts(heat, affine)
    low_v, high_v = np.percentile(volume, [1, 99])
    cmap, low, high = colour_range(heat, scale)
    fig, axes = plt.subplots(2, 3, figsize=(12, 8.4))
    for column, cut in enumerate(cuts):
        image, relevance = cut.take(volume), cut.take(heat)
        for row in (0, 1):
            axis = axes[row, column]
            axis.imshow(image, cmap="gray", vmin=low_v, vmax=max(high_v, low_v + 1e-6), origin="lower",
                        interpolation="nearest", aspect=cut.aspect)
            if row:
                axis.imshow(relevance, cmap=cmap, vmin=low, vmax=high, alpha=alpha, origin="lower",
                            interpolation="nearest", aspect=cut.aspect)
            axis.set_axis_off()
            for (x, y, ha, va), letter in zip(((1.0, 0.5, "right", "center"), (0.0, 0.5, "left", "center"),
                                               (0.5, 1.0, "center", "top"), (0.5, 0.0, "center", "bottom")),
                                              (cut.towards[0], _OPPOSITE[cut.towards[0]], cut.towards[1],
                                               _OPPOSITE[cut.towards[1]])):
                axis.text(x, y, letter, transform=axis.transAxes, ha=ha, va=va, fontsize=8, color="white",
                          bbox={"facecolor": "black", "alpha": 0.6, "pad": 1.0, "linewidth": 0})
        axes[0, column].set_title(f"{cut.plane} (axis {cut.axis} = {cut.index}): image", fontsize=9)
        axes[1, column].set_title(f"{cut.plane}: relevance over the image", fontsize=9)
    _colour_bar(fig, axes, cmap, low, high, _meaning(heat, method, scale), 0.025, heat)
    return _finish(fig, title + " (through the centre of the largest |relevance|, smoothed)", synthetic)


def slide_map_figure(picture: Image.Image, scores: np.ndarray, title: str, method: str,
                     synthetic: bool = False, scale: str = "full") -> Image.Image:
    """A tile map a person can read: ``picture`` (the scores drawn over the slide's thumbnail, or on a blank
    canvas, coloured by :func:`colour_range` of ``scores`` on the colour ``scale``) shown at its aspect, a colour bar
    saying what the colours mean, ``title`` above (model, method, file) and the SYNTHETIC note below, not over the
    tissue."""
    plt = _pyplot()
    scores = np.asarray(scores)
    cmap, low, high = colour_range(scores, scale)
    width, height = picture.size
    zoom = 900 / max(width, height)
    fig, axis = plt.subplots(figsize=(width * zoom / 100 + 1.8, height * zoom / 100 + 1.0))
    axis.imshow(np.asarray(picture), interpolation="nearest")
    axis.set_axis_off()
    _colour_bar(fig, axis, cmap, low, high, _meaning(scores, method, scale, "relevance per tile"), 0.035, scores)
    return _finish(fig, title, synthetic)


def output_columns(values, names: list[str], task_type: str) -> dict[str, str]:
    """A file's outputs as summary columns, named as ``medattn predict`` names them: ``prob_<class>`` per output
    (classification), ``risk`` (survival: the log relative risk, not a probability) or ``pred_<target>`` in the
    table's units (regression)."""
    return task_types.of(task_type).row(values, names)


def write_summary(out: OutputFolder, rows: list[dict]) -> None:
    """``summary.csv`` in ``out``: one row per explained file (file, method, target, its outputs
    (:func:`output_columns`), outputs written)."""
    out.save_dicts("summary.csv", rows, list(rows[0]))
