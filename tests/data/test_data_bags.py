"""Whole-slide feature bags: CLAM and STAMP layouts, several slides per patient, big bags, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("h5py")

from medattn.data import build_datasets, collate  # noqa: E402
from medattn.errors import UserError  # noqa: E402
from writers import write_csv, write_h5  # noqa: E402

F_DIM = 6


def _slides(tmp_path, n_patients=10, extra_slides=(), extra_clinical=()):
    """Patient i has slide s{i}a (CLAM, i + 3 patches of i); even patients also s{i}b (STAMP, 2 patches of -1 - i)."""
    feats = tmp_path / "features"
    feats.mkdir(exist_ok=True)
    slide_rows, clinical_rows = [], []
    for i in range(n_patients):
        write_h5(feats / f"s{i}a.h5", np.full((i + 3, F_DIM), i, np.float32), np.arange(2 * (i + 3)).reshape(-1, 2))
        slide_rows.append([f"P{i}", f"s{i}a.h5"])
        if i % 2 == 0:
            write_h5(feats / f"s{i}b.h5", np.full((2, F_DIM), -1 - i, np.float32), layout="stamp")
            slide_rows.append([f"P{i}", f"s{i}b"])  # STAMP tables name slides without the suffix
        clinical_rows.append([f"P{i}", ["LUAD", "LUSC"][i % 2]])
    write_csv(tmp_path / "slides.csv", ["PATIENT", "FILENAME"], slide_rows + [list(r) for r in extra_slides])
    write_csv(tmp_path / "clini.csv", ["PATIENT", "TYPE"], clinical_rows + [list(r) for r in extra_clinical])
    return {"kind": "wsi_bags", "feature_dir": str(feats), "slide_table": str(tmp_path / "slides.csv"),
            "clinical_table": str(tmp_path / "clini.csv"), "label_columns": "TYPE", "classes": ["LUAD", "LUSC"],
            "val_fraction": 0.0, "test_fraction": 0.0}


def _by_id(dataset):
    return {s["id"]: s for s in (dataset[i] for i in range(len(dataset)))}


def test_layouts_and_slides_per_patient(tmp_path):
    bundle = build_datasets(_slides(tmp_path))
    assert bundle.task.input_kind == "bag" and bundle.task.input_shape == (F_DIM,) and bundle.task.task_type == "binary"
    samples = _by_id(bundle.train)
    assert len(samples) == 10
    p2, p3 = samples["P2"], samples["P3"]
    assert p2["input"].shape == (5 + 2, F_DIM) and p3["input"].shape == (6, F_DIM)
    assert torch.equal(p2["input"][:5], torch.full((5, F_DIM), 2.0)) and p2["input"][5:].eq(-3).all()
    assert torch.equal(p2["coords"][:5], torch.arange(10.0).reshape(5, 2)) and p2["coords"][5:].eq(0).all()
    assert p2["label"].tolist() == [0.0] and p3["label"].tolist() == [1.0] and p2["patient"] == "P2"
    batch = collate([p2, p3])
    assert batch["input"].shape == (2, 7, F_DIM) and batch["mask"].sum(1).tolist() == [7, 6]


def test_large_bag_and_subsampling(tmp_path):
    cfg = _slides(tmp_path, n_patients=4)
    write_h5(tmp_path / "features" / "s0a.h5", np.random.default_rng(0).normal(size=(12000, F_DIM)).astype(np.float32))
    big = _by_id(build_datasets(cfg).train)["P0"]
    assert big["input"].shape == (12002, F_DIM) and big["coords"].shape == (12002, 2)
    sub = build_datasets({**cfg, "max_instances": 100})
    torch.manual_seed(0)
    first = _by_id(sub.train)["P0"]["input"]
    assert first.shape == (100, F_DIM)
    torch.manual_seed(0)
    assert torch.equal(first, _by_id(sub.train)["P0"]["input"])


def test_split_by_patient(tmp_path):
    cfg = {**_slides(tmp_path, n_patients=20), "val_fraction": 0.2, "test_fraction": 0.2}
    bundle = build_datasets(cfg, seed=1)
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (12, 4, 4)
    labels = [r.label.item() for r in bundle.test.records]
    assert sum(labels) == 2  # stratified


BAD = {
    "NaN features": ("nan", "NaN or Inf"),
    "Inf features": ("inf", "NaN or Inf"),
    "empty bag": ("empty", "empty bag"),
    "missing file": ("missing", "file not found"),
    "wrong dimensionality": ("flat", "(N, F)"),
    "no features dataset": ("nokey", "no features dataset"),
    "label that does not parse": ("label", "not one of the classes"),
    "no slide": ("noslide", "has no slide"),
    "outside the root": ("outside", "outside the data root"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_bags(tmp_path, case):
    kind, expected = BAD[case]
    import h5py

    feats = tmp_path / "features"
    feats.mkdir()
    slide, clinical = [["BAD", "bad.h5"]], [["BAD", "LUSC"]]
    if kind in ("nan", "inf"):
        write_h5(feats / "bad.h5", np.array([[1.0] * F_DIM, [np.nan if kind == "nan" else np.inf] * F_DIM]))
    elif kind == "empty":
        write_h5(feats / "bad.h5", np.zeros((0, F_DIM), np.float32))
    elif kind == "flat":
        write_h5(feats / "bad.h5", np.zeros(F_DIM, np.float32))
    elif kind == "nokey":
        with h5py.File(feats / "bad.h5", "w") as f:
            f["patches"] = np.zeros((3, F_DIM))
    elif kind == "label":
        write_h5(feats / "bad.h5", np.zeros((3, F_DIM), np.float32))
        clinical = [["BAD", "LUNG"]]
    elif kind == "noslide":
        slide = []
    elif kind == "outside":
        slide = [["BAD", "../elsewhere.h5"]]
    cfg = _slides(tmp_path, n_patients=6, extra_slides=slide, extra_clinical=clinical)
    if kind in ("nan", "inf"):  # content: found when the bag is loaded, or up front with skip_bad
        bundle = build_datasets(cfg)
        with pytest.raises(UserError) as err:
            _by_id(bundle.train)
    else:
        with pytest.raises(UserError) as err:
            build_datasets(cfg)
    message = str(err.value)
    assert "clini.csv row 8" in message and expected in message and "\n" not in message
    if kind not in ("label", "noslide", "outside"):
        assert "bad.h5" in message
    skipping = build_datasets(cfg, skip_bad=True)
    assert skipping.skipped == 1 and len(skipping.train) == 6


def test_bad_tables(tmp_path):
    cfg = _slides(tmp_path, n_patients=4)
    with pytest.raises(UserError, match="clinical table .*missing column.*GRADE"):
        build_datasets({**cfg, "label_columns": "GRADE"})
    with pytest.raises(UserError, match="slide table .*missing column.*SLIDE"):
        build_datasets({**cfg, "filename_column": "SLIDE"})
    write_h5(tmp_path / "features" / "s1a.h5", np.zeros((3, F_DIM + 1), np.float32))
    with pytest.raises(UserError, match="different feature dimensions"):
        build_datasets(cfg)


def _declared(path, layout, written=1024, declared=3_000_000):
    """A bag declaring ``declared`` rows of which ``written`` were stored (the writer stopped early)."""
    import h5py

    with h5py.File(path, "w") as f:
        if layout == "chunked":
            d = f.create_dataset("features", shape=(declared, F_DIM), dtype="f4", chunks=(1024, F_DIM))
        elif layout == "resized":
            d = f.create_dataset("features", shape=(written, F_DIM), maxshape=(None, F_DIM), dtype="f4", chunks=True)
        else:  # contiguous, never written
            d = f.create_dataset("features", shape=(declared, F_DIM), dtype="f4")
        if layout != "contiguous":
            d[:written] = 1.0
        if layout == "resized":
            d.resize((declared, F_DIM))


@pytest.mark.parametrize("layout, stored", [("chunked", 1024), ("resized", 1024), ("contiguous", 0)])
def test_partly_stored_bag_is_refused(tmp_path, layout, stored):
    cfg = _slides(tmp_path, n_patients=4)
    _declared(tmp_path / "features" / "s1a.h5", layout)
    with pytest.raises(UserError) as err:
        build_datasets(cfg)
    message = str(err.value)
    assert "clini.csv row 3" in message and "s1a.h5" in message and "\n" not in message
    assert f"declares 3000000 rows but the file stores data for {stored}" in message
    from medattn.data.readers.bags import read_slide

    with pytest.raises(ValueError, match="declares 3000000 rows"):  # the load path (and predict) refuses too
        read_slide(tmp_path / "features" / "s1a.h5")
    assert build_datasets(cfg, skip_bad=True).skipped == 1


def test_fully_stored_bags_of_every_layout_are_read(tmp_path):
    import h5py

    from medattn.data.bag_rows import stored_rows
    from medattn.data.readers.bags import read_slide

    data = np.arange(5000 * F_DIM, dtype=np.float32).reshape(5000, F_DIM)
    with h5py.File(tmp_path / "gz.h5", "w") as f:  # compressed chunks: stored bytes < declared bytes, all present
        f.create_dataset("features", data=data, compression="gzip", chunks=(700, F_DIM))
        f.create_dataset("coords", data=np.zeros((5000, 2)), chunks=(1000, 2))
    with h5py.File(tmp_path / "compact.h5", "w") as f:
        space = h5py.h5s.create_simple((3, F_DIM))
        plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        plist.set_layout(h5py.h5d.COMPACT)
        h5py.h5d.create(f.id, b"features", h5py.h5t.NATIVE_FLOAT, space, plist).write(
            h5py.h5s.ALL, h5py.h5s.ALL, np.ones((3, F_DIM), np.float32))
    assert torch.equal(read_slide(tmp_path / "gz.h5")[0], torch.from_numpy(data))
    assert read_slide(tmp_path / "compact.h5")[0].eq(1).all()
    with h5py.File(tmp_path / "gz.h5") as f:
        assert stored_rows(f["features"]) is None
