"""Predict from files: medattn predict MODEL FILES... --out CSV (MODEL: a checkpoint, or an exported .onnx or .pt2).

Each file is prepared with the preprocessing stored in the model (the training run's data config:
image size, channels, normalisation; voxel spacing, size, subtraction, left/right halves; feature bags
from HDF5), so a file gives the probability ``medattn eval`` gives it. Images: PNG, JPEG, TIFF, DICOM.
Volumes: NIfTI or a DICOM series folder (one series on one regular grid; ``--dicom-series UID`` picks one of a
folder holding several). Bags: one HDF5 file per slide. Models trained on subtraction
volumes take the second volume of each pair with ``--subtract`` (one per file, in order); models
trained on left/right halves give two rows per file (``side``).

Classification CSV: file, probabilities, the predicted label (binary/multi-label: from the validation
threshold stored at training, Youden's J, or ``--threshold``), model id and checkpoint hash.
Survival: a ``risk`` column (log relative risk, higher = earlier event); regression: ``pred_<target>`` columns in
the targets' units. Segmentation: a NIfTI label map per file on the input's grid (``--label-dir``) and
per-structure volumes in mm^3 in the CSV. A DICOM input also gets its results as a DICOM SR measurement report
(TID 1500: probabilities, risk or volumes; ``--dicom-dir``) and a segmentation a DICOM Segmentation.
``--skip-bad`` lists unreadable files with their reasons in
``<out>_skipped.csv`` instead of stopping. ``--patients SLIDE_TABLE`` joins each patient's slides into one bag, one
row per patient with ``slides_used`` and ``slides_listed``; a patient whose table lists slides not given is refused
(naming them) unless ``--partial-patients``. ``--device`` picks where a checkpoint runs (default: the best this
machine has), whatever device it was trained on. See docs/deploy.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from medattn.cli_args import add_device_option, positive_int
from medattn.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="run folder, checkpoint folder, model.safetensors, or a file written by "
                                           "medattn export (.onnx or .pt2)")
    parser.add_argument("files", nargs="+", help="image, volume (file or DICOM folder) or HDF5 feature files; a "
                                                  "folder of images or HDF5 files gives its files")
    parser.add_argument("--out", required=True, help="CSV to write")
    parser.add_argument("--subtract", nargs="+", metavar="FILE", default=None,
                        help="for subtraction models: the volume subtracted from each file, in the same order")
    parser.add_argument("--threshold", default=None,
                        help="decision threshold(s) in [0, 1]: one, or one per output comma-separated "
                             "(default: the validation threshold stored in the model)")
    parser.add_argument("--skip-bad", action="store_true",
                        help="leave out unreadable files and list them with reasons in <out>_skipped.csv")
    parser.add_argument("--label-dir", default=None,
                        help="segmentation: folder for the NIfTI label maps (default: <out>_labels beside the CSV)")
    parser.add_argument("--dicom-dir", default=None,
                        help="classification and survival models given DICOM inputs: folder for their DICOM SR "
                             "measurement reports (default: <out>_dicom beside the CSV; a segmentation model's go "
                             "beside its DICOM Segmentations in --label-dir)")
    parser.add_argument("--patients", default=None, metavar="SLIDE_TABLE",
                        help="bag models: join each patient's slides into one bag, as training did, by this slide "
                             "table (columns --patient-column, --filename-column); one row per patient")
    parser.add_argument("--patient-column", default="PATIENT",
                        help="with --patients: the slide table's column of patient ids (default %(default)s)")
    parser.add_argument("--partial-patients", action="store_true",
                        help="with --patients: predict a patient from the slides given when the table lists more "
                             "(refused by default); the CSV's slides_used and slides_listed say how many")
    parser.add_argument("--filename-column", default="FILENAME",
                        help="with --patients: the slide table's column of the bags' file names (\".h5\" may be "
                             "left out) (default %(default)s)")
    parser.add_argument("--dicom-series", action="append", default=None, metavar="UID",
                        help="a DICOM folder holding several series: read the one of this SeriesInstanceUID "
                             "(repeat for several folders; such a folder is refused without it)")
    parser.add_argument("--batch-size", type=positive_int, default=8,
                        help="files (or bags) per forward pass (default %(default)s)")
    parser.add_argument("--accept-features", action="store_true",
                        help="bag models: use bags whose features were made otherwise than the training features "
                             "(another extractor, tile size, mpp or layout; refused by default); the CSV's "
                             "features_accepted column says how each differs")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing --out CSV and label maps (inputs are never written over)")
    add_device_option(parser)


def run(args: argparse.Namespace) -> int:
    from medattn.data import input_kinds
    from medattn.data.preprocessing import BadInputFile, sample_paths
    from medattn.data.readers.dicom_series import choose_series
    from medattn.deploy.predict import predict_files
    from medattn.deploy.runtime import open_model
    from medattn.outputs import OutputFolder
    from medattn.runtime.threshold import parse_thresholds
    from medattn.vocabulary import task_types

    runner = open_model(args.checkpoint, args.device)
    prep = runner.preprocessing
    inputs, names = sample_paths(prep, args.files, args.subtract), None
    if args.partial_patients and args.patients is None:
        raise UserError("--partial-patients goes with --patients SLIDE_TABLE")
    if args.patients is not None:
        from medattn.data.kinds.bags import patient_bags

        if not input_kinds.of(prep.input_kind).joins_files:
            raise UserError(f"--patients joins a patient's slides for bag models; this one takes {prep.input_kind}")
        inputs, names, counts = patient_bags([paths[0] for paths in inputs], Path(args.patients),
                                             args.patient_column, args.filename_column, args.partial_patients)
    if args.threshold is not None and not task_types.of(prep.task_type).thresholds:
        raise UserError(f"--threshold is for binary and multi-label models; this one is {prep.task_type}")
    if args.threshold is not None:
        parse_thresholds(args.threshold, prep.num_outputs)  # every argument before the outputs are checked
    from medattn.data.provenance import check_bags

    accepted = check_bags(input_kinds.of(prep.input_kind), runner.features, prep.input_shape[0], inputs,
                          args.accept_features)  # bags made otherwise: refused before any output
    out = Path(args.out)
    label_dir = Path(args.label_dir) if args.label_dir else out.with_name(f"{out.stem}_labels")
    dicom_dir = Path(args.dicom_dir) if args.dicom_dir else out.with_name(f"{out.stem}_dicom")
    folder = OutputFolder(out.parent, [p for paths in inputs for p in paths], args.overwrite)
    skipped = f"{out.stem}_skipped.csv"
    for name in (out.name, *([skipped] if args.skip_bad else [])):  # before any prediction
        folder.path(name)
    try:
        with choose_series(args.dicom_series):
            table = predict_files(runner, inputs, args.batch_size, args.skip_bad, args.threshold, label_dir,
                                  args.overwrite, names, accepted if args.accept_features else None, dicom_dir)
    except BadInputFile as error:
        raise UserError(f"{error} (--skip-bad leaves out files that cannot be read and lists them)") from None
    if names is not None:  # how many of each patient's listed slides made its prediction
        used = dict(zip(names, counts))
        table.header += ["slides_used", "slides_listed"]
        table.rows = [[*row, *used[row[0]]] for row in table.rows]
    folder.save_csv(out.name, table.header, table.rows)
    tag = " [model trained on SYNTHETIC data]" if prep.synthetic else ""
    joined = f" (patients: {sum(map(len, inputs))} slides joined by {args.patients})" if names else ""
    print(f"wrote {len(table.rows)} prediction(s) to {out}{joined}{tag}")
    for note in table.notes:  # the DICOM Segmentations and SR reports of DICOM inputs written, or why not
        print(note)
    trained = f" (trained with train.device={runner.trained_device})" if runner.trained_device else ""
    print(f"ran on {runner.device}{trained}")
    if names is not None and any(given < listed for given, listed in counts):
        print(f"medattn: warning: {sum(given < listed for given, listed in counts)} patient(s) predicted from part of "
              f"their slides (--partial-patients): see the slides_used and slides_listed columns", file=sys.stderr)
    if accepted:
        print(f"{len(accepted)} input(s) with features made otherwise than the model's training features, used "
              f"(--accept-features): see the features_accepted column")
    if table.threshold_source:
        print(f"threshold: {table.threshold_source}")
    if args.skip_bad:
        folder.save_csv(skipped, ["file", "reason"], [list(b) for b in table.bad])
        if table.bad:
            print(f"skipped {len(table.bad)} bad file(s) (--skip-bad), listed with reasons in "
                  f"{out.with_name(skipped)}")
    return 0
