"""Whole-slide-like feature bags from a second real tissue, scikit-image's retinal fundus photograph
(:func:`.anatomy.retina_image`), with a SYNTHETIC finding, and a second feature extractor.

A patient's bag is ``n`` tiles of 32 x 32 px cut at random places inside the field of view (the dark surround
excluded) under a random flip and quarter turn, with the patient's own brightness and colour balance (each RGB
channel x U(0.85, 1.15)), as two cameras differ.

* **finding**: a tile is "positive" when it holds 2-4 small dark-red spots (haemorrhage-like, radius 1.5-3.5 px,
  green and blue darkened by ``strength``, red by half as much): a local texture, not a whole-tile stain shift;
* **features** (96 per tile, :func:`conv_features`): a fixed random two-layer convolutional network (3x3 conv, ReLU,
  4x4 average pooling, 3x3 conv, ReLU), the global mean and maximum of each map: a stand-in for a pretrained CNN
  extractor (its scales, like a real one's, were chosen by nobody), another extractor than :mod:`.ihc`'s.
"""

from __future__ import annotations

import numpy as np

TILE = 32
FEATURE_DIM = 96
_WEIGHT_SEED = 20261128


def tile_corners(image: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, 2) int64 top-left corners of tiles lying wholly inside the field of view (the fundus's bright disc)."""
    grey = image.mean(-1)
    size = image.shape[0]
    corners = np.empty((0, 2), np.int64)
    while len(corners) < n:
        drawn = rng.integers(0, size - TILE, size=(2 * n, 2))
        inside = np.array([grey[y:y + TILE:8, x:x + TILE:8].min() > 20 for y, x in drawn])
        corners = np.concatenate([corners, drawn[inside]])
    return corners[:n].astype(np.int64)


def _plant_spots(tile: np.ndarray, strength: float, rng: np.random.Generator) -> None:
    """2-4 dark-red spots, in place, in one float (32, 32, 3) tile."""
    yy, xx = np.mgrid[:TILE, :TILE]
    for _ in range(int(rng.integers(2, 5))):
        cy, cx, r = rng.uniform(4, TILE - 4), rng.uniform(4, TILE - 4), rng.uniform(1.5, 3.5)
        spot = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * r ** 2))[..., None]  # (32, 32, 1)
        tile *= 1 - spot * strength * np.array([0.5, 1.0, 1.0])


def retina_bag(image: np.ndarray, rng: np.random.Generator, sizes: tuple[int, int], share: float = 0.0,
               count: int | None = None, strength: tuple[float, float] = (0.5, 0.8)) -> tuple[np.ndarray, np.ndarray]:
    """One patient's bag of ``n`` ~ U(``sizes``) tiles, each positive (with the finding) with chance ``share``, or
    exactly ``count`` of them (at most n): -> (features (n, 96) float32, coords (n, 2) int64)."""
    n = int(rng.integers(*sizes))
    corners = tile_corners(image, n, rng)
    which = rng.integers(8, size=n)
    gain = rng.uniform(0.85, 1.15, size=3)
    tiles = np.stack([np.rot90(image[y:y + TILE, x:x + TILE][:, ::-1] if v >= 4 else image[y:y + TILE, x:x + TILE],
                               v % 4) for v, (y, x) in zip(which, corners)]).astype(np.float32) * gain
    positives = min(int(count), n) if count is not None else int(rng.binomial(n, share))
    chosen = rng.choice(n, size=positives, replace=False)
    level = rng.uniform(*strength)
    for index in chosen:
        _plant_spots(tiles[index], level, rng)
    tiles = np.clip(tiles, 0, 255).round().astype(np.uint8)
    return conv_features(tiles), corners


def _weights() -> tuple[np.ndarray, np.ndarray]:
    """The fixed random filters: (16, 3, 3, 3) and (48, 16, 3, 3), He-scaled (the same for every bag)."""
    rng = np.random.default_rng(_WEIGHT_SEED)
    first = (rng.standard_normal((16, 3, 3, 3)) * np.sqrt(2 / 27)).astype(np.float32)
    second = (rng.standard_normal((48, 16, 3, 3)) * np.sqrt(2 / 144)).astype(np.float32)
    return first, second


def conv_features(tiles: np.ndarray) -> np.ndarray:
    """(n, 32, 32, 3) uint8 RGB tiles -> (n, 96) float32: the global mean and maximum of each of the 48 maps of a
    fixed random 3x3 conv - ReLU - 4x4 average pool - 3x3 conv - ReLU network (see the module docstring)."""
    import torch
    import torch.nn.functional as F

    first, second = (torch.from_numpy(w) for w in _weights())
    out = []
    with torch.no_grad():
        for start in range(0, len(tiles), 4096):
            x = torch.from_numpy(tiles[start:start + 4096]).permute(0, 3, 1, 2).float() / 255.0  # (b, 3, 32, 32)
            h = F.avg_pool2d(F.relu(F.conv2d(x, first, padding=1)), 4)  # (b, 16, 8, 8)
            h = F.relu(F.conv2d(h, second, padding=1)).flatten(2)  # (b, 48, 64)
            out.append(torch.cat([h.mean(-1), h.amax(-1)], dim=1))
    return torch.cat(out).numpy().astype(np.float32)
