"""Bad input to the data layer: each case gives one line (a UserError) naming the table, row, file or key,
at build time (before any training), and loses nothing: the input files are unchanged and, where the
problem is one sample, ``skip_bad`` keeps every other sample.

A case is ``make(tmp) -> (data config, the regex the message must match, samples kept by skip_bad or
None when the problem is not one sample)``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import stat

import numpy as np
import pytest

pytest.importorskip("PIL")
pytest.importorskip("h5py")
pytest.importorskip("nibabel")
pytest.importorskip("pydicom")

from medattn.data import build_datasets  # noqa: E402
from medattn.errors import UserError  # noqa: E402
from writers import write_csv, write_dicom, write_h5, write_nifti, write_pillow  # noqa: E402

N = 12  # good rows of every table


@contextlib.contextmanager
def no_hang(seconds: float = 5.0):
    """Fail with TimeoutError instead of blocking (a reader opening a named pipe waits for a writer)."""
    def expire(*_):
        raise TimeoutError(f"blocked for more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _cut(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path.name


def _png(tmp, name, i):
    return write_pillow(tmp / name, np.random.default_rng(i).integers(0, 255, (32, 32), np.uint8)).name


def images(tmp, extra=(), header=("path", "label"), split=False, **kw):
    """N distinct PNGs labelled i % 2 (split column: train, val, test in turn) plus ``extra`` rows."""
    rows = [[_png(tmp, f"img{i}.png", i), i % 2] + ([["train", "val", "test"][i % 3]] if split else [])
            for i in range(N)]
    csv = write_csv(tmp / "t.csv", [*header, *(["split"] if split else [])], rows + [list(r) for r in extra])
    cfg = {"kind": "image_table", "csv": str(csv), "label_columns": "label", "image_size": 8, "in_chans": 1,
           "augment": False, **kw}
    return {**cfg, "split_column": "split"} if split else cfg


def volumes(tmp, extra=()):
    for i in range(N):
        affine = np.eye(4)
        affine[:3, 3] = i
        write_nifti(tmp / f"v{i}.nii.gz", np.arange(4 * 4 * 3, dtype=np.float32).reshape(4, 4, 3), affine=affine)
    csv = write_csv(tmp / "t.csv", ["path", "label"], [[f"v{i}.nii.gz", i % 2] for i in range(N)] + list(extra))
    return {"kind": "volume_table", "csv": str(csv), "label_columns": "label", "target_size": [4, 4, 3],
            "augment": False}


def bags(tmp, slides=(), clinical=()):
    (tmp / "f").mkdir(exist_ok=True)
    for i in range(N):
        write_h5(tmp / "f" / f"s{i}.h5", np.full((3, 4), i, np.float32))
    slide_csv = write_csv(tmp / "slides.csv", ["PATIENT", "FILENAME"], [[f"P{i}", f"s{i}"] for i in range(N)]
                          + list(slides))
    clini = write_csv(tmp / "clini.csv", ["PATIENT", "y"], [[f"P{i}", i % 2] for i in range(N)] + list(clinical))
    return {"kind": "wsi_bags", "feature_dir": str(tmp / "f"), "slide_table": str(slide_csv),
            "clinical_table": str(clini), "label_columns": "y"}


def _partial_h5(path):
    import h5py

    with h5py.File(path, "w") as f:
        f.create_dataset("features", shape=(3_000_000, 4), dtype="f4", chunks=(1024, 4))[:1024] = 1.0
    return path.stem


def _medmnist(tmp, stray=False, drop=None):
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (("train", 20), ("val", 8), ("test", 8)):
        arrays[f"{split}_images"] = rng.integers(0, 255, (n, 8, 8), np.uint8)
        arrays[f"{split}_labels"] = (np.arange(n) % 2)[:, None]
    if stray:
        arrays["test_labels"][3] = 2
    arrays.pop(drop, None)
    np.savez(tmp / "m.npz", **arrays)
    return {"kind": "medmnist", "path": str(tmp / "m.npz")}


def _no_features(path):
    """An HDF5 file whose dataset has another name; -> its stem."""
    import h5py

    path.parent.mkdir(exist_ok=True)
    with h5py.File(path, "w") as f:
        f["patches"] = np.ones((3, 4), np.float32)
    return path.stem


def _write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def _noise():
    return np.random.default_rng(0).random((16, 16, 16)).astype(np.float32)


def _mkfifo(path):
    os.mkfifo(path)
    return path.name


CASES = {
    "table missing": lambda t: ({**images(t), "csv": str(t / "none.csv")}, r"table .*none.csv: file not found", None),
    "table is a folder": lambda t: ({**images(t), "csv": str(t)}, r"table .*: a directory, not a regular file", None),
    "table is a named pipe": lambda t: ({**images(t), "csv": str(t / _mkfifo(t / "p.csv") and t / "p.csv")},
                                        r"table .*p.csv: a named pipe, not a regular file", None),
    "empty table": lambda t: ({**images(t), "csv": _write(t / "e.csv", b"")},
                              r"table .*e.csv: no header or no rows", None),
    "header only": lambda t: ({**images(t), "csv": _write(t / "h.csv", b"path,label\n")},
                              r"table .*h.csv: no header or no rows", None),
    "ragged row": lambda t: (images(t, [["img1.png", 1, "x"]]), r"t.csv row 14: 3 fields, the header has 2", None),
    "not UTF-8": lambda t: ({**images(t), "csv": _write(t / "l.csv", b"path,label\n\xe9t\xe9.png,1\n")},
                           r"table .*l.csv: not a readable CSV", None),
    "label column missing": lambda t: ({**images(t), "label_columns": "grade"}, r"t.csv: missing column\(s\) grade",
                                       None),
    "unknown key": lambda t: ({**images(t), "lable_columns": "y"}, r"does not take lable_columns", None),
    "NaN label": lambda t: (images(t, [[_png(t, "x.png", 99), "nan"]]), r"t.csv row 14: label 'nan'", N),
    "empty label": lambda t: (images(t, [[_png(t, "x.png", 99), ""]]), r"t.csv row 14: label '' .*not a number", N),
    "stray 2 in a 0/1 column": lambda t: (images(t, [[_png(t, "x.png", 99), 2]]), r"t.csv row 14: label 2 ", N),
    "2 with task_type binary": lambda t: (images(t, [[_png(t, "x.png", 99), 2]], task_type="binary"),
                                          r"t.csv row 14: label 2 is not 0/1", N),
    "num_classes not a number": lambda t: (images(t, num_classes="2"), r"num_classes must be an int", None),
    "same file, two labels": lambda t: (images(t, [["img1.png", 0]]),
                                        r"t.csv row 14 and t.csv row 3: .*img1.png is the same file", N - 1),
    "copy under a second name, two labels": lambda t: (
        images(t, [[_png(t, "copy.png", 1), 0]]),  # the bytes of img1.png
        r"t.csv row 14 and t.csv row 3: .*copy.png is the same file in both rows, with different labels", N - 1),
    "same file in train and test": lambda t: (images(t, [["img0.png", 0, "test"]], split=True),
                                              r"t.csv row 14 and t.csv row 2: .*different splits", N - 1),
    "truncated PNG in the test split": lambda t: (
        images(t, [[_cut(t / _png(t, "cut.png", 50)), 1, "test"]], split=True),
        r"t.csv row 14: .*cut.png: image file is truncated", N),
    "truncated JPEG": lambda t: (images(t, [[_cut(write_pillow(t / "cut.jpg", np.full((64, 64), 9, np.uint8))), 1]]),
                                 r"t.csv row 14: .*cut.jpg: .*truncated", N),
    "truncated DICOM": lambda t: (images(t, [[_cut(write_dicom(t / "cut.dcm", np.ones((16, 16), np.uint16))), 1]]),
                                  r"t.csv row 14: .*cut.dcm: the DICOM file is truncated", N),
    "junk bytes named .png": lambda t: (images(t, [[(t / "junk.png").write_bytes(b"junk") and "junk.png", 1]]),
                                        r"t.csv row 14: .*junk.png: ", N),
    "image path is a folder": lambda t: (images(t, [[(t / "d.png").mkdir() or "d.png", 1]]),
                                         r"t.csv row 14: .*d.png: a directory, not a regular file", N),
    "image path is a named pipe": lambda t: (images(t, [[_mkfifo(t / "fifo.png"), 1]]),
                                             r"t.csv row 14: .*fifo.png: a named pipe", N),
    "path outside the data root": lambda t: (images(t, [["../x.png", 1]]), r"t.csv row 14: .*outside the data root",
                                             N),
    "truncated .nii.gz": lambda t: (volumes(t, [[_cut(write_nifti(t / "c.nii.gz", _noise())), 1]]),
                                    r"t.csv row 14: .*c.nii.gz: the NIfTI file is truncated", N),
    "truncated .nii": lambda t: (volumes(t, [[_cut(write_nifti(t / "c.nii", _noise())), 1]]),
                                 r"t.csv row 14: .*c.nii: the NIfTI file is truncated", N),
    "2D NIfTI": lambda t: (volumes(t, [[write_nifti(t / "flat.nii", np.ones((8, 8))).name, 1]]),
                           r"t.csv row 14: .*flat.nii: expected a 3D volume", N),
    "HDF5 without features": lambda t: (bags(t, [["X", _no_features(t / "f" / "x.h5")]], [["X", 1]]),
                                        r"clini.csv row 14: .*x.h5: no features dataset", N),
    "HDF5 of another feature width": lambda t: (
        bags(t, [["X", write_h5(t / "f" / "x.h5", np.ones((3, 5), np.float32)).stem]], [["X", 1]]),
        r"different feature dimensions: \S*s0.h5 has 4, \S*x.h5 has 5", None),  # the two files, not rows (issue 49)
    "HDF5 declares 3,000,000 rows, stores 1,024": lambda t: (
        bags(t, [["X", _partial_h5(t / "f" / "x.h5")]], [["X", 1]]),
        r"clini.csv row 14: .*x.h5: dataset 'features' declares 3000000 rows but the file stores data for 1024", N),
    "HDF5 of junk bytes": lambda t: (bags(t, [["X", (t / "f" / "x.h5").write_bytes(b"\x89HDF junk") and "x"]],
                                          [["X", 1]]), r"clini.csv row 14: .*x.h5: ", N),
    "one patient twice, two labels": lambda t: (
        bags(t, clinical=[["P1", 0]]), r"clini.csv row 14 and clini.csv row 3: .*s1.h5 is the same file", N - 1),
    "slide listed twice": lambda t: (bags(t, slides=[["P2", "s2.h5"]]),
                                     r"clini.csv row 4: .*s2.h5 is the same file as another input", N - 1),
    "MedMNIST without test_labels": lambda t: (
        _medmnist(t, drop="test_labels"), r"m.npz: missing array\(s\) test_labels", None),
    "MedMNIST stray 2": lambda t: (_medmnist(t, stray=True), r"m.npz test_labels\[3\]: label 2 ", 35),
}
def snapshot(folder):
    """Every entry under ``folder``: kind and, for files, a hash of the bytes."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            mode = os.lstat(path).st_mode
            out[path] = (hashlib.sha1(open(path, "rb").read()).hexdigest() if stat.S_ISREG(mode)
                         else stat.S_IFMT(mode))
    return out


def run_case(tmp, make):
    """-> (the message of the UserError build_datasets raises, or None, the snapshot before and after)."""
    data = tmp / "data"
    (data / "f").mkdir(parents=True)  # the feature folder of the bag cases
    cfg, expected, kept = make(data)
    before = snapshot(tmp)
    with no_hang():
        try:
            build_datasets(cfg)
            message = None
        except UserError as error:
            message = str(error)
    return cfg, expected, kept, message, before, snapshot(tmp)


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_naming_it_and_loses_nothing(tmp_path, case):
    cfg, expected, kept, message, before, after = run_case(tmp_path, CASES[case])
    assert message is not None, "no error"
    assert re.search(expected, message) and "\n" not in message, message
    assert after == before  # nothing written, moved or removed
    if kept is not None:
        with no_hang():
            bundle = build_datasets(cfg, skip_bad=True)
        assert bundle.skipped >= 1 and len(bundle.train) + len(bundle.val) + len(bundle.test) == kept


def test_predict_refuses_a_named_pipe_instead_of_blocking(tmp_path):
    from medattn.data.base import TaskInfo
    from medattn.data.preprocessing import Preprocessing, inference_dataset

    fifo = tmp_path / "scan.png"
    os.mkfifo(fifo)
    for prep in (Preprocessing.of("image_table", TaskInfo("binary", "image2d", 1, (1, 8, 8)), mean=[0.5], std=[0.5]),
                 Preprocessing.of("wsi_bags", TaskInfo("binary", "bag", 1, (4,)))):
        with no_hang(), pytest.raises(UserError, match=r"scan.png: .*a named pipe, not a regular file"):
            inference_dataset(prep, [(fifo,)])[0]


def test_train_stops_on_a_truncated_test_file_before_the_first_epoch(tmp_path, capsys):
    import yaml

    from medattn.cli import main

    data = tmp_path / "data"
    data.mkdir()
    cfg = images(data, [[_cut(data / _png(data, "cut.png", 50)), 1, "test"]], split=True)
    config = {"name": "t", "data": cfg, "model": {"name": "vit2d_tiny", "attention": "seqnorm"},
              "train": {"epochs": 1, "batch_size": 4}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    assert main(["train", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert re.search(r"t.csv row 14: .*cut.png: image file is truncated", err)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_cheap_checks_do_not_refuse_good_files(tmp_path):
    import gzip

    from medattn.data.readers.images import check_image_header, read_image
    from medattn.data.readers.volumes import check_volume_header, read_volume

    jpeg = write_pillow(tmp_path / "tail.jpg", np.full((16, 16), 100, np.uint8))
    jpeg.write_bytes(jpeg.read_bytes() + b"\0" * 10_000)  # data after the end marker: decoded once to decide
    check_image_header(jpeg)
    assert read_image(jpeg).shape == (1, 16, 16)
    volume = np.random.default_rng(0).random((6, 5, 4)).astype(np.float32)
    raw = gzip.decompress(write_nifti(tmp_path / "one.nii.gz", volume).read_bytes())
    two = tmp_path / "two.nii.gz"  # two gzip members: the trailer holds the last member's length only
    two.write_bytes(gzip.compress(raw[:1000]) + gzip.compress(raw[1000:]))
    check_volume_header(two)
    assert np.allclose(read_volume(two)[0].numpy(), volume)
    check_image_header(write_dicom(tmp_path / "ok.dcm", np.ones((16, 16), np.uint16)))
    check_image_header(write_pillow(tmp_path / "ok.tif", np.ones((16, 16), np.uint16)))
