"""Features per slide as CLAM- or STAMP-layout HDF5, resumable and sharded across processes.

One file per slide, ``<out>/<slide stem>.h5``, with attributes ``patch_size_um``, ``patch_size_px``,
``patch_size_level0``, ``mpp``, ``extractor``, ``stain_norm``, ``slide``, ``slide_identity`` (JSON of the slide's
dimensions, size and digest, :mod:`medattn.slides.identity`), ``tile_settings``, ``synthetic`` (True, only for a slide
written by ``medattn wsi synthetic``: :func:`medattn.slides.mark.is_synthetic`), and
  * CLAM layout (default): ``features`` (N, F) float32, ``coords`` (N, 2) int64 level-0 top-left (x, y) px;
  * STAMP layout: ``feats`` (N, F) float32, ``coords`` (N, 2) float32 top-left (x, y) in microns (level-0
    px x mpp), and STAMP's attributes ``unit`` = "um", ``tile_size_um``, ``tile_size_px``, ``feat_type`` = "tile".
The ``wsi_bags`` data kind reads either as it is.
A file is written under a temporary name and renamed when complete, so a file under the final name is
whole; on a rerun a slide is skipped when its file reads (:func:`medattn.data.readers.bags.slide_shape`) and
was made with the same settings from the same slide, redone when it does not read, and refused when made otherwise
or from another slide of the same name (``overwrite`` replaces it). Under ``torchrun`` (env ``RANK``,
``WORLD_SIZE``) rank r takes slides r, r + W, ... of the sorted list and writes only those.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import h5py
import numpy as np
import torch

from ..data.readers.bags import WRITTEN_LAYOUTS, slide_shape, write_bag
from ..errors import UserError, writing
from ..outputs import OutputFolder
from ..runtime.distributed import rank_and_world  # noqa: F401  (here before: medattn.slides.rank_and_world)
from ..text import bars_off
from .extractors import Extractor
from .identity import IDENTITY_ATTR, identity, recorded
from .mark import SYNTHETIC_ATTR, is_synthetic
from .reader import PatchGeometry, open_slide, reading, thumbnail
from .settings import settings_changes
from .stain import MacenkoNormalizer
from .tiling import (
    DEFAULT_SETTINGS,
    PatchDataset,
    ReadAhead,
    TileSettings,
    classify,
    loader,
    one_line_errors,
    read_tiles,
    tissue_candidates,
)
from .tissue import tissue_mask

#: What a rerun must match to skip a slide (layout: from the datasets; tile_settings: JSON of the TileSettings that
#: chose the patches, the tiles' own with --tiles).
CHECKED_ATTRS = ("patch_size_um", "patch_size_px", "extractor", "stain_norm", "layout", "tile_settings")
LAYOUTS = WRITTEN_LAYOUTS


def shard(items: list, rank: int, world: int) -> list:
    """Rank ``rank`` of ``world`` takes items[rank::world]: disjoint shards that together hold every item."""
    return list(items)[rank::world]


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise UserError(f"--layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")


def write_features(out: OutputFolder, name: str, features: np.ndarray, coords: np.ndarray, attrs: dict,
                   layout: str = "clam") -> None:
    """Write the CLAM- or STAMP-layout HDF5 file ``name`` (module docstring) in ``out`` atomically (temporary name,
    then rename) with the one bag writer, :func:`medattn.data.readers.bags.write_bag`; ``coords`` (N, 2) level-0 px,
    ``attrs`` as :func:`attributes` gives them."""
    check_layout(layout)
    write_bag(out, name, features, coords, attrs, layout)


def done(path: Path, attrs: dict, overwrite: bool = False) -> bool:
    """Whether ``path`` already holds this slide's features made with ``attrs`` (module docstring)."""
    if overwrite or not path.exists():
        return False
    try:
        slide_shape(path)
        with h5py.File(path, "r") as f:
            stored = {k: f.attrs.get(k) for k in (*CHECKED_ATTRS, IDENTITY_ATTR)} | {
                "layout": "stamp" if "feats" in f else "clam"}
    except (OSError, ValueError):
        return False  # unreadable or incomplete: redo
    differs = [f"{k}={stored[k]}" for k in CHECKED_ATTRS if k != "tile_settings" and str(stored[k]) != str(attrs[k])]
    made_from = recorded(stored)  # files written before identities were recorded: judged by the rest
    if made_from is not None and attrs.get(IDENTITY_ATTR) is not None and made_from != attrs[IDENTITY_ATTR]:
        differs.append(f"made from another slide of this name ({made_from['width']} x {made_from['height']} px, "
                       f"{made_from['bytes']} bytes)")
    if stored["tile_settings"] is not None:  # files written before settings were recorded: judged by the rest
        differs += settings_changes(json.loads(str(stored["tile_settings"])),
                                    TileSettings(**json.loads(attrs["tile_settings"])))
    if differs:
        raise UserError(f"{path}: exists with other settings ({', '.join(differs)}); use --overwrite or another --out")
    return True


@dataclass
class SlideResult:
    slide: Path
    status: str  # "done", "skipped" (already done), "failed"
    kept: int = 0
    dropped: dict = field(default_factory=dict)
    seconds: float = 0.0
    message: str = ""
    filtered_when: str = ""  # "tiling": ``dropped`` is what `medattn wsi tile` dropped (extract --tiles)


@dataclass
class Patches:
    """What :func:`extract_slide` reads of a slide: ``coords`` to read (level-0 top-left), whether to ``check``
    them with the quality filter (False: ``medattn wsi tile`` did, and ``tiled_dropped`` holds what it dropped),
    the stain ``normalizer`` or None, the settings that ``tiled`` the slide, whether it is ``synthetic``, and its
    ``identity`` (:func:`medattn.slides.identity.identity`)."""

    mpp: float
    geometry: PatchGeometry
    coords: np.ndarray
    check: bool
    normalizer: MacenkoNormalizer | None
    tiled: TileSettings
    tiled_dropped: dict | None
    synthetic: bool
    identity: dict


def _patches(path: Path, settings: TileSettings, tiles_dir: Path | None, stain: str) -> Patches:
    """The patches of ``path`` to read (:class:`Patches`): tiled here with ``settings``, or those kept by the
    tiles in ``tiles_dir``."""
    slide = open_slide(path)
    synthetic, tiled_dropped = is_synthetic(slide), None
    if tiles_dir is None:
        mpp, geometry, coords, _, thumb, downsample, mask = tissue_candidates(slide, path, settings)
        check, tiled = True, settings
    else:
        coords, meta = read_tiles(tiles_dir, path)
        mpp, geometry, check = meta["mpp"], PatchGeometry(**meta["geometry"]), False
        tiled = TileSettings(**meta["settings"])
        tiled_dropped = {s: int(meta["counts"][s]) for s in ("white", "blurry")}  # read_tiles checked them
        synthetic = synthetic or bool(meta.get(SYNTHETIC_ATTR, False))
        if (tiled.patch_um, tiled.patch_px) != (settings.patch_um, settings.patch_px):
            raise UserError(f"{path}: tiles in {tiles_dir} are {tiled.patch_um:g} um / {tiled.patch_px} px, "
                            f"not {settings.patch_um:g} um / {settings.patch_px} px")
        if len(coords) == 0:
            raise UserError(f"{path}: the tiles in {tiles_dir} keep no patch")
        if stain == "macenko":
            with reading(path):
                thumb, downsample = thumbnail(slide, settings.thumbnail_px)
            mask = tissue_mask(thumb, 0, settings.min_saturation)
    normalizer = None
    if stain == "macenko":
        try:
            normalizer = MacenkoNormalizer().fit(thumb[mask])
        except UserError as error:
            raise UserError(f"{path}: {error}") from None
    return Patches(mpp, geometry, coords, check, normalizer, tiled, tiled_dropped, synthetic, identity(path, slide))


def extract_slide(path: Path, out_path: Path, extractor: Extractor, settings: TileSettings = DEFAULT_SETTINGS,
                  tiles_dir: Path | None = None, stain: str = "none", batch_size: int = 64, num_workers: int = 0,
                  progress=None, layout: str = "clam", read_ahead: bool = True) -> tuple[int, dict]:
    """Features of one slide's kept patches -> ``out_path`` (module docstring); -> (kept, dropped per reason).

    Without ``tiles_dir`` the slide is tiled on the fly (tissue mask, grid, white and blur filter on the
    patches as they are read, each patch read once). With it, the patches ``medattn wsi tile`` kept are read and
    ``dropped`` holds what that tiling dropped. ``progress`` wraps the batch iterable
    (e.g. tqdm). Without DataLoader workers a thread reads the next batches while the encoder runs
    (``read_ahead``, :class:`ReadAhead`)."""
    path = Path(path)
    patches = _patches(path, settings, tiles_dir, stain)
    mpp, geometry, coords, check = patches.mpp, patches.geometry, patches.coords, patches.check
    dataset = PatchDataset(path, coords, geometry, settings.white_level, stain=patches.normalizer)
    features, kept_coords, statuses = [], [], []
    start = 0
    batches = loader(dataset, batch_size, num_workers)
    if num_workers == 0 and read_ahead:  # worker processes read ahead by themselves
        batches = ReadAhead(batches)
    for batch in one_line_errors(progress(batches) if progress else batches):
        n = len(batch["white"])
        status = (classify(batch["white"].numpy(), batch["sharpness"].numpy(), settings) if check
                  else np.full(n, "kept"))
        keep = torch.from_numpy(status == "kept")
        if keep.any():
            features.append(extractor(batch["pixels"][keep]).numpy())
            kept_coords.append(coords[start:start + n][status == "kept"])
        statuses.append(status)
        start += n
    status = np.concatenate(statuses)
    dropped = {s: int((status == s).sum()) for s in ("white", "blurry")}
    if not features:
        raise UserError(f"{path}: every patch was dropped ({dropped['white']} white, {dropped['blurry']} blurry)")
    attrs = attributes(settings, mpp, geometry, extractor.name, stain, path, patches.tiled) | extractor.record()
    attrs[IDENTITY_ATTR] = json.dumps(patches.identity, sort_keys=True)  # which slide, beyond its name
    if patches.synthetic:  # the mark follows the data: the wsi_bags kind reads it (TaskInfo.synthetic)
        attrs[SYNTHETIC_ATTR] = True
    with writing(out_path):  # disk full, permissions: one line, and nothing is left under the final name
        write_features(OutputFolder.within(Path(out_path).parent), Path(out_path).name, np.concatenate(features),
                       np.concatenate(kept_coords), attrs, layout)  # the slide's file: its command checked the name
    if patches.tiled_dropped is not None:  # filtered when tiled: what `wsi tile` dropped, not the zeros seen here
        dropped = dict(patches.tiled_dropped)
    return int(sum(len(f) for f in features)), dropped


def attributes(settings: TileSettings, mpp: float, geometry: PatchGeometry, extractor: str, stain: str,
               slide: Path, tiled: TileSettings | None = None) -> dict:
    """The HDF5 attributes of a slide's features; ``tiled``: the settings that chose its patches (default
    ``settings``: extraction tiled on the fly with them)."""
    return {"patch_size_um": float(settings.patch_um), "patch_size_px": int(settings.patch_px), "mpp": float(mpp),
            "patch_size_level0": int(geometry.size0), "extractor": extractor, "stain_norm": stain,
            "slide": Path(slide).name, "tile_settings": json.dumps(asdict(tiled or settings), sort_keys=True)}


def tile_settings(slide: Path, settings: TileSettings, tiles_dir: Path | None) -> str:
    """JSON of the settings that chose a slide's patches, as :func:`attributes` records them: those ``medattn wsi
    tile`` recorded in ``tiles_dir``, else ``settings`` (extraction tiles on the fly with them)."""
    tiled = settings if tiles_dir is None else TileSettings(**read_tiles(tiles_dir, slide)[1]["settings"])
    return json.dumps(asdict(tiled), sort_keys=True)


def extract_slides(slides: list[Path], out_dir: Path, extractor: Extractor, settings: TileSettings = DEFAULT_SETTINGS,
                   tiles_dir: Path | None = None, stain: str = "none", batch_size: int = 64, num_workers: int = 0,
                   skip_bad: bool = False, overwrite: bool = False, rank: int = 0, world: int = 1,
                   progress: bool = False, layout: str = "clam") -> list[SlideResult]:
    """Extract this rank's shard of ``slides`` into ``out_dir`` (module docstring); one result per slide.

    A bad slide (unreadable, no mpp, no tissue, nothing kept, cannot write) raises UserError, or with
    ``skip_bad`` is recorded as "failed" and the others continue."""
    from tqdm.auto import tqdm

    check_layout(layout)
    out_dir = OutputFolder(out_dir, resume=True).create()  # each slide's file is judged by done() below
    mine = shard(sorted(slides), rank, world)
    results = []
    label = f"rank {rank}: " if world > 1 else ""
    for path in tqdm(mine, desc=f"{label}slides", unit="slide", disable=bars_off(progress), position=0):
        out_path = out_dir / f"{path.stem}.h5"
        expected = {"patch_size_um": float(settings.patch_um), "patch_size_px": int(settings.patch_px),
                    "extractor": extractor.name, "stain_norm": stain, "layout": layout}
        try:
            expected["tile_settings"] = tile_settings(path, settings, tiles_dir)
            if out_path.exists() and not overwrite:  # a rerun: the file must come from this slide
                expected[IDENTITY_ATTR] = identity(path, open_slide(path))
        except UserError as error:  # the slide's tiles are missing or malformed, or it does not open: a bad slide
            if not skip_bad:
                raise
            results.append(SlideResult(path, "failed", message=str(error)))
            continue
        if done(out_path, expected, overwrite):
            results.append(SlideResult(path, "skipped"))
            continue
        start = time.perf_counter()

        def bar(batches, path=path):
            return tqdm(batches, desc=f"{label}{path.stem}", unit="batch", leave=False, position=1,
                        disable=bars_off(progress))

        try:
            kept, dropped = extract_slide(path, out_path, extractor, settings, tiles_dir, stain, batch_size,
                                          num_workers, bar if progress else None, layout)
        except UserError as error:
            if not skip_bad:
                raise
            results.append(SlideResult(path, "failed", message=str(error)))
            continue
        results.append(SlideResult(path, "done", kept, dropped, time.perf_counter() - start,
                                   filtered_when="" if tiles_dir is None else "tiling"))
    return results
