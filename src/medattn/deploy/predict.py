"""Predictions from files, as a table a clinic can file: probabilities, predicted labels, provenance.

:func:`predict_files` prepares every file with the model's stored preprocessing
(:func:`medattn.data.preprocessing.inference_dataset`), runs a :class:`~medattn.deploy.runtime.Runner`
(checkpoint or ONNX file) and returns the rows:

* classification: ``file`` (and ``side`` for models trained on left/right halves), ``prob_<class>`` per
  output, the predicted label (binary/multi-label: ``pred_<class>`` = 1 when ``prob >= threshold``, with
  the ``threshold_<class>`` used; multi-class: ``pred_label``, the arg-max class), ``model_id`` and
  ``checkpoint_sha256``;
* segmentation: ``file``, ``label_map`` (the NIfTI written on the input's grid, a PNG for a 2D image given
  to a model trained on slices, see :mod:`medattn.deploy.segmentation`; a 3D model segments the whole volume, by
  sliding windows of its input size where larger), ``voxels_<class>`` and
  ``volume_mm3_<class>`` per foreground class (empty for 2D images), ``model_id`` and ``checkpoint_sha256``.
  Models trained on slices take one file per batch (volumes differ in their slice count). A DICOM series also gets
  its label map as a DICOM Segmentation ``<stem>_seg.dcm`` beside the NIfTI (:mod:`medattn.runtime.dicom_results`,
  with highdicom); ``PredictionTable.notes`` says what was written, or why not.

A model whose training run did not learn (:mod:`medattn.runtime.learned`) gets a last column ``run_verdict``
(``DID NOT LEARN: <reasons>``) in every row and a warning first in ``PredictionTable.notes``.

With ``skip_bad`` a file that cannot be read or prepared is left out of the rows and listed in
``PredictionTable.bad`` as (file, reason); without it the first one raises a UserError naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from medattn.data.base import collate
from medattn.data.preprocessing import inference_dataset, segments_whole_volumes
from medattn.outputs import OutputFolder
from medattn.runtime import learned
from medattn.runtime.threshold import resolve_thresholds
from medattn.vocabulary import task_types

from .format import learning_of
from .runtime import Runner


@dataclass
class PredictionTable:
    """CSV header and rows; ``bad``: (file, reason) of the files left out; ``threshold_source``: where the
    thresholds came from (binary/multi-label only); ``notes``: lines for the user (the DICOM Segmentations of DICOM
    series written, or why not)."""

    header: list[str]
    rows: list[list]
    bad: list[tuple[str, str]] = field(default_factory=list)
    threshold_source: str | None = None
    notes: list[str] = field(default_factory=list)


def predict_files(runner: Runner, inputs: list[tuple[Path, ...]], batch_size: int = 8, skip_bad: bool = False,
                  threshold: str | None = None, label_dir: Path | None = None, overwrite: bool = False,
                  names: list[str] | None = None, accepted: dict[tuple, str] | None = None,
                  dicom_dir: Path | None = None) -> PredictionTable:
    """Rows for ``inputs`` (one tuple of paths per sample: two for subtraction models); ``threshold`` is
    the ``--threshold`` text (overrides the stored thresholds); segmentation label maps go to ``label_dir``
    (:class:`~medattn.outputs.OutputFolder`: never over an input, over an existing file only with
    ``overwrite``; every name is checked before the first prediction). ``names``: the samples' ids, in a ``patient``
    column (a bag model's patients, :func:`medattn.data.kinds.bags.patient_bags`; default: the first file, in ``file``).
    ``accepted`` (``--accept-features``): a last column ``features_accepted`` with how each sample's features differ
    from the model's training features (:func:`medattn.data.provenance.check_bags`; empty where they do not).
    ``dicom_dir``: the folder of the DICOM SR reports of a classification or survival model's DICOM inputs (none
    without it); a segmentation model's go beside its DICOM Segmentations in ``label_dir``."""
    prep = runner.preprocessing
    whole = segments_whole_volumes(prep)  # a 3D segmentation model segments every voxel, not its training crop
    dataset = inference_dataset(prep, inputs, skip_bad, names, whole)
    first = "file" if names is None else "patient"  # the column naming each sample
    if prep.slice_axis is not None or whole:
        batch_size = 1  # volumes of different sizes do not stack
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=collate, num_workers=0)
    names = prep.output_names
    provenance = [runner.model_id, runner.checkpoint_sha256]
    table = PredictionTable([], [])
    segmentation = task_types.of(prep.task_type).voxel_labels
    if segmentation:
        from .segmentation import sliding_note, whole_volume_probabilities, write_label_map

        table.header = ["file", "label_map", *[f"voxels_{n}" for n in names[1:]],
                        *[f"volume_mm3_{n}" for n in names[1:]], "model_id", "checkpoint_sha256"]
        maps, stems, dicom = _label_map_folder(runner, dataset, label_dir, overwrite)
        reports = _reports(runner, dataset, maps, stems)
    else:
        cut, decision = _columns(runner, threshold, table, first)
        reports = _reports(runner, dataset, None if dicom_dir is None else OutputFolder(
            dicom_dir, [p for item in dataset.items for p in item.paths], overwrite))
    if accepted is not None:
        table.header.append("features_accepted")
    items = {item.id: item for item in dataset.items}
    slid = 0  # volumes segmented by sliding windows
    for batch in loader:
        if whole:
            probabilities, windows = whole_volume_probabilities(runner, batch)
            slid += int(windows and batch["id"][0] not in dataset.bad)
        else:
            probabilities = runner.probabilities(batch)
        for sample_id, p in zip(batch["id"], probabilities):
            if sample_id in dataset.bad:
                continue
            item = items[sample_id]
            if segmentation:
                labels = torch.from_numpy(np.asarray(p).argmax(0))  # inputs of one name get <name>, <name>_2, ...
                out, voxels, volumes = write_label_map(labels, item.paths[0], prep, maps, stems[sample_id], dicom)
                _report_sizes(reports, item, names, voxels, volumes, dicom.saved.get(stems[sample_id]))
                sizes = [f"{v:.3f}" for v in volumes] if volumes is not None else [""] * len(voxels)
                table.rows.append([str(item.paths[0]), str(out), *voxels, *sizes, *provenance,
                                   *([] if accepted is None else [""])])
                continue
            probs = [f"{v:.6f}" for v in p]
            decided = task_types.of(prep.task_type).decide(p, names, cut)  # the cells of the decision columns
            _report_outputs(reports, item, prep, p, cut)
            sides = [item.side] if prep.split_sides else []
            table.rows.append([item.name, *sides, *probs, *decided, *provenance,
                               *([] if accepted is None else [accepted.get(tuple(item.paths), "")])])
    if segmentation:
        table.notes = dicom.notes() + ([sliding_note(slid, prep)] if slid else [])
    if reports is not None:
        reports[0].finish(reports[1])
        table.notes += reports[0].notes()
    if reasons := learned.not_learned(learning_of(runner.source)):  # the run did not learn: said per row
        table.header.append(learned.COLUMN)
        table.rows = [[*row, learned.column_value(reasons)] for row in table.rows]
        table.notes.insert(0, learned.warning_line(reasons))
    table.bad = _left_out(dataset, items)
    return table


def _columns(runner: Runner, threshold: str | None, table: PredictionTable, first: str):
    """A classification, survival or regression model's CSV header into ``table`` (``first``: the column naming each
    sample) -> (the thresholds, or None, the decision columns)."""
    prep, names = runner.preprocessing, runner.preprocessing.output_names
    kind = task_types.of(prep.task_type)  # its output columns, and those that decide (a risk or values: none)
    outputs, decision, cut = kind.columns(names), kind.decision_columns(names), None
    if kind.thresholds:
        cut, table.threshold_source = resolve_thresholds(runner.thresholds, threshold, prep.num_outputs)
    table.header = [first, *(["side"] if prep.split_sides else []), *outputs, *decision, "model_id",
                    "checkpoint_sha256"]
    return cut, decision


def _label_map_folder(runner: Runner, dataset, label_dir: Path | None, overwrite: bool):
    """The folder of a segmentation model's label maps (``label_dir``, default ``label_maps``) with every name claimed
    before the first prediction: each input's label map and, for a DICOM series or image, its DICOM Segmentation (when
    highdicom can write it) -> (the folder, the stem of each sample id, the DICOM Segmentation writer)."""
    from medattn.runtime.dicom_report import is_dicom_input
    from medattn.runtime.dicom_results import SegmentationWriter

    from .segmentation import label_map_name

    prep = runner.preprocessing
    maps = OutputFolder(label_dir if label_dir is not None else "label_maps",
                        [p for item in dataset.items for p in item.paths], overwrite)
    stems = {item.id: maps.stem_for(item.paths[0]) for item in dataset.items}
    dicom = SegmentationWriter(runner.model_id, runner.checkpoint_sha256, prep.synthetic)
    for item in dataset.items:
        maps.path(label_map_name(item.paths[0], prep, stems[item.id]))
        if is_dicom_input(item.paths[0]) and dicom.available:  # a DICOM series, or a 2D DICOM image
            maps.path(dicom.name(stems[item.id]))
    return maps, stems, dicom


def _reports(runner: Runner, dataset, folder: OutputFolder | None, stems: dict | None = None):
    """(the DICOM SR writer, ``folder``) for the DICOM inputs of ``dataset`` with every report's name claimed in
    ``folder`` (each input's stem: ``stems`` by sample id, else a new one), or None when there is no DICOM input, no
    folder, or the task has no report (regression)."""
    from medattn.runtime.dicom_report import ReportWriter, is_dicom_input

    prep = runner.preprocessing
    dicom = [item for item in dataset.items if is_dicom_input(item.paths[0])]
    if folder is None or not dicom or not task_types.of(prep.task_type).dicom_result:
        return None
    writer = ReportWriter(runner.model_id, runner.checkpoint_sha256, prep.synthetic)
    writer.stems = {}  # the first file of a sample -> the stem of its report (the two sides of a file share one)
    for item in dicom:
        if item.paths[0] not in writer.stems:
            writer.stems[item.paths[0]] = stems[item.id] if stems else folder.stem_for(item.paths[0])
            if writer.available:
                folder.path(writer.name(writer.stems[item.paths[0]]))
    return writer, folder


def _report_outputs(reports, item, prep, p, cut) -> None:
    """A classification or survival model's outputs ``p`` of ``item`` (thresholds ``cut``, or None) into its report."""
    if reports is None or item.paths[0] not in reports[0].stems:
        return
    names, side = prep.output_names, item.side if prep.split_sides else None
    kind = task_types.of(prep.task_type)
    if kind.events:
        causes = names if kind.causes else None  # competing risks: one risk per cause
        group = lambda w: w.risk([float(v) for v in p], causes, side)  # noqa: E731
    else:
        predicted = names[int(np.argmax(p))] if kind.class_index else None
        group = lambda w: w.classification(names, [float(v) for v in p], side, cut, predicted)  # noqa: E731
    reports[0].add(item.paths[0], reports[0].stems[item.paths[0]], group, key=side)


def _report_sizes(reports, item, names, voxels, volumes, segmentation) -> None:
    """A segmentation's sizes of ``item`` into its report: ``volumes`` in mm3, or, for a 2D image (``volumes`` None),
    the areas of ``voxels`` in mm2 where the image states its PixelSpacing; ``segmentation``: its DICOM Segmentation."""
    if reports is None or item.paths[0] not in reports[0].stems:
        return
    area = volumes is None
    if area:
        from medattn.runtime.dicom_report import source_headers

        spacing = source_headers(item.paths[0])[0].get("PixelSpacing")
        if spacing is None:
            return  # no size in mm2 to give
        volumes = [n * float(spacing[0]) * float(spacing[1]) for n in voxels]
    reports[0].add(item.paths[0], reports[0].stems[item.paths[0]],
                   lambda w: w.volumes(names, volumes, area), segmentation, key="sizes")


def _left_out(dataset, items: dict) -> list[tuple[str, str]]:
    """(the files, why) of each sample ``dataset`` left out as bad, one line per input, not per side (``items``: the
    dataset's items by sample id)."""
    seen, bad = set(), []
    for sample_id, reason in dataset.bad.items():
        item = items[sample_id]
        if item.paths not in seen:
            seen.add(item.paths)
            bad.append((", ".join(map(str, item.paths)), reason))
    return bad
