"""Whole-slide feature bags from real tissue texture (scikit-image's immunohistochemistry image, :mod:`.anatomy`)
with a SYNTHETIC finding, in CLAM's HDF5 layout.

A patient's bag is ``n`` tiles of 32 x 32 px cut at random places of the image under a random flip and
quarter turn, with the patient's own stain strengths (haematoxylin and DAB concentrations x U(0.8, 1.25)
in HED space, ``skimage.color.rgb2hed``), as two labs or two scanners stain differently.

* **finding** (label 1): a share ``TUMOUR_SHARE`` of the tiles is "positive": their DAB concentration is
  raised by ``DAB_BOOST`` (x), as in a hot spot of immunopositive cells; the burden tasks
  (:mod:`.outcomes`) give each patient's share instead of drawing it;
* bag sizes are drawn from ``BAG_SIZES`` whatever the label, so the bag size does not tell the classes
  apart (the benchmark's probe checks it).

Features (64 per tile, :func:`tile_features`) are fixed hand-made descriptors on very different scales (a
stand-in for a pretrained extractor whose feature scales nobody chose): HED histograms (counts), HED
percentiles, RGB means and spreads (0-255), gradient statistics and a fixed random projection of the 8 x 8
thumbnail.
"""

from __future__ import annotations

import numpy as np

TILE = 32
BAG_SIZES = (200, 1200)
TUMOUR_SHARE = (0.02, 0.1)
DAB_BOOST = (1.15, 1.45)
STAIN_SPREAD = (0.8, 1.25)
FEATURE_DIM = 64
_PROJECTION_SEED = 20261125


def _projection() -> np.ndarray:
    """(192, 16): the fixed random projection of an 8 x 8 x 3 thumbnail (the same for every bag)."""
    return np.random.default_rng(_PROJECTION_SEED).standard_normal((8 * 8 * 3, 16)).astype(np.float32) / 8


def tile_features(tiles: np.ndarray) -> np.ndarray:
    """(n, 32, 32, 3) uint8 RGB tiles -> (n, 64) float32 features (see the module docstring)."""
    from skimage.color import rgb2hed

    n = len(tiles)
    rgb = tiles.astype(np.float32)
    hed = rgb2hed(tiles).reshape(n, -1, 3).astype(np.float32)  # (n, P, 3)
    edges = [np.linspace(-0.05, 0.25, 9)] * 3
    histograms = np.concatenate([np.stack([np.histogram(h[:, c], bins=edges[c])[0] for h in hed])
                                 for c in range(3)], axis=1).astype(np.float32)  # (n, 24) counts
    percentiles = np.percentile(hed, [10, 50, 90], axis=1).transpose(1, 2, 0).reshape(n, 9)  # (n, 9)
    spread = np.concatenate([hed.mean(1), hed.std(1)], axis=1)  # (n, 6)
    colour = np.concatenate([rgb.reshape(n, -1, 3).mean(1), rgb.reshape(n, -1, 3).std(1)], axis=1)  # (n, 6)
    grey = rgb.mean(-1)
    gradient = np.hypot(np.diff(grey, axis=1)[:, :, :-1], np.diff(grey, axis=2)[:, :-1, :]).reshape(n, -1)
    texture = np.stack([gradient.mean(1), gradient.std(1), np.percentile(gradient, 90, axis=1)], axis=1)  # (n, 3)
    thumbnail = rgb.reshape(n, 8, 4, 8, 4, 3).mean((2, 4)).reshape(n, -1) / 255.0  # (n, 192)
    return np.concatenate([histograms, percentiles, spread, colour, texture, thumbnail @ _projection()],
                          axis=1).astype(np.float32)


def ihc_bag(image: np.ndarray, positive: bool, rng: np.random.Generator, share: float | None = None,
            sizes: tuple[int, int] | None = None, shares: tuple[float, float] | None = None,
            count: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One patient's bag: -> (features (n, 64) float32, coords (n, 2) int64 tile corners in the image).
    ``share``: the chance that a tile of a positive bag is a hot-spot tile (None: drawn from ``shares``, default
    ``TUMOUR_SHARE``; either way the random stream is the same up to that draw); ``count``: instead, exactly this
    many hot-spot tiles (at most n). ``sizes``: the range n is drawn from (default ``BAG_SIZES``)."""
    from skimage.color import hed2rgb, rgb2hed

    n = int(rng.integers(*(sizes or BAG_SIZES)))
    views = [np.rot90(image[:, ::-1] if flip else image, turns) for flip in (0, 1) for turns in range(4)]
    corners = rng.integers(0, image.shape[0] - TILE, size=(n, 2))
    which = rng.integers(len(views), size=n)
    tiles = np.stack([views[v][y:y + TILE, x:x + TILE] for v, (y, x) in zip(which, corners)])
    hed = rgb2hed(tiles)
    hed[..., 0] *= rng.uniform(*STAIN_SPREAD)
    hed[..., 2] *= rng.uniform(*STAIN_SPREAD)
    if count is not None:
        chosen = np.zeros(n, bool)
        chosen[rng.choice(n, size=min(count, n), replace=False)] = True
        hed[chosen, ..., 2] *= rng.uniform(*DAB_BOOST)
    elif positive:
        chosen = rng.random(n) < (rng.uniform(*(shares or TUMOUR_SHARE)) if share is None else share)
        hed[chosen, ..., 2] *= rng.uniform(*DAB_BOOST)
    tiles = (np.clip(hed2rgb(hed), 0, 1) * 255).round().astype(np.uint8)
    return tile_features(tiles), corners.astype(np.int64)
