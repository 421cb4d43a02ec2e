"""Tile a slide: tissue mask on a thumbnail -> grid of square patches of a physical size -> quality filter.

The grid covers the slide with non-overlapping patches of ``patch_um`` microns (``size0`` level-0 px)
from (0, 0); a cell is a candidate when at least ``min_tissue_fraction`` of it lies in the tissue mask.
Each candidate is read at the best pyramid level, resized to ``patch_px`` and dropped when it is
predominantly white (white fraction > ``max_white``) or blurry (sharpness < ``min_sharpness``); see
:mod:`medattn.slides.tissue`. Coordinates are the patches' top-left corners in level-0 pixels (x, y),
the convention of CLAM and STAMP.
"""

from __future__ import annotations

import csv
import json
import queue
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..errors import UserError
from ..outputs import OutputFolder
from .mark import is_synthetic
from .reader import PatchGeometry, open_slide, patch_geometry, read_patch, reading, slide_mpp, thumbnail
from .settings import DEFAULT_SETTINGS, TileSettings, settings_changes
from .tissue import sharpness, tissue_mask, white_fraction, window_fractions

STATUSES = ("kept", "white", "blurry")
#: Outline colour per status (Okabe-Ito, told apart with the common colour-vision deficiencies): kept bluish green,
#: white blue, blurry vermillion.
COLOURS = {"kept": (0, 158, 115), "white": (0, 114, 178), "blurry": (213, 94, 0)}


@dataclass
class Tiles:
    """Tiling of one slide: every candidate (level-0 top-left (M, 2) int64, its tissue fraction, white
    fraction, sharpness and status) plus what is needed to read the kept patches again and draw them."""

    slide: Path
    mpp: float
    geometry: PatchGeometry
    settings: TileSettings
    coords: np.ndarray
    tissue: np.ndarray
    white: np.ndarray
    sharp: np.ndarray
    status: np.ndarray
    thumbnail: np.ndarray
    downsample: tuple[float, float]
    mask: np.ndarray
    synthetic: bool = False  # the slide says it is SYNTHETIC (medattn wsi synthetic: slides.mark.is_synthetic)

    @property
    def kept(self) -> np.ndarray:
        """(N, 2) int64 level-0 top-left corners of the kept patches."""
        return self.coords[self.status == "kept"]

    def counts(self) -> dict[str, int]:
        return {s: int((self.status == s).sum()) for s in STATUSES}

    def background(self) -> int:
        """Grid cells of the slide with too little tissue to be read (not candidates)."""
        width, height = (int(round(n * d)) for n, d in zip(self.thumbnail.shape[1::-1], self.downsample))
        size0 = self.geometry.size0
        cells = (width // size0) * (height // size0)
        return max(0, cells - len(self.coords))


def candidate_grid(mask: np.ndarray, downsample: tuple[float, float], dimensions: tuple[int, int], size0: int,
                   min_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Grid cells of ``size0`` level-0 px over a slide of ``dimensions`` (W, H) whose tissue fraction in
    ``mask`` (thumbnail of ``downsample`` level-0 px per px along x, y) is >= ``min_fraction`` (and > 0).

    -> (coords (M, 2) int64 level-0 top-left (x, y), row-major; tissue fractions (M,))."""
    xs = np.arange(0, dimensions[0] - size0 + 1, size0)
    ys = np.arange(0, dimensions[1] - size0 + 1, size0)
    grid = np.stack(np.meshgrid(xs, ys, indexing="xy"), -1).reshape(-1, 2).astype(np.int64)  # (M, 2) row-major
    dx, dy = downsample
    boxes = np.stack([np.floor(grid[:, 0] / dx), np.floor(grid[:, 1] / dy), np.ceil((grid[:, 0] + size0) / dx),
                      np.ceil((grid[:, 1] + size0) / dy)], axis=1).astype(np.int64)
    fraction = window_fractions(mask, boxes)
    keep = (fraction >= min_fraction) & (fraction > 0)
    return grid[keep], fraction[keep]


class PatchDataset(torch.utils.data.Dataset):
    """Patches of one slide at level-0 top-left ``coords`` (M, 2) -> dict(pixels (P, P, 3) uint8 tensor,
    white, sharpness). The slide is opened lazily in each DataLoader worker (OpenSlide handles do not
    pickle); ``stain`` (a fitted :class:`MacenkoNormalizer` or None) is applied after the quality measures."""

    def __init__(self, path: Path, coords: np.ndarray, geometry: PatchGeometry, white_level: int = 220,
                 stain=None, pixels: bool = True) -> None:
        self.path, self.coords, self.geometry = Path(path), np.asarray(coords), geometry
        self.white_level, self.stain, self.pixels = white_level, stain, pixels
        self._slide = None

    def __len__(self) -> int:
        return len(self.coords)

    def __getitem__(self, index: int) -> dict:
        if self._slide is None:
            self._slide = open_slide(self.path)
        x, y = self.coords[index]
        with reading(f"{self.path} at ({x}, {y})"):
            patch = read_patch(self._slide, x, y, self.geometry)
        item = {"white": white_fraction(patch, self.white_level), "sharpness": sharpness(patch)}
        if self.pixels:
            item["pixels"] = torch.from_numpy(self.stain(patch) if self.stain is not None else patch)
        return item


def tissue_candidates(slide, path: Path, settings: TileSettings):
    """-> (mpp, geometry, candidate coords (M, 2), tissue fractions (M,), thumbnail, downsample, mask);
    UserError naming ``path`` when the slide has no tissue."""
    settings.check()
    mpp = slide_mpp(slide, path, settings.mpp)
    try:
        geometry = patch_geometry(slide, mpp, settings.patch_um, settings.patch_px)
    except UserError as error:
        raise UserError(f"{path}: {error}") from None
    with reading(path):
        thumb, downsample = thumbnail(slide, settings.thumbnail_px)
    min_area = settings.min_tissue_area_um2 / (mpp**2 * downsample[0] * downsample[1])
    mask = tissue_mask(thumb, min_area, settings.min_saturation)
    coords, fraction = candidate_grid(mask, downsample, slide.dimensions, geometry.size0,
                                      settings.min_tissue_fraction)
    if len(coords) == 0:
        raise UserError(f"{path}: no tissue found (tissue mask covers {mask.mean():.1%} of the thumbnail; "
                        f"no {settings.patch_um:g}-micron patch has {settings.min_tissue_fraction:.0%} tissue)")
    return mpp, geometry, coords, fraction, thumb, downsample, mask


def loader(dataset: torch.utils.data.Dataset, batch_size: int, num_workers: int) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=num_workers,
                                       persistent_workers=False, pin_memory=torch.cuda.is_available())


class ReadAhead:
    """Iterate ``items`` while a background thread already produces the next ``depth`` of them.

    For a DataLoader without worker processes: the slide's reading and decoding (OpenSlide, PIL and NumPy
    release the GIL) overlap the encoder's compute on the same cores instead of alternating with it. An
    exception raised while producing is raised to the consumer, in order; a consumer that stops early (an
    error in the encoder) stops the thread after the item it is producing. ``len`` is that of ``items``, so a
    progress bar knows its total.
    """

    def __init__(self, items, depth: int = 2) -> None:
        self.items, self.depth = items, depth

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        done, stop = object(), threading.Event()
        handoff: queue.Queue = queue.Queue(maxsize=self.depth)

        def put(entry) -> bool:
            while not stop.is_set():
                try:
                    handoff.put(entry, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def produce() -> None:
            try:
                for item in self.items:
                    if not put((item, None)):
                        return
                put((done, None))
            except BaseException as error:  # re-raised in the consumer, where it can be handled
                put((done, error))

        thread = threading.Thread(target=produce, name="medattn-read-ahead", daemon=True)
        thread.start()
        try:
            while True:
                item, error = handoff.get()
                if error is not None:
                    raise error
                if item is done:
                    return
                yield item
        finally:
            stop.set()
            thread.join()


def one_line_errors(batches):
    """Yield from ``batches``; a UserError re-raised by a DataLoader worker (its traceback in the message)
    is raised again with its own last line only."""
    try:
        yield from batches
    except UserError as error:
        lines = [line for line in str(error).splitlines() if line.strip()]
        if len(lines) > 1:
            raise UserError(lines[-1].split("UserError: ", 1)[-1]) from None
        raise


def classify(white: np.ndarray, sharp: np.ndarray, settings: TileSettings) -> np.ndarray:
    """-> status per patch: "white" when white > max_white, else "blurry" when sharp < min_sharpness, else "kept"."""
    return np.where(white > settings.max_white, "white", np.where(sharp < settings.min_sharpness, "blurry", "kept"))


def tile_slide(path: Path, settings: TileSettings = DEFAULT_SETTINGS, num_workers: int = 0, progress=None) -> Tiles:
    """Tile one slide (module docstring). ``progress``: a callable wrapping an iterable (e.g. tqdm) or None."""
    path = Path(path)
    slide = open_slide(path)
    mpp, geometry, coords, fraction, thumb, downsample, mask = tissue_candidates(slide, path, settings)
    dataset = PatchDataset(path, coords, geometry, settings.white_level, pixels=False)
    white, sharp = [], []
    batches = loader(dataset, 64, num_workers)
    for batch in one_line_errors(progress(batches) if progress else batches):
        white.append(batch["white"].numpy())
        sharp.append(batch["sharpness"].numpy())
    white, sharp = np.concatenate(white), np.concatenate(sharp)
    return Tiles(path, mpp, geometry, settings, coords, fraction, white, sharp, classify(white, sharp, settings),
                 thumb, downsample, mask, is_synthetic(slide))


def draw_grid(thumb: np.ndarray, downsample: tuple[float, float], coords: np.ndarray, size0: int,
              status: np.ndarray | None = None, mpp: float | None = None, background: int | None = None) -> Image.Image:
    """The thumbnail with each patch outlined in the colour of its status (:data:`COLOURS`: kept bluish green,
    white blue, blurry vermillion; ``status`` None: all kept), above a legend naming each colour with its count
    and a scale bar (:func:`medattn.slides.figures.with_legend`).

    Outlines are drawn inside each cell, a twentieth of the cell's side on the thumbnail and at least 2 px wide, so a
    cell keeps its own colour when the picture is viewed smaller. ``mpp``: microns per level-0 px (None: "no
    scale"); ``background``: grid cells with too little tissue to be read (not outlined; counted in the legend)."""
    from .figures import draw_outlines, outline_width, side_px, tile_boxes, with_legend

    status = np.full(len(coords), "kept") if status is None else np.asarray(status)
    image = Image.fromarray(thumb).convert("RGB")
    width = outline_width(side_px(size0, downsample))
    boxes = tile_boxes(coords, size0, downsample)
    for name in STATUSES:
        draw_outlines(image, boxes[status == name], COLOURS[name], width)
    return with_legend(image, grid_legend(status, background), None if mpp is None else mpp * max(downsample), width)


def grid_legend(status: np.ndarray, background: int | None = None) -> list[tuple[tuple[int, int, int] | None, str]]:
    """The legend of :func:`draw_grid`: (colour, "kept 12"), (colour, "white 9 (dropped)"), (colour, "blurry 4
    (dropped)") and, when ``background`` is given, (None, "background 23 (too little tissue, not outlined)")."""
    status = np.asarray(status)
    entries = [(COLOURS[name], f"{name} {int((status == name).sum())}" + ("" if name == "kept" else " (dropped)"))
               for name in STATUSES]
    if background is not None:
        entries.append((None, f"background {background} (too little tissue, not outlined)"))
    return entries


def write_tiles(tiles: Tiles, out_dir: Path) -> dict[str, Path]:
    """Write ``<stem>.csv`` (x, y, tissue_fraction, white_fraction, sharpness, status: every candidate;
    x, y level-0 px), ``<stem>.json`` (slide, mpp, geometry, settings, counts) and ``<stem>.png`` (the
    thumbnail with the grid drawn), each atomically. The JSON is written last and marks the slide as done: the
    folder is one of "skip what is done" (:class:`~medattn.outputs.OutputFolder` ``resume``, judged by
    :func:`tiles_done`)."""
    out = OutputFolder(out_dir, resume=True)
    stem = tiles.slide.stem
    rows = [[int(x), int(y), f"{t:.4f}", f"{w:.4f}", f"{s:.2f}", status]
            for (x, y), t, w, s, status in zip(tiles.coords, tiles.tissue, tiles.white, tiles.sharp, tiles.status)]
    image = draw_grid(tiles.thumbnail, tiles.downsample, tiles.coords, tiles.geometry.size0, tiles.status, tiles.mpp,
                      tiles.background())
    meta = {"slide": str(tiles.slide), "mpp": tiles.mpp, "geometry": asdict(tiles.geometry),
            "settings": asdict(tiles.settings), "counts": tiles.counts(), "background": tiles.background(),
            "synthetic": tiles.synthetic}
    return {"csv": out.save_csv(f"{stem}.csv", ["x", "y", "tissue_fraction", "white_fraction", "sharpness",
                                                 "status"], rows),
            "png": out.save_image(f"{stem}.png", image, format="PNG"),
            "json": out.save_json(f"{stem}.json", meta, indent=2)}


def tiles_done(out_dir: Path, slide: Path, settings: TileSettings, overwrite: bool = False) -> bool:
    """Whether ``out_dir`` already holds ``slide``'s tiles made with ``settings`` (its JSON, written last, reads and
    records them); UserError when they were made from another file of the same name or with other settings, saying
    which (``overwrite`` tiles again); an unreadable record is redone."""
    meta_path = Path(out_dir) / f"{Path(slide).stem}.json"
    if overwrite or not meta_path.is_file():
        return False
    try:
        meta = json.loads(meta_path.read_text())
        stored, source = dict(meta["settings"]), Path(meta["slide"]).name
    except (ValueError, KeyError, TypeError):
        return False
    if source != Path(slide).name:
        raise UserError(f"{meta_path}: holds the tiles of {source}, not of {Path(slide).name}; use another --out")
    changes = settings_changes(stored, settings)
    if changes:
        raise UserError(f"{meta_path}: tiled with other settings ({', '.join(changes)}); use --overwrite to tile "
                        f"again or another --out")
    return True


def read_tiles(tiles_dir: Path, slide: Path) -> tuple[np.ndarray, dict]:
    """-> (kept coords (N, 2) int64, the JSON metadata) written by :func:`write_tiles` for ``slide``;
    UserError naming the file when missing or malformed."""
    meta_path, csv_path = (Path(tiles_dir) / f"{Path(slide).stem}.{kind}" for kind in ("json", "csv"))
    for path in (meta_path, csv_path):
        if not path.is_file():
            raise UserError(f"{path}: tiles not found (run medattn wsi tile first)")
    try:
        meta = json.loads(meta_path.read_text())
        PatchGeometry(**meta["geometry"])
        counts = {status: int(meta["counts"][status]) for status in STATUSES}
        rows = []
        with open(csv_path, newline="") as f:
            for number, row in enumerate(csv.DictReader(f), start=2):  # every row checked: none silently dropped
                if row.get("status") not in STATUSES:
                    raise ValueError(f"row {number}: status {row.get('status')!r} is not one of {', '.join(STATUSES)}")
                x, y = int(row["x"]), int(row["y"])
                if row["status"] == "kept":
                    rows.append((x, y))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise UserError(f"{csv_path}: malformed tiles ({type(error).__name__}: {error})") from None
    if len(rows) != counts["kept"]:
        raise UserError(f"{csv_path}: {len(rows)} kept tile(s), but {meta_path.name} counts {counts['kept']}: the "
                        f"table was edited or cut short; tile the slide again (medattn wsi tile --overwrite)")
    return np.array(rows, dtype=np.int64).reshape(-1, 2), meta
