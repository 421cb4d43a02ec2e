"""2D image tables: PNG/JPEG/TIFF/DICOM reading, channels, sizes, task types, splits and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("PIL")
pytest.importorskip("pydicom")

from medattn.data import build_datasets  # noqa: E402
from medattn.data.readers.images import read_image  # noqa: E402
from medattn.errors import UserError  # noqa: E402
from writers import write_csv, write_dicom, write_pillow  # noqa: E402

RAMP = np.tile(np.arange(16, dtype=np.uint8) * 16, (12, 1))  # (12, 16), dark left, bright right


def _distinct(i):
    """RAMP with its first pixel set to i: one image per row (the same file in two rows is a duplicate)."""
    image = RAMP.copy()
    image[0, 0] = i
    return image


def _all(dataset):
    return [dataset[i] for i in range(len(dataset))]


def _table(tmp_path, n=12, labels=None, extra_rows=(), patients=None, split=None):
    """n gray PNGs (label i % 2) plus ``extra_rows`` (path, label) in images.csv."""
    rows = []
    for i in range(n):
        write_pillow(tmp_path / f"img{i}.png", _distinct(i))
        row = [f"img{i}.png", (labels or [i % 2 for i in range(n)])[i]]
        row += [] if patients is None else [patients[i]]
        row += [] if split is None else [split[i]]
        rows.append(row)
    rows += [list(r) for r in extra_rows]
    header = ["path", "label"] + ([] if patients is None else ["patient"]) + ([] if split is None else ["split"])
    return write_csv(tmp_path / "images.csv", header, rows)


def _cfg(csv, **kw):
    return {"kind": "image_table", "csv": str(csv), "label_columns": "label", "image_size": 8, "in_chans": 1,
            "augment": False, "mean": 0.0, "std": 1.0, **kw}


def test_formats_read_to_unit_range(tmp_path):
    gray = read_image(write_pillow(tmp_path / "a.png", RAMP))
    assert gray.shape == (1, 12, 16) and gray.min() == 0 and gray.max() == pytest.approx(240 / 255)
    rgb = np.stack([RAMP, RAMP // 2, 255 - RAMP], axis=-1)
    jpeg = read_image(write_pillow(tmp_path / "b.jpg", rgb))
    assert jpeg.shape == (3, 12, 16) and (jpeg[0, :, -1] > jpeg[0, :, 0]).all()
    tiff = read_image(write_pillow(tmp_path / "c.tif", RAMP.astype(np.uint16) * 100))
    assert tiff.shape == (1, 12, 16) and tiff.min() == 0 and tiff.max() == 1  # 16 bit: min-max scaled
    torch.testing.assert_close(tiff, gray / gray.max())


def test_dicom_rescale_and_monochrome1(tmp_path):
    stored = RAMP.astype(np.uint16)
    mono2 = read_image(write_dicom(tmp_path / "m2.dcm", stored, "MONOCHROME2", slope=3.0, intercept=-7.0))
    torch.testing.assert_close(mono2, torch.from_numpy(stored / stored.max()).float()[None])
    mono1 = read_image(write_dicom(tmp_path / "m1.dcm", stored, "MONOCHROME1"))
    torch.testing.assert_close(mono1, 1 - mono2)  # low stored values are bright in MONOCHROME1
    flipped = read_image(write_dicom(tmp_path / "neg.dcm", stored, "MONOCHROME2", slope=-1.0))
    torch.testing.assert_close(flipped, 1 - mono2)  # the slope is applied before scaling
    no_suffix = write_dicom(tmp_path / "IM0001", stored)
    torch.testing.assert_close(read_image(no_suffix), mono2)


def test_channels_size_and_normalisation(tmp_path):
    csv = _table(tmp_path, n=4)
    rgb = build_datasets(_cfg(csv, in_chans=3, image_size=[6, 10], mean=[0.5, 0.5, 0.5], std=0.25), seed=0)
    x = rgb.train[0]["input"]
    assert x.shape == (3, 6, 10) and rgb.task.input_shape == (3, 6, 10) and not rgb.task.synthetic
    assert torch.equal(x[0], x[1]) and x.min() < -1.5 and x.max() > 1.5
    write_pillow(tmp_path / "color.png", np.stack([RAMP, np.zeros_like(RAMP), np.zeros_like(RAMP)], -1))
    write_csv(tmp_path / "c.csv", ["path", "label"], [["color.png", 1]] * 3 + [["img0.png", 0]] * 3)
    gray = build_datasets(_cfg(tmp_path / "c.csv", image_size=[12, 16], val_fraction=0.0, test_fraction=0.0))
    inputs = {s["label"].item(): s["input"] for s in _all(gray.train)}
    torch.testing.assert_close(inputs[1], 0.299 * inputs[0], atol=2e-3, rtol=0)  # luma of pure red


@pytest.mark.parametrize("columns, values, task, outputs", [
    (["label"], [[0], [1]], "binary", 1),
    (["label"], [[0], [1], [2]], "multiclass", 3),
    (["a", "b"], [[0, 1], [1, 1], [0, 0]], "multilabel", 2),
])
def test_task_types(tmp_path, columns, values, task, outputs):
    rows = [[write_pillow(tmp_path / f"x{i}.png", _distinct(i)).name, *values[i % len(values)]] for i in range(12)]
    csv = write_csv(tmp_path / "t.csv", ["path", *columns], rows)
    bundle = build_datasets(_cfg(csv, label_columns=columns))
    assert (bundle.task.task_type, bundle.task.num_outputs) == (task, outputs)
    label = bundle.train[0]["label"]
    assert label.dtype == (torch.int64 if task == "multiclass" else torch.float32)
    assert label.shape == (() if task == "multiclass" else (outputs,))


def test_class_names(tmp_path):
    rows = [[write_pillow(tmp_path / f"x{i}.png", _distinct(i)).name, ["LUAD", "LUSC"][i % 2]] for i in range(10)]
    csv = write_csv(tmp_path / "t.csv", ["path", "dx"], rows)
    bundle = build_datasets(_cfg(csv, label_columns="dx", classes=["LUAD", "LUSC"]))
    assert bundle.task.task_type == "binary" and bundle.task.class_names == ["LUSC"]
    three = build_datasets(_cfg(csv, label_columns="dx", classes=["LUAD", "LUSC", "other"]))
    assert three.task.task_type == "multiclass" and three.task.num_outputs == 3


def test_patient_level_split_and_split_column(tmp_path):
    patients = [f"p{i // 3}" for i in range(30)]  # three images per patient
    csv = _table(tmp_path, n=30, labels=[(i // 3) % 2 for i in range(30)], patients=patients)
    bundle = build_datasets(_cfg(csv, patient_column="patient", val_fraction=0.2, test_fraction=0.2), seed=4)
    groups = [{r.patient for r in ds.records} for ds in (bundle.train, bundle.val, bundle.test)]
    assert sum(map(len, groups)) == 10 and not (groups[0] & groups[1] or groups[0] & groups[2] or groups[1] & groups[2])
    assert [len(g) for g in groups] == [6, 2, 2]
    again = build_datasets(_cfg(csv, patient_column="patient", val_fraction=0.2, test_fraction=0.2), seed=4)
    assert [r.id for r in again.test.records] == [r.id for r in bundle.test.records]
    split = ["train"] * 6 + ["val"] * 3 + ["test"] * 3
    by_column = build_datasets(_cfg(_table(tmp_path, n=12, split=split), split_column="split"))
    assert (len(by_column.train), len(by_column.val), len(by_column.test)) == (6, 3, 3)


def test_augmentation_only_in_training(tmp_path):
    csv = _table(tmp_path, n=6, split=["train", "val", "test"] * 2)
    bundle = build_datasets(_cfg(csv, split_column="split", augment=True))
    plain = build_datasets(_cfg(csv, split_column="split", augment=False))
    torch.manual_seed(1)
    changed = [not torch.equal(bundle.train[i]["input"], plain.train[i]["input"]) for i in range(2)]
    assert any(changed)
    assert torch.equal(bundle.val[0]["input"], plain.val[0]["input"])


def _truncated(tmp_path):
    data = (write_pillow(tmp_path / "cut.png", np.random.default_rng(0).integers(0, 255, (64, 64), np.uint8))
            .read_bytes())
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
    return "cut.png"


BAD_ROWS = {
    "missing file": (lambda tmp: [["nothere.png", 1]], "file not found"),
    "unreadable image": (lambda tmp: [[(tmp / "junk.png").write_bytes(b"not an image") and "junk.png", 1]],
                         "junk.png"),
    "labels that don't parse": (lambda tmp: [["img0.png", "yes"]], "'yes'"),
    "label out of range": (lambda tmp: [["img0.png", 1.5]], "not a non-negative integer"),
    "path outside the root": (lambda tmp: [["../outside.png", 1]], "outside the data root"),
    "wrong dimensionality": (lambda tmp: [[write_dicom(tmp / "multi.dcm", np.zeros((2, 4, 4))).name, 0]],
                             "2 frames"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_bad_rows_name_file_and_row(tmp_path, case):
    make, expected = BAD_ROWS[case]
    data = tmp_path / "data"
    data.mkdir()
    write_pillow(tmp_path / "outside.png", RAMP)
    csv = _table(data, n=12, extra_rows=make(data))
    cfg = _cfg(csv, test_fraction=0.25, val_fraction=0.25)
    if case == "wrong dimensionality":  # the header is fine: found when loading, or up front with skip_bad
        bundle = build_datasets(cfg)
        splits = (bundle.train, bundle.val, bundle.test)
        dataset = next(d for d in splits if any(r.id == "multi.dcm" for r in d.records))
        with pytest.raises(UserError, match="images.csv row 14") as err:
            _all(dataset)
    else:
        with pytest.raises(UserError, match="images.csv row 14") as err:
            build_datasets(cfg)
    message = str(err.value)
    assert expected in message and "\n" not in message
    skipping = build_datasets(cfg, skip_bad=True)
    assert skipping.skipped == 1 and len(skipping.train) + len(skipping.val) + len(skipping.test) == 12


def test_truncated_image_fails_at_build_time_or_is_skipped(tmp_path):
    csv = _table(tmp_path, n=12, extra_rows=[[_truncated(tmp_path), 0]])
    with pytest.raises(UserError, match=r"images.csv row 14: .*cut.png: image file is truncated"):
        build_datasets(_cfg(csv, split_column=None, val_fraction=0.0, test_fraction=0.0))
    assert build_datasets(_cfg(csv, val_fraction=0.0, test_fraction=0.0), skip_bad=True).skipped == 1


def test_bad_tables(tmp_path):
    csv = _table(tmp_path, n=4)
    with pytest.raises(UserError, match="missing column.*grade"):
        build_datasets(_cfg(csv, label_columns=["grade"]))
    with pytest.raises(UserError, match="file not found"):
        build_datasets(_cfg(tmp_path / "none.csv"))
    with pytest.raises(UserError, match="needs the key 'label_columns'"):
        build_datasets({"kind": "image_table", "csv": str(csv)})
    write_csv(tmp_path / "s.csv", ["path", "label", "split"], [["img0.png", 0, "tarin"]])
    with pytest.raises(UserError, match="s.csv row 2: split 'tarin'"):
        build_datasets(_cfg(tmp_path / "s.csv", split_column="split"))


def _labels_table(tmp_path, labels):
    rows = [[write_pillow(tmp_path / f"y{i}.png", _distinct(i % 200)).name if i < 200 else "", v]
            for i, v in enumerate(labels)]
    return write_csv(tmp_path / "y.csv", ["path", "label"], rows)


@pytest.mark.parametrize("declared", [{}, {"task_type": "binary"}, {"num_classes": 2}])
def test_a_stray_label_in_a_binary_column_names_the_row(tmp_path, declared):
    labels = [i % 2 for i in range(40)]
    labels[16] = 2  # CSV row 18
    csv = _labels_table(tmp_path, labels)
    with pytest.raises(UserError) as err:
        build_datasets(_cfg(csv, **declared))
    message = str(err.value)
    assert message.startswith("y.csv row 18: ") and "label 2" in message and "\n" not in message
    skipped = build_datasets(_cfg(csv, **declared), skip_bad=True)  # the other rows make a binary task
    assert skipped.skipped == 1 and (skipped.task.task_type, skipped.task.num_outputs) == ("binary", 1)


def test_inferred_classes_are_reported_and_gaps_refused(tmp_path, caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="medattn.data"):
        bundle = build_datasets(_cfg(_labels_table(tmp_path, [i % 3 for i in range(30)])))
    assert bundle.task.num_outputs == 3 and "read as a 3-class task (rows per class 0: 10, 1: 10, 2: 10)" in caplog.text
    with pytest.raises(UserError, match=r"read as 6 classes .*but some never occur; declare num_classes"):
        build_datasets(_cfg(_labels_table(tmp_path, [[0, 1, 5][i % 3] for i in range(30)])))
    rare = build_datasets(_cfg(_labels_table(tmp_path, [i % 2 for i in range(30)] + [2]), num_classes=3))
    assert rare.task.num_outputs == 3  # declared: a class of one row is kept
    with pytest.raises(UserError, match="num_classes must be an int >= 2, got 'three'"):
        build_datasets(_cfg(_labels_table(tmp_path, [0, 1] * 5), num_classes="three"))
