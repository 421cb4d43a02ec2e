"""A generated silent-wrong suite (issue 49): every task type x every input kind x every command that serves them,
end to end through the user's file formats, with the numbers checked against an independent computation.

The fault corpus (tests/commands/test_fault_corpus.py) checks that a bad input is refused; this suite checks that a
good input gives the right number. For each task type of :data:`TASKS` and input kind of
``medattn.data.base.INPUT_KINDS`` a tiny cohort is written as a user writes it (an image table: PNG files and a CSV;
a volume table: NIfTI files and a CSV; bags: CLAM HDF5 files, a slide table and a clinical table, some patients with
two slides), a model is trained on it for one epoch (once per module, on first use), and:

* ``train``: the test metric of ``results.json`` is the reference metric of ``predictions_test.csv`` with the labels
  this file wrote (not the ones medattn read);
* ``eval``: its metric (``eval.json``) is the reference metric of ``predict``'s CSV for the same cases, and its
  per-case outputs are ``train``'s;
* ``predict``: its outputs are ``eval``'s per case (bags: with ``--patients``, one row per patient, every listed
  slide used); on a table relabelled from the model's own outputs, where the answer is obvious, ``eval`` scores
  exactly what the references score and what the sign medattn documents gives (survival: higher risk = earlier
  event, C-index 1; binary and multi-label: AUROC 1; multi-class: 1 on cases each holding its class's top
  probability; regression: R^2 = 1 with predictions in the table's units);
* ``explain``: the prediction in ``summary.csv`` is ``predict``'s for the same file.

References: scikit-learn (``roc_auc_score`` per class, averaged; ``r2_score``), SciPy (``pearsonr``), lifelines
(``concordance_index(time, -risk, event)``: lifelines ranks predicted survival times) and scikit-survival
(``concordance_index_censored(event, time, risk)``). Segmentation (geometry against SimpleITK) is
tests/deploy/test_whole_volume_segmentation.py and tests/data/test_dicom_series.py. The case counts are printed
(``-s``) for the closing note's table.
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml

from medattn.cli import COMMANDS, main
from medattn.data.base import INPUT_KINDS, TASK_TYPES
from writers import write_csv, write_h5, write_nifti, write_pillow

#: The supervised task types a table of cases serves (segmentation has its own suite, see the module docstring).
TASKS = ("binary", "multiclass", "multilabel", "regression", "survival")
ELSEWHERE = {"segmentation": "tests/deploy/test_whole_volume_segmentation.py", "unlabelled": "tests/diffusion/",
             "competing_risks": "tests/train/test_competing_risks.py",
             "ordinal": "tests/train/test_ordinal.py"}  # QWK against scikit-learn: tests/core/test_metrics_ordinal.py
#: The commands checked here; the others read no labelled cohort per case (demo, models, wsi, realistic, inpaint,
#: pretrain, plan), or repeat train over folds, seeds or arms (cv, compare: tests/experiments/), or write a model
#: (export: its outputs equal the checkpoint's, tests/deploy/test_deploy_export.py).
CHECKED = ("train", "eval", "predict", "explain")
N = 24  # cases per cohort
FEATURES = 8
#: Target columns, and class names where the table names its classes (the order of ``classes`` is the class index,
#: deliberately not alphabetical).
COLUMNS = {"binary": ["finding"], "multiclass": ["grade"], "multilabel": ["effusion", "nodule"],
           "regression": ["psa", "score"], "survival": ["os_months", "os_event"]}
NAMES = {"binary": ["benign", "malignant"], "multiclass": ["none", "mild", "severe"]}
#: Regression targets' means and standard deviations: far from 0 and 1, so a standardised output shows.
TARGETS = {"psa": (50.0, 5.0), "score": (-30.0, 2.0)}
MODELS = {"image2d": "vit2d_tiny", "volume3d": "vit3d_tiny", "bag": "abmil_small"}
METRIC = {"binary": "auroc", "multiclass": "auroc", "multilabel": "auroc", "regression": "r2", "survival": "c_index"}
CASES: Counter = Counter()


def _named(task: str, kind: str) -> bool:
    """Images keep integer labels; volumes and bags name their classes."""
    return task in NAMES and kind != "image2d"


def _outputs(task: str, kind: str) -> list[str]:
    """The columns of one case's outputs in predict's, eval's and explain's CSVs."""
    if task == "survival":
        return ["risk"]
    if task == "regression":
        return [f"pred_{c}" for c in COLUMNS[task]]
    if task == "binary":
        return [f"prob_{NAMES[task][1] if _named(task, kind) else COLUMNS[task][0]}"]
    if task == "multiclass":
        return [f"prob_{n}" for n in (NAMES[task] if _named(task, kind) else map(str, range(3)))]
    return [f"prob_{c}" for c in COLUMNS[task]]


def _truth(task: str, i: int, rng) -> np.ndarray:
    """Case ``i``'s label as medattn should read it (class index, 0/1 per output, targets, or [time, event])."""
    if task == "binary":
        return np.array([i % 2])
    if task == "multiclass":
        return np.array([i % 3])
    if task == "multilabel":
        return np.array([i % 2, (i // 2) % 2])
    if task == "regression":
        return np.array([m + s * rng.normal() for m, s in TARGETS.values()])
    return np.array([2 + 0.9 * i + rng.uniform(0, 0.5), float(i % 3 != 0)])  # distinct times, 2/3 events


def _cells(task: str, kind: str, label: np.ndarray) -> list[str]:
    if task == "survival":
        return [f"{label[0]:.4f}", str(int(label[1]))]
    if task == "regression":
        return [f"{v:.6f}" for v in label]
    if _named(task, kind):
        return [NAMES[task][int(label[0])]]
    return [str(int(v)) for v in label]


def _signal(task: str, label: np.ndarray) -> float:
    """How strongly a case's input carries its label (the model need not learn it; its outputs spread with it)."""
    if task == "regression":
        return (label[0] - TARGETS["psa"][0]) / TARGETS["psa"][1]
    return float(label[0] / 10 if task == "survival" else label[0])


def _input(folder: Path, task: str, kind: str, i: int, label: np.ndarray, rng) -> list[str]:
    """Case ``i``'s file(s), written in the kind's format -> their names (bags: every fourth patient has two)."""
    s = _signal(task, label)
    if kind == "image2d":
        image = rng.integers(0, 120, (32, 32), dtype=np.uint8)
        image[4:12, 4:12] += np.uint8(min(130, 40 * abs(s)))
        write_pillow(folder / f"i{i}.png", image)
        return [f"i{i}.png"]
    if kind == "volume3d":
        volume = rng.normal(size=(16, 16, 8)).astype(np.float32)
        volume[2:6, 2:6, 2:4] += s
        write_nifti(folder / f"v{i}.nii.gz", volume, spacing=(1.0, 1.0, 2.0))
        return [f"v{i}.nii.gz"]
    names = [f"s{i}a.h5", *([f"s{i}b.h5"] if i % 4 == 0 else [])]
    for name in names:
        tiles = rng.normal(0, 0.5, (4 + i % 4, FEATURES)).astype(np.float32)
        tiles[:2, 0] += s
        write_h5(folder / "feats" / name, tiles, rng.integers(0, 5000, (len(tiles), 2)).astype(np.float32))
    return names


def _cohort(root: Path, task: str, kind: str) -> dict:
    """The cohort's files, its data section and what each case is: ``{"data", "truth": {id: label}, "files":
    {id: [paths]}}`` (the id eval writes: the table's path, or the patient of a bag)."""
    rng = np.random.default_rng(7)
    (root / "feats").mkdir()
    truth, files, rows = {}, {}, []
    for i in range(N):
        label = _truth(task, i, rng)
        if task in ("regression", "survival"):  # the numbers as written in the table
            label = np.array([float(cell) for cell in _cells(task, kind, label)])
        names = _input(root, task, kind, i, label, rng)
        case = f"P{i}" if kind == "bag" else names[0]
        truth[case] = label
        files[case] = [root / ("feats" if kind == "bag" else "") / name for name in names]
        rows.append([case, *_cells(task, kind, label)])
    data = {"task_type": task, "val_fraction": 0.25, "test_fraction": 0.34}
    if task == "survival":
        data.update(time_column=COLUMNS[task][0], event_column=COLUMNS[task][1])
    else:
        data["label_columns"] = COLUMNS[task]
    if _named(task, kind):
        data["classes"] = NAMES[task]
    if kind == "bag":
        slides = [[case, path.name] for case, paths in files.items() for path in paths]
        data.update(kind="wsi_bags", feature_dir=str(root / "feats"),
                    slide_table=str(write_csv(root / "slides.csv", ["PATIENT", "FILENAME"], slides)),
                    clinical_table=str(write_csv(root / "clinical.csv", ["PATIENT", *COLUMNS[task]], rows)))
    else:
        table = write_csv(root / "cases.csv", ["path", *COLUMNS[task]], rows)
        data.update(kind="image_table", csv=str(table), image_size=32, in_chans=1) if kind == "image2d" else \
            data.update(kind="volume_table", csv=str(table), target_size=[16, 16, 8])
        data["augment"] = False
    return {"data": data, "truth": truth, "files": files, "root": root}


def _config(root: Path, kind: str, data: dict, name: str = "config.yaml") -> Path:
    config = {"name": "sw", "seed": 0, "data": data, "model": {"name": MODELS[kind], "attention": None},
              "train": {"epochs": 1, "batch_size": 8, "lr": 1e-3, "threads": 1, "warmup_epochs": 0},
              "eval": {"bootstrap": 0, "heatmaps": 0}}
    if kind != "bag":
        config["model"]["attention"] = "softmax"
    path = root / name
    path.write_text(yaml.safe_dump(config))
    return path


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


class Case:
    """One (task type, input kind): its cohort, trained run, eval and predict outputs, made on first use."""

    def __init__(self, root: Path, task: str, kind: str) -> None:
        self.task, self.kind = task, kind
        cohort = _cohort(root, task, kind)
        self.root, self.data, self.truth, self.files = root, cohort["data"], cohort["truth"], cohort["files"]
        self.config = _config(root, kind, self.data)
        self.run = root / "run"
        assert main(["train", str(self.config), "--out", str(self.run), "--no-progress"]) == 0
        self.results = json.loads((self.run / "results.json").read_text())
        assert main(["eval", str(self.run), str(self.config), "--out", str(root / "eval"), "--no-progress"]) == 0
        self.evaluated = json.loads((root / "eval" / "eval.json").read_text())
        self.eval_rows = _rows(root / "eval" / "predictions_test.csv")
        self.predicted = self.predict(list(self.files))  # every case, test or not

    def predict(self, cases: list[str], out: str = "p.csv") -> dict[str, np.ndarray]:
        """predict's outputs of ``cases`` -> {case: outputs}; bags with --patients (the slide table)."""
        paths = [str(p) for case in cases for p in self.files[case]]
        extra = ["--patients", self.data["slide_table"]] if self.kind == "bag" else []
        assert main(["predict", str(self.run), *paths, *extra, "--out", str(self.root / out)]) == 0
        rows = _rows(self.root / out)
        assert len(rows) == len(cases), "one row per case (bags: per patient)"
        if self.kind == "bag":
            listed = {case: len(self.files[case]) for case in cases}
            assert {r["patient"]: (int(r["slides_used"]), int(r["slides_listed"])) for r in rows} == \
                {case: (n, n) for case, n in listed.items()}, "a patient predicted from part of its slides"
            return {r["patient"]: self.values(r) for r in rows}
        return {Path(r["file"]).name: self.values(r) for r in rows}

    def values(self, row: dict) -> np.ndarray:
        return np.array([float(row[c]) for c in _outputs(self.task, self.kind)])


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    made: dict[tuple[str, str], Case] = {}

    def get(task: str, kind: str) -> Case:
        if (task, kind) not in made:
            made[task, kind] = Case(tmp_path_factory.mktemp(f"{task}_{kind}"), task, kind)
        return made[task, kind]

    return get


# --- the references ---------------------------------------------------------------------------------------------------

def reference(task: str, labels: np.ndarray, outputs: np.ndarray) -> dict[str, float]:
    """The metrics medattn reports, computed by the reference libraries from labels and per-case outputs."""
    from sklearn.metrics import r2_score, roc_auc_score

    if task == "binary":
        return {"auroc": roc_auc_score(labels[:, 0], outputs[:, 0])}
    if task == "multiclass":  # one-vs-rest, macro-averaged
        return {"auroc": np.mean([roc_auc_score(labels[:, 0] == k, outputs[:, k]) for k in range(outputs.shape[1])])}
    if task == "multilabel":
        return {"auroc": np.mean([roc_auc_score(labels[:, k], outputs[:, k]) for k in range(outputs.shape[1])])}
    if task == "regression":  # on the targets as medattn holds them, float32 (medattn.data.base)
        from scipy.stats import pearsonr

        labels = labels.astype(np.float32).astype(np.float64)
        return {"r2": r2_score(labels, outputs), "pearson_r": np.mean([pearsonr(labels[:, k], outputs[:, k])[0]
                                                                        for k in range(outputs.shape[1])])}
    from lifelines.utils import concordance_index
    from sksurv.metrics import concordance_index_censored

    time, event, risk = labels[:, 0], labels[:, 1].astype(bool), outputs[:, 0]
    lifelines_c = concordance_index(time, -risk, event)  # lifelines ranks survival times: minus the risk
    assert concordance_index_censored(event, time, risk)[0] == pytest.approx(lifelines_c, abs=1e-12)
    return {"c_index": lifelines_c}


def reported(task: str, result: dict) -> dict[str, float]:
    """What a results.json test section or an eval.json says of the same metrics."""
    if task == "regression":
        return {"r2": result["r2"], "pearson_r": result["metrics"]["pearson_r"][0]}
    return {METRIC[task]: result[METRIC[task]]}


def _check(task: str, result: dict, labels: np.ndarray, outputs: np.ndarray) -> None:
    expected = reference(task, labels, outputs)
    got = reported(task, result)
    assert got == pytest.approx(expected, rel=1e-8, abs=1e-6), (got, expected)  # rel: an R^2 of -2000


#: The cases of the default run: every task type once, every input kind at least once (about 50 s on one core);
#: the rest of the cross-product is ``-m slow``.
FAST = {("binary", "image2d"), ("multiclass", "volume3d"), ("multilabel", "bag"), ("regression", "image2d"),
        ("survival", "bag")}


def _speed(task: str, kind: str) -> tuple:
    return () if (task, kind) in FAST else (pytest.mark.slow,)


GRID = [pytest.param(t, k, marks=_speed(t, k)) for t in TASKS for k in INPUT_KINDS]


def test_the_suite_covers_every_task_type_input_kind_and_command():
    assert set(TASKS) | set(ELSEWHERE) == set(TASK_TYPES)
    assert set(CHECKED) <= set(COMMANDS) and set(MODELS) == set(INPUT_KINDS)


@pytest.mark.parametrize("kind", [pytest.param(k, marks=_speed("regression", k)) for k in INPUT_KINDS])
def test_eval_on_a_table_of_other_units_keeps_the_checkpoints_units(kind, cases):
    """The cohort's targets moved by +100: eval scores the table's test split with predictions in the checkpoint's
    units (predict's), not rescaled by the table's own training split (before: refused, and so was every external
    regression cohort: "target_mean is ()")."""
    case = cases("regression", kind)
    shifted = {c: label + 100 for c, label in case.truth.items()}
    config = _relabelled(case, list(shifted), np.array(list(shifted.values())), "shifted", external=False)
    out = case.root / "shifted" / "eval"
    assert main(["eval", str(case.run), str(config), "--out", str(out), "--no-progress"]) == 0
    rows = _rows(out / "predictions_test.csv")
    ids = [r["id"] for r in rows]
    outputs = np.array([case.predicted[i] for i in ids])
    np.testing.assert_allclose([case.values(r) for r in rows], outputs, rtol=1e-6)
    labels = np.array([shifted[i] for i in ids])
    _check("regression", json.loads((out / "eval.json").read_text()), labels, outputs)
    assert json.loads((out / "eval.json").read_text())["r2"] < -50  # 100 units off on a spread of a few: no fit
    CASES["eval (other units)", "regression", kind] += 1


def _written_labels(task: str, kind: str, row: dict) -> list[float]:
    """The label a row of predictions_<split>.csv gives its case."""
    if task == "survival":
        return [float(row["time"]), float(row["event"])]
    if task == "regression":
        return [float(row[f"true_{c}"]) for c in COLUMNS[task]]
    if task == "multiclass":
        return [float(row["label"])]
    return [float(row["label_" + column.removeprefix("prob_")]) for column in _outputs(task, kind)]


@pytest.mark.parametrize("task, kind", GRID)
def test_train_reports_the_reference_metric_of_its_test_predictions(task, kind, cases):
    case = cases(task, kind)
    rows = _rows(case.run / "predictions_test.csv")
    labels = np.array([case.truth[r["id"]] for r in rows])
    np.testing.assert_allclose([_written_labels(task, kind, r) for r in rows], labels, rtol=1e-5,
                               err_msg="the per-case CSV's labels are not the table's")
    outputs = np.array([case.values(r) for r in rows])
    expected = reference(task, labels, outputs)  # the CSV holds float32's round trip (9 significant digits)
    assert reported(task, case.results["test"]) == pytest.approx(expected, abs=1e-6)
    CASES["train", task, kind] += 1


@pytest.mark.parametrize("task, kind", GRID)
def test_eval_reports_the_reference_metric_of_predicts_csv(task, kind, cases):
    case = cases(task, kind)
    ids = [r["id"] for r in case.eval_rows]
    assert ids == [r["id"] for r in _rows(case.run / "predictions_test.csv")], "eval's test split is train's"
    labels = np.array([case.truth[i] for i in ids])
    _check(task, case.evaluated, labels, np.array([case.predicted[i] for i in ids]))
    CASES["eval", task, kind] += 1


@pytest.mark.parametrize("task, kind", GRID)
def test_predict_gives_evals_outputs_case_by_case(task, kind, cases):
    case = cases(task, kind)
    rounding = {"rtol": 6e-6} if task == "regression" else {"atol": 2e-6}  # 6 significant digits, or 6 decimals
    for source in (case.eval_rows, _rows(case.run / "predictions_test.csv")):
        for row in source:
            np.testing.assert_allclose(case.predicted[row["id"]], case.values(row), **rounding, err_msg=row["id"])
    CASES["predict", task, kind] += 1


def _obvious(case: Case) -> tuple[list[str], np.ndarray]:
    """Cases and labels that the model's own outputs (predict's CSV) rank perfectly: the higher risk has the earlier
    event (the lowest risks censored last), the higher probability the positive label, the target the prediction."""
    cases = list(case.predicted)
    out = np.array([case.predicted[c] for c in cases])
    if case.task == "survival":
        keep = [i for i in range(len(cases)) if np.sum(out[:, 0] == out[i, 0]) == 1]  # no tied risk
        order = np.argsort(-out[keep, 0])  # highest risk first
        labels = np.zeros((len(keep), 2))
        labels[order, 0] = 1.0 + np.arange(len(keep))
        labels[order, 1] = (np.arange(len(keep)) < 2 * len(keep) // 3).astype(float)
        return [cases[i] for i in keep], labels
    if case.task == "regression":
        return cases, out
    if case.task == "multiclass":  # one case per class, each holding its class's highest probability of the three
        from itertools import permutations

        for trio in permutations(range(len(cases)), out.shape[1]):
            sub = out[list(trio)]
            if all(sub[k, k] > np.delete(sub[:, k], k).max() for k in range(len(trio))):
                return [cases[i] for i in trio], np.arange(len(trio))[:, None]
        pytest.fail("no perfectly ranked multi-class table among these cases")
    medians = np.median(out, axis=0)
    keep = [i for i in range(len(cases)) if not np.any(out[i] == medians)]
    return [cases[i] for i in keep], (out[keep] > medians).astype(int)


def _relabelled(case: Case, cases: list[str], labels: np.ndarray, name: str = "obvious",
                external: bool = True) -> Path:
    """A table of ``cases`` with ``labels``, in the cohort's own format: an external cohort (every row a test case),
    or split as the training table was."""
    folder = case.root / name
    folder.mkdir()
    rows = [[c, *_cells(case.task, case.kind, label)] for c, label in zip(cases, labels)]
    data = {**case.data, **({"val_fraction": 0.0, "test_fraction": 1.0} if external else {})}
    if case.task == "multiclass" and "classes" not in data:
        data["num_classes"] = 3  # one case per class, declared
    if case.kind == "bag":
        data["clinical_table"] = str(write_csv(folder / "clinical.csv", ["PATIENT", *COLUMNS[case.task]], rows))
    else:
        data["csv"] = str(write_csv(folder / "cases.csv", ["path", *COLUMNS[case.task]], rows))
        data["data_root"] = str(case.root)
    return _config(folder, case.kind, data)


@pytest.mark.parametrize("task, kind", GRID)
def test_on_an_obvious_table_eval_scores_what_the_documented_sign_gives(task, kind, cases):
    case = cases(task, kind)
    chosen, labels = _obvious(case)
    config = _relabelled(case, chosen, labels)
    assert main(["eval", str(case.run), str(config), "--out", str(case.root / "obvious" / "eval"),
                 "--no-progress"]) == 0
    evaluated = json.loads((case.root / "obvious" / "eval" / "eval.json").read_text())
    rows = _rows(case.root / "obvious" / "eval" / "predictions_test.csv")
    assert sorted(r["id"] for r in rows) == sorted(chosen)
    outputs = np.array([case.predicted[c] for c in chosen])
    _check(task, evaluated, labels, outputs)
    got = reported(task, evaluated)
    if task == "survival":  # higher risk = earlier event: perfect concordance; the other sign scores 0
        from lifelines.utils import concordance_index

        assert got["c_index"] == 1.0
        assert concordance_index(labels[:, 0], outputs[:, 0], labels[:, 1]) == 0.0
    elif task == "regression":  # the targets are the predictions: in the table's units, not standardised
        assert got["r2"] == pytest.approx(1.0, abs=1e-6) and got["pearson_r"] == pytest.approx(1.0, abs=1e-6)
        for k, (mean, std) in enumerate(TARGETS.values()):
            assert abs(outputs[:, k].mean() - mean) < 2 * std, "predictions not in the table's units"
    else:
        assert got["auroc"] == 1.0
    CASES["eval (obvious table)", task, kind] += 1


@pytest.mark.parametrize("task, kind", GRID)
def test_explain_gives_predicts_outputs(task, kind, cases):
    case = cases(task, kind)
    single = [c for c in case.files if len(case.files[c]) == 1][:2]
    out = case.root / "explained"
    assert main(["explain", str(case.run), *[str(case.files[c][0]) for c in single], "--out", str(out)]) == 0
    rows = _rows(out / "summary.csv")
    assert len(rows) == 2
    for c, row in zip(single, rows):
        assert Path(row["file"]).name == case.files[c][0].name
        np.testing.assert_allclose(case.values(row), case.predicted[c], atol=2e-6, err_msg=c)
    CASES["explain", task, kind] += 1


@pytest.mark.parametrize("task", ["regression", "survival"])
def test_a_per_case_csv_keeps_the_values_its_metric_was_computed_from(task, tmp_path):
    """Follow-up times in minutes (three years: 1.5 million) or a target of seven digits: the CSV's values must be
    the float32 values scored, else two patients 3 minutes apart are written tied and the C-index recomputed from the
    CSV drops their pair; a target spread over units of a million is written as a constant."""
    from medattn.outputs import OutputFolder
    from medattn.train.predictions import Predictions
    from medattn.train.report import write_risks, write_values

    values = np.float32(1_234_560) + np.arange(8, dtype=np.float32) * 3  # exact in float32
    outputs = np.linspace(1, 0, 8)[:, None].astype(np.float32)
    ids = [f"c{i}" for i in range(8)]
    if task == "survival":
        pred = Predictions(ids, ids, outputs, np.stack([values, np.ones(8, np.float32)], 1), 0.0)
        write_risks(pred, OutputFolder.within(tmp_path), "p.csv")
        written = [float(r["time"]) for r in _rows(tmp_path / "p.csv")]
    else:
        pred = Predictions(ids, ids, values[:, None] + outputs, values[:, None], 0.0)
        write_values(pred, ["cost"], OutputFolder.within(tmp_path), "p.csv")
        written = [float(r["true_cost"]) for r in _rows(tmp_path / "p.csv")]
    assert written == values.tolist()


def test_print_the_case_counts():
    """The closing note's table: command x task type x input kind -> cases (run with -s to see it)."""
    print(f"\n{'command':22s} {'task type':11s} {'input':9s} cases")
    for (command, task, kind), count in sorted(CASES.items()):
        print(f"{command:22s} {task:11s} {kind:9s} {count}")
