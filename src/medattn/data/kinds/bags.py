"""Whole-slide images as bags of pre-extracted patch features (HDF5 per slide, CLAM or STAMP layout): the data kind
``wsi_bags`` and the patients of a slide table; a bag file is read by :mod:`medattn.data.readers.bags`."""

from __future__ import annotations

from pathlib import Path

from ...errors import UserError
from ..base import DataBundle, TaskInfo
from ..cohort.duplicates import resolve_duplicates
from ..cohort.labels import event_values, label_columns, label_entries, label_options, parse_cells
from ..cohort.splits import SPLIT_KEYS, parse_split, split_records
from ..options import check_keys, require
from ..preprocessing import Preprocessing
from ..provenance import MIXED_KEY, check_one_space, collect
from ..readers.bags import BagLoader, bag_synthetic, slide_shape
from ..tables import BadSamples, Record, RecordDataset, keep_valid, read_csv, require_columns, resolve_path

KEYS = frozenset({"feature_dir", "slide_table", "clinical_table", "patient_column", "filename_column",
                  "label_columns", "time_column", "event_column", "event_values", "cause_names", "split_column",
                  "task_type",
                  "classes", "num_classes", "max_instances",
                  "check_files", "slides_dir", MIXED_KEY}) | SPLIT_KEYS


def patient_bags(files: list[Path], slide_table: Path, patient_column: str = "PATIENT",
                 filename_column: str = "FILENAME", partial: bool = False) \
        -> tuple[list[tuple[Path, ...]], list[str], list[tuple[int, int]]]:
    """Feature files grouped by patient as the slide table says (training's ``wsi_bags`` joins a patient's slides
    into one bag, so predict does too) -> (one tuple of files per patient, in table order; the patients; (slides
    given, slides the table lists) per patient). A table name without ".h5" matches the file with it; a file the table
    does not name is a UserError naming it. A patient of whom some but not all listed slides are given is a UserError
    naming the patient and the slides missing (a prediction from part of a patient's slides is another prediction),
    unless ``partial``: then it is predicted from those given and the counts say so."""
    by_name = {}
    for path in files:
        by_name.setdefault(Path(path).name, []).append(Path(path))
    grouped: dict[str, list[Path]] = {}
    listed: dict[str, list[str]] = {}
    named = set()
    for patient, entries in _slides_by_patient({"slide_table": slide_table, "patient_column": patient_column,
                                               "filename_column": filename_column}).items():
        for name, _ in entries:
            file_name = _h5_name(name)
            named.add(file_name)
            listed.setdefault(patient, []).append(file_name)
            grouped.setdefault(patient, []).extend(by_name.get(file_name, []))
    unnamed = sorted(name for name in by_name if name not in named)
    if unnamed:
        raise UserError(f"{slide_table}: no row names {', '.join(unnamed[:3])}{' ...' if len(unnamed) > 3 else ''} "
                        f"({len(unnamed)} of the {len(files)} file(s)); every file must belong to a patient")
    patients = [patient for patient, paths in grouped.items() if paths]
    missing = {patient: [name for name in listed[patient] if name not in by_name] for patient in patients}
    short = [patient for patient in patients if missing[patient]]
    if short and not partial:
        first = short[0]
        raise UserError(f"{slide_table}: patient {first} lists {len(listed[first])} slides, "
                        f"{len(listed[first]) - len(missing[first])} given ({', '.join(missing[first][:3])} not given)"
                        f"{f', and {len(short) - 1} more patient(s) lack slides' if len(short) > 1 else ''}; give "
                        f"every slide of a patient, or --partial-patients predicts from those given (the CSV's "
                        f"slides_used and slides_listed say so)")
    counts = [(len(listed[patient]) - len(missing[patient]), len(listed[patient])) for patient in patients]
    return [tuple(grouped[patient]) for patient in patients], patients, counts


def _slides_by_patient(cfg: dict) -> dict[str, list[tuple[str, str]]]:
    """patient -> [(file name, "slide_table.csv row N")] from the slide table."""
    path = Path(cfg["slide_table"])
    patient_column = cfg.get("patient_column", "PATIENT")
    filename_column = cfg.get("filename_column", "FILENAME")
    header, rows = read_csv(path, "slide table")
    require_columns(header, [patient_column, filename_column], path, "slide table")
    slides: dict[str, list[tuple[str, str]]] = {}
    for number, row in rows:
        slides.setdefault(row[patient_column], []).append((row[filename_column], f"{path.name} row {number}"))
    return slides


def _h5_name(name: str) -> str:
    """A slide table entry's file name: ".h5" is appended when the name has no HDF5 suffix."""
    return name if name.lower().endswith((".h5", ".hdf5")) else f"{name}.h5"


def _slide_path(root: Path, name: str, where: str) -> Path:
    """The HDF5 file of a slide table entry (:func:`_h5_name`)."""
    return resolve_path(root, _h5_name(name), where)


def _entries(rows: list, clinical: Path, root: Path, slides: dict, label_columns: list[str], patient_column: str,
             split_column: str | None, classes, task_type: str | None, bad: BadSamples,
             events: dict[str, float] | None = None) -> list[tuple]:
    """(record, parsed labels, split) of each clinical row whose patient has slides and whose cells parse; the
    other rows are reported to ``bad``."""
    entries = []
    for number, row in rows:
        where = f"{clinical.name} row {number}"
        patient = row[patient_column]
        try:
            if patient not in slides:
                raise UserError(f"{where}: patient {patient!r} has no slide in the slide table")
            paths = tuple(_slide_path(root, name, slide_where) for name, slide_where in slides[patient])
            values = parse_cells([row[c] for c in label_columns], label_columns, classes, task_type, events)
            split = parse_split(row[split_column], where) if split_column else None
        except (UserError, ValueError) as exc:
            bad.report(str(exc) if str(exc).startswith(where) else f"{where}: {exc}")
            continue
        entries.append((Record(id=patient, patient=patient, where=where, paths=paths), values, split))
    return entries


def _one_feature_space(records: list[Record], dims: dict[int, Path], mixed) -> tuple[int, bool]:
    """The cohort's feature width (``dims``: a width -> the first file of that width, empty when the headers were not
    checked) -> (width, whether its bags mix feature spaces); a UserError naming two files of different widths, or
    of two feature spaces unless ``mixed`` (:func:`medattn.data.provenance.check_one_space`)."""
    if not dims:
        dims[slide_shape(records[0].paths[0])[1]] = records[0].paths[0]
    if len(dims) > 1:
        raise UserError(f"wsi_bags: bags of different feature dimensions: "
                        f"{', '.join(f'{path} has {width}' for width, path in list(dims.items())[:2])} "
                        f"(one extractor per cohort: extract every slide with the same one)")
    if not isinstance(mixed, bool):
        raise UserError(f"{MIXED_KEY} must be true or false, got {mixed!r}")
    return next(iter(dims)), check_one_space((path for record in records for path in record.paths), mixed)


def build_wsi_bags(cfg: dict, seed: int = 0, skip_bad: bool = False) -> DataBundle:
    """Whole-slide images as bags of pre-extracted features: one bag per patient.

    Keys: ``feature_dir`` (required; one HDF5 file per slide, CLAM layout ``features`` (N, F) +
    ``coords`` (N, 2) or STAMP layout ``feats`` + ``coords``, detected per file), ``slide_table``
    (required; CSV with ``patient_column`` (default "PATIENT") and ``filename_column`` (default
    "FILENAME"; ".h5" is appended when missing); several rows per patient = several slides, which
    are concatenated into one bag in table order), ``clinical_table`` (required; CSV with the same
    patient column and ``label_columns``; ``split_column`` optional), ``label_columns``
    (required; for ``task_type: survival`` instead ``time_column`` and ``event_column``), ``task_type``,
    ``classes`` (e.g. [LUAD, LUSC]: label cells hold class names),
    ``num_classes``, ``max_instances`` (training only: keep a random subset of at most this many
    instances per bag; default none), ``check_files`` (default true), ``slides_dir`` (the folder of the
    scanner files, named as the bags' ``slide`` attribute: report.html draws its case heatmaps on them,
    :mod:`medattn.explain.cases`; default none; a folder that does not exist is refused),
    ``mixed_feature_spaces`` (default false: bags that disagree on extractor, weights, tile side in microns or pixels,
    or stain normalisation are refused, naming two files, :func:`medattn.data.provenance.check_one_space`; true mixes
    them and the checkpoint records it), ``val_fraction``, ``test_fraction``, ``folds``, ``fold``.

    Patients of the slide table without a clinical row are not used; clinical rows without slides,
    labels that do not parse, missing files, bad layouts and empty bags are bad samples. Validation:
    file existence, HDF5 layout, shapes and empty bags at build time (``check_files``); with
    ``skip_bad`` the features are also read once at build time, so NaN/Inf features are dropped then;
    without it NaN/Inf raises at load time. No augmentation besides ``max_instances``.
    """
    kind = "wsi_bags"
    check_keys(cfg, KEYS, kind)
    for key in ("feature_dir", "slide_table", "clinical_table"):
        require(cfg, key, kind)
    root = Path(cfg["feature_dir"])
    if not root.is_dir():
        raise UserError(f"feature_dir {root}: folder not found")
    slides_dir = cfg.get("slides_dir")
    if slides_dir is not None and not (isinstance(slides_dir, str) and slides_dir and Path(slides_dir).is_dir()):
        raise UserError(f"slides_dir {slides_dir}: folder not found (the folder of the scanner files the bags were "
                        f"extracted from)")
    columns = label_columns(cfg, kind)
    patient_column, split_column = cfg.get("patient_column", "PATIENT"), cfg.get("split_column")
    max_instances = cfg.get("max_instances")
    if max_instances is not None and (not isinstance(max_instances, int) or max_instances < 1):
        raise UserError(f"max_instances must be a positive int, got {max_instances!r}")
    slides = _slides_by_patient(cfg)
    clinical = Path(cfg["clinical_table"])
    header, rows = read_csv(clinical, "clinical table")
    require_columns(header, [patient_column, *columns, *([split_column] if split_column else [])], clinical,
                    "clinical table")
    task_type, classes, _ = label_options(cfg)
    bad = BadSamples(skip_bad)
    entries = _entries(rows, clinical, root, slides, columns, patient_column, split_column, classes, task_type, bad,
                       event_values(cfg))
    records, spec, column, problems = label_entries(entries, columns, cfg)
    for message in problems:
        bad.report(message)
    column = column if split_column else None

    dims: dict[int, Path] = {}  # a feature width -> the first file of that width

    def check_headers(record: Record) -> None:
        for path in record.paths:
            dims.setdefault(slide_shape(path)[1], path)

    records, column = keep_valid(records, column, check_headers if cfg.get("check_files", True) else None, bad,
                                 f"wsi_bags {clinical}")
    records, column = resolve_duplicates(records, column, bad)
    feature_dim, mixes = _one_feature_space(records, dims, cfg.get(MIXED_KEY, False))  # before the first epoch
    plain = BagLoader(feature_dim)
    if skip_bad:
        records, column = keep_valid(records, column, plain, bad, f"wsi_bags {clinical}")
    parts = split_records(records, cfg, seed, column, spec.stratum)
    # one bag from a SYNTHETIC slide makes the cohort's results not clinical ones: the note is shown when any carries it
    synthetic = any(bag_synthetic(path) for record in records for path in record.paths)
    task = TaskInfo(spec.task_type, "bag", spec.num_outputs, (feature_dim,), spec.class_names, synthetic=synthetic,
                    **spec.targets(parts["train"]))
    features = collect(path for record in parts["train"] for path in record.paths)  # what made the training features
    if mixes:  # recorded: the model was trained knowingly on several feature spaces
        features[MIXED_KEY] = True
    return DataBundle(RecordDataset(parts["train"], BagLoader(feature_dim, max_instances)),
                      RecordDataset(parts["val"], plain), RecordDataset(parts["test"], plain), task,
                      skipped=bad.count, preprocessing=Preprocessing.of("wsi_bags", task), features=features)
