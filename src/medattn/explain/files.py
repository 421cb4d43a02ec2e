"""``explain_files``: heatmaps of a checkpoint's predictions on files, written beside a summary table.

Each file is prepared exactly as ``medattn predict`` prepares it, with the preprocessing stored in the checkpoint
(:mod:`medattn.data.preprocessing`; subtraction models take the subtracted volume of each pair), and its
probabilities come from the same :class:`~medattn.runtime.predictor.Predictor` (training precision, sliding
windows), so the summary equals predict's CSV. Outputs per file, in ``out_dir``: 2D images ``<stem>.png`` (the image
beside the map over it, at a readable size, with a colour bar saying what the colours mean, a title naming model,
method and file, the SYNTHETIC note below the panels); 3D volumes ``<stem>.nii.gz`` (the map on the input file's
grid and affine) and ``<stem>_preview.png`` (the sagittal, coronal and axial planes through the centre of the largest
relevance of the smoothed map, named from the grid's affine and drawn at the voxels' physical aspect, the image alone
above the map over it, with the same colour bar and title); whole-slide bags (HDF5) ``<stem>_tiles.csv``,
``<stem>_tiles.h5`` and ``<stem>_tiles.geojson`` (tile squares in level-0 pixels with their score, for QuPath) (a
score per tile) and ``<stem>.png`` (the scores drawn on the tile coordinates). With method ``auto``/``rollout``, a bag
longer than ``chunk_size`` tiles whose blocks all stream (SeqNorm) is explained by rollout streamed in bounded memory
(the gradient rule needs a backward over the whole bag). ``summary.csv`` lists every file with the method used, the
explained output and its probabilities. ``colour_scale`` (:data:`~medattn.explain.outputs.COLOUR_SCALES`) sets where
the pictures' colours end. ``slides``: a folder that does not exist is refused; a bag whose slide is not found there
is refused when it is the only file, and with several bags each is reported in ``missing_slides`` (the command warns
per slide and counts them) and drawn at its tile coordinates. A bag whose slide is a DICOM whole-slide image (a folder
of ``.dcm`` instances in ``slides``) also gets its tile scores as DICOM Microscopy Bulk Simple Annotations
``<stem>_tiles.dcm`` referencing the slide (:mod:`medattn.runtime.dicom_results`, with highdicom; the report's
``notes`` say what was written, or why not). Which of these a file gets is its input kind's choice
(:meth:`~medattn.data.input_kinds.InputKind.explain_file` calls a method of :class:`FileHeatmaps`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..data import input_kinds
from ..errors import UserError
from ..runtime import learned
from ..runtime.dicom_results import TileAnnotationWriter
from ..slides.dicom import is_dicom
from ..slides.heatmap import prediction_text
from ..slides.identity import mismatch, recorded
from ..vocabulary import task_types
from . import outputs, tile_scores
from .core import check_method, explain


@dataclass
class ExplainedFiles:
    """``rows``: one summary row per file (file, method, target, its outputs: ``prob_<class>``..., a survival
    model's ``risk`` or a regression model's ``pred_<target>``; outputs; ``run_verdict`` when the run did not learn);
    ``streamed``: how many bags went through streamed rollout; ``synthetic``: the model was trained on SYNTHETIC
    data."""

    rows: list[dict] = field(default_factory=list)
    streamed: int = 0
    synthetic: bool = False
    checkpoint: str = ""
    #: (file, why its slide was not drawn) for each bag whose slide ``--slides`` did not find
    missing_slides: list[tuple[str, str]] = field(default_factory=list)
    #: bags whose slide ``--slides`` found (None without ``--slides`` or for inputs that are not bags)
    slides_found: int | None = None
    #: lines for the user: the DICOM annotations of DICOM slides written, or why not
    notes: list[str] = field(default_factory=list)
    #: bags drawn on a slide of their slide's name that they cannot confirm (extracted before ``slide_identity``)
    by_name_only: list[str] = field(default_factory=list)


def streams(model) -> bool:
    """Whether every block of ``model`` streams and has factorised rows (streamed rollout applies)."""
    from ..attention.rows import FactorisedRows
    from .rows import rows_for

    blocks = getattr(getattr(model, "encoder", None), "blocks", [])
    return len(blocks) > 0 and all(
        block.attn.stream_passes > 0 and isinstance(rows_for(block.attn), FactorisedRows) for block in blocks)


def streamed_bag(model, path: Path, chunk_size: int):
    """(logits (1, K), scores (N,), coords (N, 2), HDF5 attributes) by streamed rollout, the bag read chunk by
    chunk from the file; coords are zeros where the file has none (as the bag loader gives them)."""
    import h5py

    from ..data.readers.bags import bag_header, feature_key
    from .rollout import streaming_rollout

    rows, attrs = bag_header(path)
    try:
        with h5py.File(path, "r") as f:
            coords = (np.asarray(f["coords"][:rows], dtype=np.float32) if "coords" in f
                      else np.zeros((rows, 2), np.float32))
            logits, scores = streaming_rollout(model, f[feature_key(f)], torch.from_numpy(coords), chunk_size)
    except (OSError, ValueError) as error:
        if isinstance(error, UserError):
            raise
        raise UserError(f"{path}: {error}") from None
    return logits, scores, coords, attrs


def explain_files(checkpoint: str | Path, files: list, out_dir: str | Path, method: str = "auto",
                  target: int | None = None, chunk_size: int = 32_768, subtract: list | None = None,
                  overwrite: bool = False, slides: str | Path | None = None,
                  colour_scale: str = "full", accept_features: bool = False, device: str = "auto") -> ExplainedFiles:
    """Explain ``checkpoint``'s predictions on ``files`` into ``out_dir`` (see the module docstring); a
    subtraction model takes one ``subtract`` volume per file. Every file is checked, and every output name
    planned, before anything is written; outputs follow :class:`~medattn.outputs.OutputFolder` (never
    over an input, never over a file this call did not write unless ``overwrite``; inputs of one name get
    ``<name>``, ``<name>_2``, ...). ``slides``: the folder of the scanner files; a bag whose HDF5 names its slide
    (``medattn wsi extract`` writes the ``slide`` attribute) gets its tile map drawn on that slide's thumbnail (see the
    module docstring for a slide not found). ``colour_scale``: ``full`` or ``percentile``
    (:func:`~medattn.explain.outputs.colour_range`). A bag whose features were made otherwise than the model's
    training features (:mod:`medattn.data.provenance`) is refused before anything is written, unless
    ``accept_features``: then the summary's ``features_accepted`` column says how each differs. ``device``: where the
    model runs (:func:`~medattn.runtime.device.inference_device`; ``auto``: the best this machine has), whatever
    ``train.device`` it was trained with."""
    from ..data.base import collate
    from ..data.preprocessing import inference_dataset, sample_paths
    from ..data.provenance import check_bags
    from ..outputs import OutputFolder
    from ..runtime.device import inference_device
    from ..runtime.predictor import probabilities
    from ..runtime.trained import load_checkpoint

    where = inference_device(device)  # a device this machine lacks: before any work
    trained = load_checkpoint(checkpoint)
    model, prep = trained.model, trained.file_preprocessing("explain")
    _check_explainable(prep)
    kind = input_kinds.of(prep.input_kind)
    requested, method = method, check_method(model, method)  # a method the model cannot give: before any work
    outputs.colour_range([0.0], colour_scale)  # an unknown scale: one line, before any work
    if slides is not None and not Path(slides).is_dir():
        raise UserError(f"--slides {slides}: no such folder (the folder of the scanner files the bags were "
                        f"extracted from)")
    dataset = inference_dataset(prep, sample_paths(prep, files, subtract))
    _check_files(dataset, kind)  # every file before anything is written
    accepted = check_bags(kind, trained.meta.get("features"), prep.input_shape[0],
                          [item.paths for item in dataset.items], accept_features)
    headers = [kind.header(item.paths[0]) for item in dataset.items]  # a bag's tile count and attributes, else (0, {})
    missing, by_name, found = _missing_slides(dataset, headers, kind, slides)
    out = OutputFolder(out_dir, [p for item in dataset.items for p in item.paths], overwrite)
    dicom = None if slides is None or not kind.instances else \
        TileAnnotationWriter(trained.model_id, trained.checkpoint_sha256, prep.synthetic)
    stems = _planned_stems(out, dataset, kind, headers, slides, dicom)
    predictor = trained.predictor(where)
    report = ExplainedFiles(synthetic=prep.synthetic, checkpoint=str(trained.folder), missing_slides=missing,
                            slides_found=found, by_name_only=by_name)
    for index, (item, stem) in enumerate(zip(dataset.items, stems)):
        path = item.paths[0]
        tiles, attrs = headers[index]
        streamed = tiles > chunk_size and requested in ("auto", "rollout") and streams(model)
        used = "rollout" if streamed else method
        title = f"{trained.model_id} | {used} | {path.name}"
        if streamed:
            logits, scores, coords, attrs = streamed_bag(model, path, chunk_size)
            explained, report.streamed = "", report.streamed + 1
            probs = probabilities(logits.detach().float(), prep.task_type, prep.target_mean, prep.target_std)[0]
        else:
            sample = dataset[index]
            x, kwargs = kind.one(sample, where)
            result = explain(model, x, method, target, **kwargs)
            explained = "" if result.target is None else int(result.target[0])
            with torch.no_grad():
                probs = predictor.probabilities(collate([sample]))[0]
        if kind.instances:  # a slide's map names the slide's prediction
            title = f"{title} | {prediction_text(probs.tolist(), prep.output_names, prep.task_type)}"
        heatmaps = FileHeatmaps(out, stem, path, prep.spacing, title, used, prep.synthetic, attrs, slides,
                                colour_scale, dicom)
        written = heatmaps.tiles(coords, scores) if streamed else \
            kind.explain_file(heatmaps, path, sample, result.relevance[0].cpu())
        report.rows.append({"file": item.id, "method": used, "target": explained,
                            **outputs.output_columns(probs, prep.output_names, prep.task_type),
                            "outputs": " ".join(written),
                            **({"features_accepted": accepted.get(tuple(item.paths), "")} if accept_features else {})})
    report.notes = [] if dicom is None else dicom.notes()
    if reasons := learned.not_learned(learned.recorded_learning(trained.folder)):  # the run did not learn
        report.rows = [{**row, learned.COLUMN: learned.column_value(reasons)} for row in report.rows]
        report.notes.insert(0, learned.warning_line(reasons))
    outputs.write_summary(out, report.rows)
    return report


def _check_explainable(prep) -> None:
    """Refuse a checkpoint whose predictions explain cannot map back onto the file: a segmentation model, a model
    trained on left/right halves."""
    if task_types.of(prep.task_type).voxel_labels:
        raise UserError("explain explains class predictions; this is a segmentation checkpoint")
    if prep.split_sides:
        raise UserError("this checkpoint was trained on left/right halves; explain does not map a half's heatmap "
                        "back to the file yet (medattn predict gives both sides' probabilities)")


def _check_files(dataset, kind: input_kinds.InputKind) -> None:
    """Every input file of ``dataset`` exists and is a regular file (a folder where ``kind`` reads folders), else a
    UserError naming it."""
    from ..data.files import check_regular

    for item in dataset.items:
        for path in item.paths:
            try:
                check_regular(path, folders=kind.reads_folders)
            except (FileNotFoundError, ValueError) as error:
                raise UserError(f"{path}: {'no such file' if isinstance(error, FileNotFoundError) else error}") \
                    from None


def _missing_slides(dataset, headers: list, kind: input_kinds.InputKind, slides: str | Path | None) \
        -> tuple[list[tuple[str, str]], list[str], int | None]:
    """((sample, why its slide cannot be drawn on) for each bag whose slide ``slides`` does not hold
    (:func:`find_slide`), the samples drawn on a slide matched by name only (their bag records no identity), how many
    bags are drawn on their slide); empty lists and None without ``slides`` or for inputs that are not bags; a
    UserError when the one file explained is such a bag."""
    if slides is None or not kind.instances:
        return [], [], None
    missing, by_name = [], []
    for item, (_, attrs) in zip(dataset.items, headers):
        why = find_slide(attrs, slides)[1]
        if why:
            missing.append((item.id, why))
        elif recorded(attrs) is None:
            by_name.append(item.id)
    if missing and len(dataset.items) == 1:
        raise UserError(f"{dataset.items[0].paths[0]}: --slides {slides}: {missing[0][1]}")
    return missing, by_name, len(dataset.items) - len(missing)


def _planned_stems(out, dataset, kind: input_kinds.InputKind, headers: list, slides: str | Path | None,
                   dicom: TileAnnotationWriter | None) -> list[str]:
    """The stem of each input's outputs in ``out``, with every name this call may write claimed before any compute:
    the files of the input's ``kind``, ``summary.csv`` and the DICOM tile annotations of each bag whose slide is a
    DICOM whole-slide image (when ``dicom`` can write them)."""
    stems = [out.stem_for(item.paths[0]) for item in dataset.items]
    for stem in stems:
        for suffix in kind.explain_suffixes:
            out.path(stem + suffix)
    out.path("summary.csv")
    for stem, (_, attrs) in zip(stems, headers):  # a DICOM slide's tile annotations
        slide = None if dicom is None else slide_of(attrs, slides)
        if slide is not None and is_dicom(slide) and dicom.available:
            out.path(dicom.name(stem))
    return stems


@dataclass
class FileHeatmaps:
    """The files ``medattn explain`` writes for the input ``path`` (written as ``stem``... into ``out``), by how its
    kind draws the map (:class:`~medattn.data.input_kinds.Heatmaps`); each method returns the names written.
    ``spacing``: the preprocessing's (a volume's map goes back to the file's grid); ``attrs``: a bag's HDF5
    attributes; ``slides``: the folder of the scanner files; ``colour_scale``: ``full`` or ``percentile``; ``dicom``:
    the writer of a DICOM slide's tile annotations (None: none written)."""

    out: object
    stem: str
    path: Path
    spacing: tuple[float, ...] | None
    title: str
    method: str
    synthetic: bool
    attrs: dict
    slides: str | Path | None
    colour_scale: str = "full"
    dicom: TileAnnotationWriter | None = None

    def image(self, image: np.ndarray, relevance) -> list[str]:
        """``<stem>.png``: the image (C, H, W) beside the map (H, W) over it."""
        picture = outputs.readable_overlay(image, np.asarray(relevance), self.title, self.method, self.synthetic,
                                           scale=self.colour_scale)
        with self.out.write(f"{self.stem}.png") as tmp:
            picture.save(tmp, format="PNG")
        return [f"{self.stem}.png"]

    def volume(self, volume: np.ndarray, relevance) -> list[str]:
        """``<stem>.nii.gz``, the map (H, W, D) on the input file's grid and affine, and ``<stem>_preview.png``,
        the three planes of ``volume`` (H, W, D) through the centre of the largest relevance
        (:func:`~medattn.explain.outputs.volume_preview`), on the loader's grid: RAS+ at the preprocessing's spacing
        (the file's own where it does not resample)."""
        from ..data.readers.volumes import native_grid, ras_grid, to_native_grid, write_nifti

        array, affine = to_native_grid(torch.as_tensor(relevance).float(), self.path, self.spacing)
        write_nifti(self.out, f"{self.stem}.nii.gz", array, affine)
        spacing = self.spacing or ras_grid(*native_grid(self.path))[1]
        preview = outputs.volume_preview(volume, np.asarray(relevance), self.title, self.method, self.synthetic,
                                         affine=np.diag([*spacing, 1.0]), scale=self.colour_scale)
        with self.out.write(f"{self.stem}_preview.png") as tmp:
            preview.save(tmp, format="PNG")
        return [f"{self.stem}.nii.gz", f"{self.stem}_preview.png"]

    def tiles(self, coords: np.ndarray, relevance) -> list[str]:
        """The tile table, HDF5 and map of a bag's scores (N,) at ``coords`` (N, 2) (:func:`_write_tiles`)."""
        return _write_tiles(self.out, self.stem, coords, np.asarray(relevance), self.method, self.attrs, self.title,
                            self.synthetic, self.slides, self.colour_scale, self.dicom)


def find_slide(attrs: dict, slides: str | Path) -> tuple[Path | None, str]:
    """(the scanner file a bag was extracted from, "") when its map can be drawn on it: the bag's ``slide`` attribute
    names a file (or a DICOM slide's folder of instances) in the folder ``slides``, the bag records its tile side in
    level-0 pixels (``patch_size_level0``) and that file is the slide the bag records it was extracted from (its
    ``slide_identity``, :mod:`medattn.slides.identity`; a bag recording none is matched by name); else (None, why
    not, in words)."""
    name = attrs.get("slide")
    if not isinstance(name, str) or not name:
        return None, "the bag names no slide (no 'slide' attribute: medattn wsi extract writes it)"
    if Path(name).name != name:
        return None, f"the bag's slide attribute {name!r} is not a file name"
    path = Path(slides) / name
    if not (path.is_file() or (path.is_dir() and is_dicom(path))):
        return None, f"its slide {name} is not in {slides}"
    if "patch_size_level0" not in attrs:
        return None, "the bag does not record its tile side in level-0 pixels (patch_size_level0)"
    expected = recorded(attrs)  # None: a bag extracted before identities were recorded, matched by name only
    why = "" if expected is None else mismatch(path, expected)
    return (None, f"{path} is not the slide the bag was extracted from: {why}") if why else (path, "")


def slide_of(attrs: dict, slides: str | Path | None) -> Path | None:
    """The scanner file a bag was extracted from (its ``slide`` attribute) in the folder ``slides``, if there and
    drawable (:func:`find_slide`)."""
    return None if slides is None else find_slide(attrs, slides)[0]


def _write_tiles(out, stem: str, coords: np.ndarray, scores: np.ndarray, method: str, attrs: dict,
                 title: str, synthetic: bool, slides: str | Path | None = None, scale: str = "full",
                 dicom: TileAnnotationWriter | None = None) -> list[str]:
    """A bag's tile table and HDF5, and its map where the tiles have coordinates: on the slide's thumbnail when
    the slide is found in ``slides``, else on a blank canvas, with a colour bar (colour ``scale``) and ``title``; a
    DICOM slide's tile annotations by ``dicom`` (when given); -> the names written."""
    written = tile_scores.write_tile_scores(out, stem, coords, scores, method, attrs)
    level0, side = tile_scores.level0_tiles(coords, attrs)  # STAMP's microns to level-0 pixels
    spread = bool(np.ptp(coords, axis=0).any())  # tiles at distinct places: something to draw
    if spread:
        tile_scores.write_tile_geojson(out, f"{stem}_tiles.geojson", level0, side, scores, method)
        written.append(f"{stem}_tiles.geojson")
    slide = slide_of(attrs, slides)
    if slide is not None and dicom is not None and is_dicom(slide):
        from ..slides.mark import SYNTHETIC_ATTR

        annotations = dicom.write(slide, level0, side, scores, method, out, stem, bool(attrs.get(SYNTHETIC_ATTR)))
        written += [annotations] if annotations else []
    if slide is not None:
        picture = tile_scores.slide_picture(slide, coords, scores, attrs, scale)
        title += f" | on {slide.name}" + (" (matched by name only)" if recorded(attrs) is None else "")
    elif spread:
        picture = tile_scores.tile_map(coords, scores, tile_scores.tile_size(coords, attrs), scale)
        title += (" | tiles at their coordinates (slide not given: --slides DIR draws them on it)" if slides is None
                  else " | tiles at their coordinates (slide not found in --slides)")
    else:
        return written
    with out.write(f"{stem}.png") as tmp:
        outputs.slide_map_figure(picture, scores, title, method, synthetic, scale).save(tmp, format="PNG")
    return [*written, f"{stem}.png"]
