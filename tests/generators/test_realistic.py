"""The realistic benchmark writer: each task in the publisher's layout, read back by medattn's own builders,
deterministic, calibrated by its probe, refusing to overwrite; the external cohort differs. The burden tasks
(survival, regression) plant each patient's share of hot-spot tiles in the bag and draw the outcome from it."""

import csv
import hashlib
import json

import numpy as np
import pytest
import yaml

from medattn.cli import main
from medattn.config import load_config
from medattn.data import build_datasets
from medattn.errors import UserError
from medattn.generators.realistic import TASKS, ihc, make_task, outcomes
from medattn.generators.realistic.ihc import FEATURE_DIM
from medattn.metrics_survival import concordance_index

pytest.importorskip("nilearn")
pytest.importorskip("skimage")

SIZES = {"train": 4, "val": 2, "test": 2}
BINARY = [name for name, task in TASKS.items() if "task_type" not in task.data]
BURDEN = {"ihc_survival": "survival", "ihc_regression": "regression"}
COUNT = {"retina_count": "regression", "retina_survival": "survival"}  # lesion tiles (tests/generators/test_family.py)


@pytest.fixture(autouse=True)
def small_family_bags(monkeypatch):
    """Every bag task of the family with bags of 20-40 tiles: the same generators, seconds instead of minutes (the
    large-bag member holds 2,000-20,000)."""
    from dataclasses import replace
    from functools import partial

    from medattn.generators.realistic.bag_tasks import write_bags

    for name, task in TASKS.items():
        if task.bags is not None and task.bags.sizes is not None:
            spec = replace(task.bags, sizes=(20, 40))
            monkeypatch.setitem(TASKS, name, replace(task, write=partial(write_bags, spec=spec), bags=spec))


def _digest(folder) -> str:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in (".csv", ".png", ".gz", ".h5"))
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(folder).as_posix().encode())
        if path.suffix == ".h5":
            import h5py

            with h5py.File(path) as f:  # HDF5 headers hold times; the arrays are the data
                digest.update(np.asarray(f["features"]).tobytes() + np.asarray(f["coords"]).tobytes())
        elif path.suffix == ".gz":
            import nibabel as nib

            digest.update(np.asarray(nib.load(path).dataobj).tobytes())
        else:
            digest.update(path.read_bytes())
    return digest.hexdigest()


def test_every_task_is_binary_or_a_burden_task():
    assert set(TASKS) == {*BINARY, *BURDEN, *COUNT}
    assert all(TASKS[n].data["task_type"] == t for n, t in {**BURDEN, **COUNT}.items())


@pytest.mark.parametrize("name", BINARY)
def test_each_task_is_read_by_medattns_builders_and_is_deterministic(tmp_path, name):
    folder = make_task(name, tmp_path / "one", sizes=SIZES, log=lambda m: None)
    config = load_config(str(folder / "config.yaml"))
    bundle = build_datasets(config["data"], seed=0)
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (4, 2, 2)
    labels = [float(bundle.train[i]["label"][0]) for i in range(4)]
    assert sorted(labels) == [0.0, 0.0, 1.0, 1.0]  # balanced within each split
    if name == "ihc_bags":  # the bags carry the SYNTHETIC mark, so every run on them says so
        assert bundle.task.input_shape == (FEATURE_DIM,) and bundle.task.synthetic
    probe = json.loads((folder / "probe.json").read_text())
    assert probe["data"] == "real anatomy, SYNTHETIC findings" and all(0.5 <= v <= 1 for v in
                                                                       probe["probe_auroc"].values())
    assert "SYNTHETIC" in (folder / "config.yaml").read_text()
    again = make_task(name, tmp_path / "two", sizes=SIZES, log=lambda m: None)
    assert _digest(folder) == _digest(again)
    other = make_task(name, tmp_path / "b", cohort="b", sizes=SIZES, log=lambda m: None)
    assert _digest(other) != _digest(folder)


@pytest.mark.parametrize("name", ["brain_mri_2d", "brain_mri_3d"])
def test_an_unlabelled_pool_adds_new_patients_and_leaves_the_labelled_cases_alone(tmp_path, name):
    """pool.csv lists paths only; the config names it as pretrain.pool, its files are read by the task's own
    reader, and the labelled cases are byte for byte those written without a pool."""
    from medattn.pretrain.data import pretraining_set

    plain = make_task(name, tmp_path / "plain", sizes=SIZES, log=lambda m: None)
    pooled = make_task(name, tmp_path / "pooled", sizes=SIZES, log=lambda m: None, pool=3)
    assert (pooled / "pool.csv").read_text().splitlines()[0] == "path"
    labelled = [p for p in pooled.rglob("*") if p.is_file() and "pool" not in p.relative_to(pooled).as_posix()]
    for path in labelled:
        if path.suffix in (".png", ".gz"):
            assert path.read_bytes() == (plain / path.relative_to(pooled)).read_bytes()
    pool_files = {p.read_bytes() for p in (pooled / "pool").rglob("*") if p.is_file()}
    assert len(pool_files) == 3 and not pool_files & {p.read_bytes() for p in labelled if p.suffix in (".png", ".gz")}
    config = load_config(str(pooled / "config.yaml"))
    assert config["pretrain"]["pool"] == str((pooled / "pool.csv").resolve())
    bundle = build_datasets(config["data"], seed=0)
    dataset, described = pretraining_set(bundle, config["data"], config["pretrain"]["pool"])
    assert described["pool_cases"] == 3 and len(dataset) == 4 + 3
    assert dataset[6]["input"].shape == bundle.train[0]["input"].shape
    with pytest.raises(UserError, match="image and volume tasks"):
        make_task("ihc_bags", tmp_path / "bags", sizes=SIZES, pool=3)


def test_probe_json_holds_the_coarse_layout_probe_of_each_split(tmp_path):
    """A model that sees only where the image is bright: fitted on train, scored per split (the Swin of issue 40
    learned no lesion and followed such cues; its test AUROC below 0.5 was this split's chance correlation)."""
    folder = make_task("brain_mri_2d", tmp_path, sizes={"train": 12, "val": 6, "test": 6}, log=lambda m: None)
    layout = json.loads((folder / "probe.json").read_text())["layout_auroc"]
    assert set(layout) == {"train", "val", "test"} and all(0 <= v <= 1 for v in layout.values())
    from medattn.generators.realistic.tasks import _layout

    image = np.zeros((4, 6))
    image[:2, 3:] = 8.0
    assert _layout(image) == [0.0, 8.0, 0.0, 0.0]  # top-left, top-right, bottom-left, bottom-right


def test_refuses_a_folder_that_holds_files_and_unknown_names(tmp_path):
    (tmp_path / "ihc_bags").mkdir()
    (tmp_path / "ihc_bags" / "mine.txt").write_text("a user's file")
    with pytest.raises(UserError, match="is not empty"):
        make_task("ihc_bags", tmp_path, sizes=SIZES)
    assert (tmp_path / "ihc_bags" / "mine.txt").read_text() == "a user's file"
    with pytest.raises(UserError, match="unknown realistic task"):
        make_task("chest", tmp_path)
    with pytest.raises(UserError, match="unknown cohort"):
        make_task("ihc_bags", tmp_path / "x", cohort="c")


def test_the_command_writes_an_external_cohort_that_eval_takes(tmp_path, capsys):
    assert main(["realistic", "--out", str(tmp_path), "--tasks", "ihc_bags", "--cohort", "b", "--cases", "0", "0",
                 "6"]) == 0
    config = yaml.safe_load((tmp_path / "ihc_bags/config.yaml").read_text())
    bundle = build_datasets(config["data"])
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (0, 0, 6)
    assert "probe AUROC" in capsys.readouterr().out


@pytest.fixture
def small_bags(monkeypatch):
    """Bags of 20-40 tiles instead of 200-1200: the same generator, a twentieth of the time."""
    monkeypatch.setattr(ihc, "BAG_SIZES", (20, 40))


@pytest.mark.parametrize("name", list(BURDEN))
def test_a_burden_task_writes_its_outcome_its_probe_and_a_config_medattn_reads(tmp_path, name, small_bags):
    sizes = {"train": 24, "val": 8, "test": 8}
    folder = make_task(name, tmp_path / "one", sizes=sizes, log=lambda m: None)
    config = load_config(str(folder / "config.yaml"))
    assert config["data"]["task_type"] == BURDEN[name]
    assert (config["model"]["name"], config["model"]["attention"]) == ("vitwsi_small", "seqnorm")
    bundle = build_datasets(config["data"], seed=0)
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (24, 8, 8)
    assert bundle.task.task_type == BURDEN[name] and bundle.task.input_shape == (FEATURE_DIM,)
    with open(folder / "clinical.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    probe = json.loads((folder / "probe.json").read_text())
    if name == "ihc_survival":
        assert config["data"]["time_column"] == "os_months" and config["train"]["batch_size"] >= 2
        assert list(rows[0]) == ["PATIENT", "os_months", "os_event", "split"]
        events = np.array([int(r["os_event"]) for r in rows])
        assert set(events) == {0, 1} and all(float(r["os_months"]) > 0 for r in rows)
        assert 0.15 <= 1 - events.mean() <= 0.6 and probe["censored_share"] == pytest.approx(1 - events.mean())
        scores = probe["probe_c_index"]
        assert 0.5 <= probe["burden_c_index"] <= 1
    else:
        assert config["data"]["label_columns"] == "dab_score"
        assert list(rows[0]) == ["PATIENT", "dab_score", "split"] and all(float(r["dab_score"]) >= 0 for r in rows)
        scores = probe["probe_abs_pearson_r"]
        assert probe["burden_abs_pearson_r"] > 0.8
    assert list(scores) == ["bag size"] and 0 <= scores["bag size"] <= 1 and "probe_auroc" not in probe
    assert [r["split"] for r in rows] == ["train"] * 24 + ["val"] * 8 + ["test"] * 8
    again = make_task(name, tmp_path / "two", sizes=sizes, log=lambda m: None)
    assert _digest(folder) == _digest(again)
    assert _digest(make_task(name, tmp_path / "b", cohort="b", sizes=sizes, log=lambda m: None)) != _digest(folder)


def test_the_burden_drives_the_outcomes():
    """Drawn from the generator's outcome model, a few hundred patients: the true burden alone orders survival
    with a C-index near 0.77 and explains most of the biomarker; about a third are censored, a quarter have no
    hot spot."""
    rng = np.random.default_rng(7)
    burden = outcomes.burdens(400, rng)
    assert 0.18 < np.mean(burden == 0) < 0.32 and burden.max() <= ihc.TUMOUR_SHARE[1]
    columns = outcomes.survival(burden, rng)
    event = np.array(columns["os_event"], bool)
    assert 0.25 < 1 - event.mean() < 0.45 and concordance_index(burden, columns["os_months"], event) > 0.72
    assert outcomes.score("survival", burden, columns) > 0.72
    score = np.array(outcomes.biomarker(burden, rng)["dab_score"])
    assert np.corrcoef(burden, score)[0, 1] > 0.85 and outcomes.score("regression", burden, {"dab_score": score}) > 0.85


def test_the_share_is_the_share_of_hot_spot_tiles(monkeypatch):
    """With the same stream a bag with share s differs from a negative one in about s of its tiles (same tiles,
    same places); without a share a positive bag draws its share from TUMOUR_SHARE (2-10%) as before."""
    monkeypatch.setattr(ihc, "BAG_SIZES", (300, 301))
    from medattn.generators.realistic.anatomy import ihc_image

    image = ihc_image()
    negative, coords = ihc.ihc_bag(image, False, np.random.default_rng(3))
    planted, same_coords = ihc.ihc_bag(image, True, np.random.default_rng(3), share=0.1)
    assert (coords == same_coords).all()
    changed = (planted != negative).any(axis=1)
    assert 0.05 < changed.mean() < 0.15
    drawn, _ = ihc.ihc_bag(image, True, np.random.default_rng(3))
    assert 0 < (drawn != negative).any(axis=1).mean() < 0.15


def test_the_command_writes_a_survival_task_that_trains(tmp_path, capsys, small_bags):
    """medattn realistic --tasks ihc_survival, then medattn train on its config for two epochs (batches of 16)."""
    assert main(["realistic", "--out", str(tmp_path), "--tasks", "ihc_survival", "--cases", "16", "6", "6"]) == 0
    assert "probe C-index" in capsys.readouterr().out
    config = str(tmp_path / "ihc_survival" / "config.yaml")
    run = tmp_path / "run"
    assert main(["train", config, "--out", str(run), "train.epochs=2", "train.threads=1", "eval.bootstrap=20",
                 "eval.heatmaps=0"]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["metric"] == "c_index" and results["test"]["n"] == 6


def test_a_burden_task_whose_probe_reaches_its_limit_is_refused(tmp_path, monkeypatch, small_bags):
    from medattn.generators.realistic import tasks
    from medattn.vocabulary.task_types import Regression, Survival

    assert tasks.PROBES[Survival][2] == 0.7 and tasks.PROBES[Regression][2] == 0.35
    monkeypatch.setattr(tasks, "PROBE_MIN_CASES", 8)
    monkeypatch.setitem(tasks.PROBES, Regression, ("probe_abs_pearson_r", "|Pearson r|", 0.0))
    with pytest.raises(UserError, match=r"bag size alone reaches \|Pearson r\| .* \(limit 0.0\)"):
        make_task("ihc_regression", tmp_path, sizes=SIZES, log=lambda m: None)
