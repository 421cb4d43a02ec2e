"""SYNTHETIC whole-slide images for tests and demos: small pyramidal tiled TIFFs (not real tissue).

A slide is H x W level-0 pixels at ``mpp`` microns per pixel (stored as TIFF resolution tags, so
OpenSlide reports ``openslide.mpp-x``; ``mpp=None`` writes none), with ``levels`` pyramid levels
downsampled by 4 each (generic tiled TIFF, 256-px tiles, deflate). On a near-white, slightly noisy
background lie three tissue blobs (pink stroma with fibre texture and purple nuclei of ~4 um radius);
the third blob is out of focus (Gaussian blur, sigma 6 px); a grey, unsaturated smudge (dust, not
tissue) sits on the glass. A ``tumour`` slide carries a planted tumour region in the first blob:
nuclei denser, larger and darker. The returned masks are the ground truth at level 0. Each slide's
ImageDescription starts with :data:`~medattn.slides.mark.SYNTHETIC_MARK`: ``medattn wsi tile`` and ``wsi extract``
carry the mark into the tiles' JSON and the bags' HDF5 attribute (:mod:`medattn.slides.mark` reads it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import ndimage

from ..extras import require
from ..outputs import OutputFolder, atomic
from ..slides.mark import SYNTHETIC_MARK

BACKGROUND = 243
STROMA = np.array([232, 150, 196], dtype=np.float32)
NUCLEUS = np.array([82, 38, 128], dtype=np.float32)
BLUR_SIGMA = 6.0
MASKS = ("tissue", "blurry", "tumour", "dust")
TRUTH_DIR = "truth"
#: The formats :func:`write_synthetic_cohort` writes: format -> the name of the slide of stem ``{}`` (DICOM: a folder).
FORMATS = {"tiff": "{}.tif", "ome-tiff": "{}.ome.tif", "dicom": "{}"}


@dataclass(frozen=True)
class SyntheticSlide:
    """Ground truth of a written slide, (H, W) bool masks at level 0."""

    path: Path
    tissue: np.ndarray
    blurry: np.ndarray
    tumour: np.ndarray
    dust: np.ndarray
    mpp: float | None


def _ellipse(shape, centre, radii, rng, roughness=0.15) -> np.ndarray:
    """A blob: an ellipse whose radius wobbles by smooth noise of relative size ``roughness``."""
    yy, xx = np.mgrid[: shape[0], : shape[1]].astype(np.float32)
    r = np.hypot((xx - centre[0]) / radii[0], (yy - centre[1]) / radii[1])
    noise = ndimage.gaussian_filter(rng.standard_normal(shape).astype(np.float32), sigma=min(radii) / 4)
    noise /= noise.std() + 1e-6
    return r < 1 + roughness * noise


def _nuclei(mask: np.ndarray, density: float, sigma: float, rng) -> np.ndarray:
    """(H, W) float32 in [0, 1]: round nuclei at Poisson positions inside ``mask`` (``density`` per px)."""
    seeds = (rng.random(mask.shape) < density) & mask
    blobs = ndimage.gaussian_filter(seeds.astype(np.float32), sigma=sigma) * (2 * np.pi * sigma**2)
    return np.clip(blobs * 1.6, 0, 1)


def render(shape=(1536, 2048), tumour: bool = True, seed: int = 0) -> tuple[np.ndarray, dict]:
    """-> (RGB (H, W, 3) uint8, ground-truth masks {"tissue", "blurry", "tumour", "dust"} (H, W) bool)."""
    rng = np.random.default_rng(seed)
    h, w = shape
    small = (h // 8, w // 8)  # blobs drawn at 1/8 and zoomed: smooth outlines at a fraction of the cost
    jitter = rng.uniform(-0.03, 0.03, size=(4, 2))
    specs = [((0.30, 0.40), (0.22, 0.28)), ((0.70, 0.30), (0.14, 0.18)), ((0.68, 0.75), (0.13, 0.15)),
             ((0.22, 0.82), (0.10, 0.08))]  # (centre, radii) as fractions of (w, h); the last is dust
    masks = []
    for (c, r), j in zip(specs, jitter):
        blob = _ellipse(small, ((c[0] + j[0]) * small[1], (c[1] + j[1]) * small[0]),
                        (r[0] * small[1], r[1] * small[0]), rng)
        masks.append(ndimage.zoom(blob.astype(np.float32), 8, order=1)[:h, :w] > 0.5)
    sharp_tissue, blurry, dust = masks[0] | masks[1], masks[2], masks[3] & ~(masks[0] | masks[1] | masks[2])
    tissue = sharp_tissue | blurry
    tumour_mask = np.zeros(shape, dtype=bool)
    if tumour:
        blob = _ellipse(small, (0.30 * small[1], 0.40 * small[0]), (0.09 * small[1], 0.09 * small[1]), rng, 0.1)
        tumour_mask = (ndimage.zoom(blob.astype(np.float32), 8, order=1)[:h, :w] > 0.5) & masks[0]
    fibres = ndimage.gaussian_filter(rng.standard_normal(shape).astype(np.float32), sigma=(1.0, 4.0))
    stroma = STROMA + 40 * fibres[..., None] / (fibres.std() + 1e-6) * np.array([0.3, 0.5, 0.3], np.float32)
    nuclei = np.maximum(_nuclei(tissue & ~tumour_mask, 0.004, 2.5, rng), _nuclei(tumour_mask, 0.008, 3.5, rng))
    dark = np.where(tumour_mask, 0.75, 1.0)[..., None]
    cell = stroma * (1 - nuclei[..., None]) + NUCLEUS * dark * nuclei[..., None]
    image = BACKGROUND + 2.0 * rng.standard_normal((h, w, 1)).astype(np.float32)
    image = np.repeat(image, 3, axis=2)
    image[dust] = 196 + 2.0 * rng.standard_normal((int(dust.sum()), 1))
    image[tissue] = cell[tissue]
    rows, cols = (np.flatnonzero(blurry.any(axis=a)) for a in (1, 0))
    if rows.size:  # blur a margin of 3 sigma around the out-of-focus blob, so its outline is soft too
        m = int(3 * BLUR_SIGMA)
        box = np.s_[max(rows[0] - m, 0): rows[-1] + m + 1, max(cols[0] - m, 0): cols[-1] + m + 1]
        image[box] = ndimage.gaussian_filter(image[box], sigma=(BLUR_SIGMA, BLUR_SIGMA, 0))
    return np.clip(image, 0, 255).astype(np.uint8), {"tissue": tissue, "blurry": blurry, "tumour": tumour_mask,
                                                      "dust": dust}


def write_pyramid(path: Path, rgb: np.ndarray, mpp: float | None, levels: int = 3, tile: int = 256,
                  description: str | None = None) -> None:
    """Write (H, W, 3) uint8 as a tiled pyramidal TIFF: level k downsampled 4^k by block means, with
    resolution tags (pixels per centimetre = 1e4 / (mpp 4^k)) when ``mpp`` is given and ``description`` (ASCII) as
    the first level's ImageDescription."""
    tifffile = require("tifffile", "writing a synthetic slide")

    with atomic(path) as tmp, tifffile.TiffWriter(tmp) as tif:
        for k, level in enumerate(pyramid_levels(rgb, levels)):
            extra = ({"resolution": (1e4 / (mpp * 4**k),) * 2, "resolutionunit": "CENTIMETER"} if mpp else
                     {"resolutionunit": "NONE"})
            tif.write(level, tile=(tile, tile), photometric="rgb", compression="zlib", compressionargs={"level": 1},
                      subfiletype=1 if k else 0, metadata=None,
                      **({"description": description} if description and not k else {}), **extra)


def pyramid_levels(rgb: np.ndarray, levels: int = 3) -> list[np.ndarray]:
    """(H, W, 3) uint8 -> ``levels`` levels, level k downsampled 4^k by block means (the base first)."""
    pyramid = [rgb]
    for _ in range(1, levels):
        level = pyramid[-1]
        h, w = level.shape[0] // 4 * 4, level.shape[1] // 4 * 4
        pyramid.append(level[:h, :w].reshape(h // 4, 4, w // 4, 4, 3).mean(axis=(1, 3)).round().astype(np.uint8))
    return pyramid


def write_synthetic_slide(path: Path, tumour: bool = True, seed: int = 0, shape=(1536, 2048),
                          mpp: float | None = 1.0, levels: int = 3) -> SyntheticSlide:
    """Render a SYNTHETIC slide (module docstring) and write it to ``path`` (.tif), marked as such
    (:data:`~medattn.slides.mark.SYNTHETIC_MARK`); -> its ground truth."""
    path = Path(path)
    rgb, masks = render(shape, tumour, seed)
    write_pyramid(path, rgb, mpp, levels, description=f"{SYNTHETIC_MARK}; seed {seed}")
    return SyntheticSlide(path=path, mpp=mpp, **masks)


def write_synthetic_cohort(folder: Path, count: int = 8, seed: int = 0, shape=(1536, 2048),
                           overwrite: bool = False, format: str = "tiff") -> list[Path]:
    """``count`` SYNTHETIC slides ``slide_000.tif``... in ``folder``, every other one with a tumour, plus
    ``slide_table.csv`` (PATIENT, FILENAME) and ``clinical_table.csv`` (PATIENT, TUMOUR 0/1) in the
    layout of the ``wsi_bags`` data kind, so extracted features train with ``medattn train``, and the
    ground truth of each slide as ``truth/<stem>.npz`` (:func:`load_truth`).

    ``format`` (:data:`FORMATS`): ``tiff`` (generic tiled TIFF, OpenSlide), ``ome-tiff`` (``slide_000.ome.tif``, the
    pyramid in SubIFDs, :func:`medattn.slides.ome.write_ome_tiff`) or ``dicom`` (a folder ``slide_000/`` of VL Whole
    Slide Microscopy instances, one per level, :func:`medattn.slides.dicom.write_dicom_slide`); the same pixels and
    pyramid in each, marked SYNTHETIC in the format's description. FILENAME is the stem ``wsi extract`` names the
    slide's bag by (``slide_000.ome`` for an OME-TIFF).

    The output policy (:class:`~medattn.outputs.OutputFolder`): an existing file of one of these names is
    refused unless ``overwrite`` (every name checked before the first slide is written); each file is written
    atomically."""
    from ..errors import UserError

    if format not in FORMATS:
        raise UserError(f"--format {format!r}: one of {', '.join(FORMATS)}")
    out = OutputFolder(folder, overwrite=overwrite)
    truth = OutputFolder(out.folder / TRUTH_DIR, overwrite=overwrite)
    names = [FORMATS[format].format(f"slide_{i:03d}") for i in range(count)]
    for name in names:
        out.path(name)
        truth.path(f"{Path(name).stem}.npz")
    out.path("slide_table.csv")
    out.path("clinical_table.csv")
    paths, rows = [], []
    for i, name in enumerate(names):
        stem, patient, tumour = Path(name).stem, f"patient_{i:03d}", i % 2 == 1
        masks = _write_slide(out, name, format, tumour, seed * 100_003 + i, shape, patient)
        with truth.write(f"{stem}.npz") as tmp:
            np.savez_compressed(tmp, **{key: masks[key] for key in MASKS})
        paths.append(out.folder / name)
        rows.append((patient, stem, int(tumour)))
    out.save_csv("slide_table.csv", ("PATIENT", "FILENAME"), ((p, s) for p, s, _ in rows))
    out.save_csv("clinical_table.csv", ("PATIENT", "TUMOUR"), ((p, t) for p, _, t in rows))
    return paths


def _write_slide(out: OutputFolder, name: str, format: str, tumour: bool, seed: int, shape, patient: str) -> dict:
    """One SYNTHETIC slide of :func:`write_synthetic_cohort` as ``name`` in ``out`` in ``format`` -> its masks."""
    if format == "tiff":
        with out.write(name) as tmp:
            slide = write_synthetic_slide(tmp, tumour=tumour, seed=seed, shape=shape)
        return {key: getattr(slide, key) for key in MASKS}
    rgb, masks = render(shape, tumour, seed)
    levels, description = pyramid_levels(rgb, 3), f"{SYNTHETIC_MARK}; seed {seed}"
    if format == "dicom":
        from ..slides.dicom import write_dicom_slide

        write_dicom_slide(OutputFolder(out.folder / name, overwrite=out.overwrite), levels, 1.0, description, patient)
    else:
        from ..slides.ome import write_ome_tiff

        write_ome_tiff(out, name, levels, 1.0, description)
    return masks


def load_truth(slide: Path) -> dict[str, np.ndarray]:
    """The ground truth :func:`write_synthetic_cohort` wrote for ``slide``: {"tissue", "blurry", "tumour",
    "dust"} -> (H, W) bool level-0 masks."""
    with np.load(Path(slide).parent / TRUTH_DIR / f"{Path(slide).stem}.npz") as stored:
        return {name: stored[name] for name in MASKS}
