"""The realistic development benchmark: tasks from real anatomy with SYNTHETIC findings, written in the users'
formats with a patient-level split and a config that trains on them.

=================  ==========================================================================================
``brain_mri_2d``   axial T1 slices of the MNI152 template, 8-bit PNG 64 x 64 + CSV (``image_table``)
``brain_mri_3d``   T1 slabs of the MNI152 template, NIfTI 4 mm (50 x 58 x 20) + CSV (``volume_table``)
``ihc_bags``       bags of 200-1200 tiles of the immunohistochemistry image, CLAM HDF5 (64 features per tile)
                   + slide and clinical tables (``wsi_bags``)
``ihc_survival``   the same bags with a hot-spot burden per patient that raises the hazard: overall survival
                   in months with censoring (``task_type: survival``, :mod:`.outcomes`)
``ihc_regression`` the same bags, the burden setting a biomarker level (``task_type: regression``)
``ihc_rare``,      more bag members of the family (another tissue and extractor, rare and diffuse findings, a count
``retina_*``       target and a count-driven survival, bags up to 20,000 tiles): :mod:`.bag_tasks`
=================  ==========================================================================================

Every task is generated deterministically from ``(seed, cohort)``: cohort ``a`` is the development cohort,
``b`` an external one (another scanner or stain, :data:`.brain.COHORTS`), for external-cohort evaluation.
Labels are balanced; each case is its own patient; the split (``train``/``val``/``test``, by patient) is a
column of the table. A one-number probe (:func:`probe`: image maximum and mean, or bag size) is scored on
the written data and saved with it (``probe.json``): a task of at least ``PROBE_MIN_CASES`` cases whose probe
reaches AUROC ``PROBE_LIMIT`` is refused, since a trivial statistic would solve it; for the burden tasks the
probe's C-index (``PROBE_LIMIT_C_INDEX``) or its |Pearson r| with the target (``PROBE_LIMIT_R``) (:data:`PROBES`).

An unlabelled pool (``pool`` cases, image and volume tasks) for ``medattn pretrain``: more patients from the same
generator and cohort (findings in half of them, as in the labelled cases), written under ``pool/`` with
``pool.csv`` (a ``path`` column, no label, no split) and named in the config as ``pretrain.pool``. Its random
stream is its own, so the labelled cases are the same with or without it, and its patients are new ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import yaml

from medattn.errors import UserError, writing
from medattn.outputs import OutputFolder
from medattn.vocabulary import task_types
from medattn.vocabulary.task_types import Binary, Regression, Survival

from . import anatomy, brain, outcomes
from .bag_tasks import BagSpec, write_bags

SPLITS = {"train": 180, "val": 60, "test": 60}
PROBE_LIMIT = 0.7
PROBE_LIMIT_C_INDEX = PROBE_LIMIT  # a C-index is an AUROC over the comparable pairs
# |Pearson r| of AUROC 0.7 for a balanced binary label with normal scores: d = sqrt(2) Phi^-1(0.7) = 0.742,
# r = d / sqrt(d^2 + 4) = 0.348 (R^2 0.12)
PROBE_LIMIT_R = 0.35
PROBE_MIN_CASES = 100  # below this the probe's AUROC is too noisy to refuse a task on
TAG = "real anatomy, SYNTHETIC findings"
LAYOUT = "layout"  # the mean of each half along every axis (quadrants in 2D, octants in 3D)
#: task type (its class, :mod:`medattn.vocabulary.task_types`) -> (the probe's key in probe.json, what it scores, the
#: score at which a task is refused).
PROBES = {Binary: ("probe_auroc", "AUROC", PROBE_LIMIT),
          Survival: ("probe_c_index", "C-index", PROBE_LIMIT_C_INDEX),
          Regression: ("probe_abs_pearson_r", "|Pearson r|", PROBE_LIMIT_R)}


@dataclass(frozen=True)
class Task:
    """A benchmark task: ``write(folder, labels, cohort, rng)`` writes the cases and returns per case
    (relative path, one-number statistics), ``data`` is the config's data section (paths filled in)."""

    description: str
    write: Callable
    data: dict
    model: str
    train: dict
    bags: BagSpec | None = None  # the bag tasks' spec (:mod:`.bag_tasks`)


def _labels_and_splits(sizes: dict[str, int], rng: np.random.Generator) -> tuple[np.ndarray, list[str]]:
    """Balanced labels within each split, in a shuffled order."""
    labels, splits = [], []
    for split, n in sizes.items():
        labels += list(rng.permutation(np.arange(n) % 2))
        splits += [split] * n
    return np.array(labels), splits


def _statistics(values: np.ndarray) -> dict:
    """What the probes read of a written image or volume: its maximum, its mean and its coarse layout."""
    return {"max": float(values.max()), "mean": float(values.mean()), LAYOUT: _layout(values)}


def _write_brain_2d(folder: Path, labels: np.ndarray, acquisition: brain.Acquisition,
                    rng: np.random.Generator) -> list[tuple[str, dict]]:
    from PIL import Image

    template, size, rows = anatomy.mni152_brain(), 64, []
    images = OutputFolder(folder / "images")
    for i, label in enumerate(labels):
        z = int(rng.integers(38, 58))  # axial levels through the lateral ventricles and the centrum semiovale
        case = brain.brain_case(template, bool(label), acquisition, rng, region=(slice(None), slice(None),
                                                                               slice(z, z + 1)), zoom=size / 117)
        canvas = np.zeros((size, size), np.float32)
        top, left = (size - case.shape[0]) // 2, (size - case.shape[1]) // 2
        canvas[top:top + case.shape[0], left:left + case.shape[1]] = case
        pixels = np.clip(canvas / 1.4 * 255, 0, 255).round().astype(np.uint8)  # a fixed export window
        name = f"images/case_{i:04d}.png"
        images.save_image(Path(name).name, Image.fromarray(pixels))
        rows.append((name, _statistics(pixels)))
    return rows


def _write_brain_3d(folder: Path, labels: np.ndarray, acquisition: brain.Acquisition,
                    rng: np.random.Generator) -> list[tuple[str, dict]]:
    import nibabel as nib

    template, rows = anatomy.mni152_brain(), []
    volumes = OutputFolder(folder / "volumes")
    for i, label in enumerate(labels):
        case = brain.brain_case(template, bool(label), acquisition, rng,
                                region=(slice(None), slice(None), slice(28, 68)), zoom=0.5,
                                radii_mm=brain.LESION_RADII_3D, max_shift=2.0)
        values = np.clip(case * 1000, 0, 32767).round().astype(np.int16)
        name = f"volumes/case_{i:04d}.nii.gz"
        with volumes.write(Path(name).name) as tmp:
            nib.save(nib.Nifti1Image(values, np.diag([4.0, 4.0, 4.0, 1.0])), tmp)
        rows.append((name, _statistics(values)))
    return rows


#: The data section of a bag task per task type (paths filled in by :func:`make_task`).
_BAG_DATA = {"kind": "wsi_bags", "feature_dir": "features", "slide_table": "slides.csv",
             "clinical_table": "clinical.csv", "split_column": "split"}
_BAG_TARGET = {Binary: {"label_columns": "label"},
               Survival: {"task_type": Survival.name, "time_column": outcomes.TIME_COLUMN,
                          "event_column": outcomes.EVENT_COLUMN},
               Regression: {"task_type": Regression.name, "label_columns": outcomes.SCORE_COLUMN}}


def _bag_task(description: str, spec: BagSpec, task_type: str = "binary") -> Task:
    """A bag member of the family (:mod:`.bag_tasks`): ``vitwsi_small`` with SeqNorm on its CLAM bags."""
    kind = task_types.of(task_type)
    target = dict(_BAG_TARGET[type(kind)])
    if spec.target == "count" and "label_columns" in target:
        target["label_columns"] = outcomes.COUNT_COLUMN
    batch = 16 if kind.events else 1  # the Cox loss compares the patients of a batch
    return Task(description, partial(write_bags, spec=spec), {**_BAG_DATA, **target}, "vitwsi_small",
                {"batch_size": batch}, spec)


TASKS: dict[str, Task] = {
    "brain_mri_2d": Task("axial T1 slices (MNI152) with a white-matter lesion", _write_brain_2d,
                         {"kind": "image_table", "csv": "cases.csv", "label_columns": "label",
                          "patient_column": "patient", "split_column": "split", "image_size": 64, "in_chans": 1},
                         "vit2d_small", {"batch_size": 16}),
    "brain_mri_3d": Task("T1 slabs (MNI152, 4 mm) with a white-matter lesion", _write_brain_3d,
                         {"kind": "volume_table", "csv": "cases.csv", "label_columns": "label",
                          "patient_column": "patient", "split_column": "split", "target_size": [32, 32, 16]},
                         "vit3d_small", {"batch_size": 8}),
    **{name: _bag_task(*entry) for name, entry in {
        "ihc_bags": ("IHC tile-feature bags with a DAB hot spot", BagSpec("ihc")),
        "ihc_survival": ("IHC tile-feature bags whose DAB hot-spot burden raises the hazard (overall survival)",
                         BagSpec("ihc", target="share"), "survival"),
        "ihc_regression": ("IHC tile-feature bags whose DAB hot-spot burden sets a biomarker level",
                           BagSpec("ihc", target="share"), "regression"),
        "ihc_rare": ("IHC tile-feature bags with a rare DAB hot spot (0.5-3% of 400-2500 tiles)",
                     BagSpec("ihc", sizes=(400, 2500), shares=(0.005, 0.03))),
        "retina_diffuse": ("fundus tile-feature bags with faint spots in 15-30% of 50-400 tiles",
                           BagSpec("retina", sizes=(50, 400), shares=(0.15, 0.3), strength=(0.35, 0.55))),
        "retina_count": ("fundus tile-feature bags: the number of tiles with haemorrhage-like spots",
                         BagSpec("retina", sizes=(100, 600), target="count", strength=(0.7, 0.9)), "regression"),
        "retina_survival": ("fundus tile-feature bags whose number of lesion tiles raises the hazard (overall "
                            "survival)", BagSpec("retina", sizes=(100, 600), target="count", strength=(0.7, 0.9)),
                            "survival"),
        "retina_large": ("fundus tile-feature bags of 2,000-20,000 tiles, spots in 0.5-5% of them",
                         BagSpec("retina", sizes=(2000, 20000), shares=(0.005, 0.05))),
    }.items()},
}


def _layout(image: np.ndarray) -> list[float]:
    """The mean intensity of each of the 2^d blocks an image or volume splits into when every axis is halved."""
    blocks = [image.astype(np.float64)]
    for axis in range(image.ndim):
        blocks = [part for block in blocks for part in np.array_split(block, 2, axis=axis)]
    return [float(block.mean()) for block in blocks]


def layout_probe(statistics: list[dict], labels: np.ndarray, splits: list[str]) -> dict | None:
    """split -> AUROC of a logistic regression on the coarse layout (:func:`_layout`) fitted on the training
    cases: what a model that sees only where the image is bright scores on each split. Far from 0.5 on the test
    split, in either direction, means the split rewards or punishes such a model by chance (a Swin that learned
    no lesion scored 0.37 on a test split where this probe scored 0.39, issue 40). None without layouts."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.preprocessing import StandardScaler

    if LAYOUT not in statistics[0]:
        return None
    x, splits = np.array([s[LAYOUT] for s in statistics]), np.array(splits)
    train = splits == "train"
    if len(set(labels[train])) < 2:
        return None
    scaler = StandardScaler().fit(x[train])
    model = LogisticRegression(max_iter=1000).fit(scaler.transform(x[train]), labels[train])
    scores = model.predict_proba(scaler.transform(x))[:, 1]
    return {split: float(roc_auc_score(labels[splits == split], scores[splits == split]))
            for split in dict.fromkeys(splits) if len(set(labels[splits == split])) == 2}


def probe(statistics: list[dict], labels: np.ndarray) -> dict:
    """name -> AUROC of each one-number statistic used as the score (or its negative, whichever is higher):
    the best a rule on that one number reaches over all cases."""
    from sklearn.metrics import roc_auc_score

    out = {}
    for name in [key for key in statistics[0] if key != LAYOUT]:
        auc = roc_auc_score(labels, [s[name] for s in statistics])
        out[name] = float(max(auc, 1 - auc))
    return out


def make_task(name: str, out: str | Path, seed: int = 0, cohort: str = "a", sizes: dict[str, int] | None = None,
              log: Callable[[str], None] = print, pool: int = 0) -> Path:
    """Write task ``name`` of :data:`TASKS` to ``out/name`` (refused if that folder holds files); -> its folder,
    holding the data, ``config.yaml``, ``probe.json`` and, with ``pool`` > 0, the unlabelled pool."""
    if name not in TASKS:
        raise UserError(f"unknown realistic task {name!r}; available: {', '.join(TASKS)}")
    if cohort not in brain.COHORTS:
        raise UserError(f"unknown cohort {cohort!r}; available: {', '.join(brain.COHORTS)}")
    task, sizes = TASKS[name], sizes or SPLITS
    if pool and task.data["kind"] == "wsi_bags":
        raise UserError(f"{name}: an unlabelled pool is written for the image and volume tasks (medattn pretrain "
                        f"pretrains ViTs on images and volumes)")
    folder = Path(out) / name
    if folder.exists() and any(folder.iterdir()):
        raise UserError(f"{folder} is not empty; choose another --out (nothing was overwritten)")
    rng = np.random.default_rng([seed, ord(cohort), sum(map(ord, name))])
    task_type = task.data.get("task_type", Binary.name)
    kind = task_types.of(task_type)
    if kind.classes:
        labels, splits = _labels_and_splits(sizes, rng)
        columns = {"label": [int(y) for y in labels]}
    elif task.bags.target == "count":  # each patient's number of lesion tiles: the target, or what drives it
        splits = [split for split, n in sizes.items() for _ in range(n)]
        labels = outcomes.counts(len(splits), rng)
        columns = outcomes.COUNT_OUTCOMES[type(kind)](labels, rng)
    else:  # the burden tasks: each patient's share of hot-spot tiles, then the outcome it drives
        splits = [split for split, n in sizes.items() for _ in range(n)]
        labels = outcomes.burdens(len(splits), rng)
        columns = outcomes.OUTCOMES[type(kind)](labels, rng)
    with writing(folder):
        OutputFolder(folder).create()
        rows = task.write(folder, labels, brain.COHORTS[cohort], rng)
        patients = [f"{name}-{cohort}{seed}-{i:04d}" for i in range(len(labels))]
        data = {**task.data}
        if data["kind"] == "wsi_bags":
            _table(folder / "slides.csv", ["PATIENT", "FILENAME"], [[p, r[0]] for p, r in zip(patients, rows)])
            _table(folder / "clinical.csv", ["PATIENT", *columns, "split"],
                   [[p, *values, s] for p, values, s in zip(patients, zip(*columns.values()), splits)])
            for key in ("feature_dir", "slide_table", "clinical_table"):
                data[key] = str((folder / data[key]).resolve())
        else:
            _table(folder / "cases.csv", ["path", "label", "patient", "split"],
                   [[r[0], y, p, s] for r, y, p, s in zip(rows, columns["label"], patients, splits)])
            data["csv"] = str((folder / "cases.csv").resolve())
        key, metric, limit = PROBES[type(kind)]
        scores, known = _probes(task_type, [r[1] for r in rows], labels, columns, splits)
        OutputFolder(folder).save_json("probe.json", {"task": name, "cohort": cohort, "seed": seed, "data": TAG,
                                                       key: scores, **known, "cases": sizes})
        config = {"name": f"{name}_{cohort}", "seed": 0, "data": data,
                  "model": {"name": task.model, "attention": "seqnorm"}, "train": task.train}
        if pool:
            config["pretrain"] = {"pool": str(_write_pool(task, folder, pool, [seed, ord(cohort), sum(map(ord, name))],
                                                          brain.COHORTS[cohort]).resolve())}
        OutputFolder(folder).save_text("config.yaml", f"# {task.description}: {TAG} (medattn realistic)\n"
                                        + yaml.safe_dump(config, sort_keys=False))
    log(f"{name} (cohort {cohort}, {TAG}): {len(labels)} cases in {folder}; probe {metric} {_shown(scores)}"
        + "".join(f"; {_KNOWN[k]} {_shown(v)}" for k, v in known.items() if v not in (None, {})))
    worst = max(((k, v) for k, v in scores.items() if v is not None), key=lambda item: item[1], default=None)
    if worst and worst[1] >= limit and len(labels) >= PROBE_MIN_CASES:
        raise UserError(f"{name}: the {worst[0]} alone reaches {metric} {worst[1]:.3f} (limit {limit}): "
                        f"the task is not calibrated")
    return folder


def _probes(task_type: str, statistics: list[dict], labels: np.ndarray, columns: dict[str, list],
            splits: list[str]) -> tuple[dict, dict]:
    """(statistic -> the one-number probe's score, probe.json's further entries): for a binary task the probe's
    AUROC (:func:`probe`) and the coarse layout probe per split (:func:`layout_probe`); for a burden task
    (``labels``: the shares) the probe's score (:func:`.outcomes.score`), the true burden's (what reading the burden
    exactly reaches) and, for survival, the share of patients censored."""
    kind = task_types.of(task_type)
    if kind.classes:
        return probe(statistics, labels), {"layout_auroc": layout_probe(statistics, labels, splits)}
    key = PROBES[type(kind)][0]
    scores = {name: outcomes.score(task_type, np.array([s[name] for s in statistics]), columns)
              for name in statistics[0]}
    known = {key.replace("probe_", "burden_"): outcomes.score(task_type, labels, columns)}
    if kind.events:
        known["censored_share"] = float(1 - np.mean(columns[outcomes.EVENT_COLUMN]))
    return scores, known


#: The log's name of each of probe.json's further entries.
_KNOWN = {"layout_auroc": "coarse layout (fitted on train)", "burden_c_index": "the true burden's C-index",
          "burden_abs_pearson_r": "the true burden's |Pearson r|", "censored_share": "censored"}


def _shown(value: dict | float | None) -> str:
    """A score, or name -> score, as the log shows it."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {_shown(v)}" for k, v in value.items())
    return "undefined" if value is None else f"{value:.3f}"


def _write_pool(task: Task, folder: Path, cases: int, stream: list[int], acquisition: brain.Acquisition) -> Path:
    """``cases`` unlabelled cases under ``folder/pool`` and their table ``folder/pool.csv``; -> the table."""
    rng = np.random.default_rng([*stream, 1])  # the labelled cases' stream is [*stream]: untouched
    findings = rng.permutation(np.arange(cases) % 2)
    rows = task.write(folder / "pool", findings, acquisition, rng)
    _table(folder / "pool.csv", ["path"], [[f"pool/{r[0]}"] for r in rows])
    return folder / "pool.csv"


def _table(path: Path, header: list[str], rows: list[list]) -> None:
    OutputFolder(path.parent).save_csv(path.name, header, rows)
