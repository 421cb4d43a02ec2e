"""The realistic benchmark writer: each task in the publisher's layout, read back by medattn's own builders,
deterministic, calibrated by its probe, refusing to overwrite; the external cohort differs."""

import hashlib
import json

import numpy as np
import pytest
import yaml

from medattn.cli import main
from medattn.config import load_config
from medattn.data import build_datasets
from medattn.errors import UserError
from medattn.realistic import TASKS, make_task
from medattn.realistic.ihc import FEATURE_DIM

pytest.importorskip("nilearn")
pytest.importorskip("skimage")

SIZES = {"train": 4, "val": 2, "test": 2}


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


@pytest.mark.parametrize("name", list(TASKS))
def test_each_task_is_read_by_medattns_builders_and_is_deterministic(tmp_path, name):
    folder = make_task(name, tmp_path / "one", sizes=SIZES, log=lambda m: None)
    config = load_config(str(folder / "config.yaml"))
    bundle = build_datasets(config["data"], seed=0)
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (4, 2, 2)
    labels = [float(bundle.train[i]["label"][0]) for i in range(4)]
    assert sorted(labels) == [0.0, 0.0, 1.0, 1.0]  # balanced within each split
    if name == "ihc_bags":
        assert bundle.task.input_shape == (FEATURE_DIM,)
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
    from medattn.realistic.tasks import _layout

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
