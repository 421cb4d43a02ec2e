"""One file in several rows: conflicts refused naming both rows, repeats dropped, patients merged, no file in
two splits; same-content detection by size, head/tail and full hash."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

pytest.importorskip("PIL")

from medattn.data import build_datasets  # noqa: E402
from medattn.errors import UserError  # noqa: E402
from writers import write_csv, write_nifti, write_pillow  # noqa: E402


def _images(tmp_path, n=12):
    for i in range(n):
        write_pillow(tmp_path / f"img{i}.png", np.full((8, 8), 10 * i, np.uint8))
    return [[f"img{i}.png", f"p{i}", i % 2] for i in range(n)]


def _cfg(csv, **kw):
    return {"kind": "image_table", "csv": str(csv), "label_columns": "label", "patient_column": "patient",
            "image_size": 8, "in_chans": 1, "augment": False, **kw}


def _ids(bundle):
    return {name: [r.id for r in getattr(bundle, name).records] for name in ("train", "val", "test")}


@pytest.mark.parametrize("how", ["same path", "same content", "symbolic link"])
def test_one_file_with_two_labels_is_refused(tmp_path, how):
    rows = _images(tmp_path)
    if how == "same content":
        (tmp_path / "copy.png").write_bytes((tmp_path / "img3.png").read_bytes())
    elif how == "symbolic link":
        os.symlink(tmp_path / "img3.png", tmp_path / "copy.png")
    rows.append(["img3.png" if how == "same path" else "copy.png", "other", 0])  # img3 is labelled 1 in row 5
    csv = write_csv(tmp_path / "t.csv", ["path", "patient", "label"], rows)
    with pytest.raises(UserError) as err:
        build_datasets(_cfg(csv))
    message = str(err.value)
    assert message.startswith("t.csv row 14 and t.csv row 5: ") and "different labels" in message
    assert "\n" not in message
    skipped = build_datasets(_cfg(csv), skip_bad=True)  # both rows dropped: the file's label is unknown
    assert skipped.skipped == 1 and "img3.png" not in sum(_ids(skipped).values(), [])


def test_repeated_file_is_kept_once_and_its_patients_split_together(tmp_path, caplog):
    rows = _images(tmp_path, n=20)
    rows.append(["img3.png", "p14", 1])  # the same image under a second patient id, same label
    write_pillow(tmp_path / "p14b.png", np.full((8, 8), 7, np.uint8))
    rows.append(["p14b.png", "p14", 0])  # p14's other image must follow img3 into its split
    csv = write_csv(tmp_path / "t.csv", ["path", "patient", "label"], rows)
    with caplog.at_level(logging.WARNING, logger="medattn.data"):
        for seed in range(6):
            bundle = build_datasets(_cfg(csv, val_fraction=0.25, test_fraction=0.25), seed=seed)
            ids = _ids(bundle)
            assert sum(map(len, ids.values())) == 21  # the repeat dropped, nothing else
            assert sum(i.count("img3.png") for i in ids.values()) == 1
            together = {name for name, i in ids.items() if {"img3.png", "img14.png", "p14b.png"} & set(i)}
            assert len(together) == 1  # p3 and p14 are one patient: one split
    assert "t.csv row 22 repeats t.csv row 5" in caplog.text
    assert "patient 'p14' shares a file with patient 'p3'" in caplog.text


def test_one_file_in_two_splits_of_the_split_column_is_refused(tmp_path):
    rows = [[*r, ["train", "val", "test"][i % 3]] for i, r in enumerate(_images(tmp_path))]
    rows.append(["img0.png", "q", 0, "test"])  # img0 is in train in row 2
    csv = write_csv(tmp_path / "t.csv", ["path", "patient", "label", "split"], rows)
    with pytest.raises(UserError, match=r"t.csv row 14 and t.csv row 2: .*img0.png is the same file in both rows, "
                                        r"with different splits"):
        build_datasets(_cfg(csv, split_column="split"))


def test_a_slide_listed_twice_for_a_patient_is_refused(tmp_path):
    from test_data_bags import _slides

    cfg = _slides(tmp_path, n_patients=4, extra_slides=[["P1", "s1a.h5"]])
    with pytest.raises(UserError, match=r"clini.csv row 3: .*s1a.h5 is the same file as another input"):
        build_datasets(cfg)


def test_segmentation_pair_with_two_label_maps_is_refused(tmp_path):
    rows = []
    for i in range(6):
        write_nifti(tmp_path / f"img{i}.nii.gz", np.full((4, 4, 4), i, np.float32))
        write_nifti(tmp_path / f"seg{i}.nii.gz", (np.arange(64).reshape(4, 4, 4) > 10 * i).astype(np.float32))
        rows.append([f"img{i}.nii.gz", f"seg{i}.nii.gz"])
    rows.append(["img2.nii.gz", "seg4.nii.gz"])
    csv = write_csv(tmp_path / "pairs.csv", ["image", "label"], rows)
    cfg = {"kind": "nifti_segmentation", "csv": str(csv), "num_classes": 2, "target_size": [4, 4, 4]}
    with pytest.raises(UserError, match=r"pairs.csv row 8 and pairs.csv row 4: .*img2.nii.gz .*different labels"):
        build_datasets(cfg)


def test_content_keys_compare_every_byte(tmp_path):
    from medattn.data.files import EDGE, content_keys

    big = np.random.default_rng(0).integers(0, 255, 3 * EDGE, np.uint8).tobytes()
    middle = bytearray(big)
    middle[len(big) // 2] ^= 1  # same size, head and tail: only the full hash tells them apart
    files = {"a": big, "b": big, "c": bytes(middle), "d": b"x" * 10, "e": b"y" * 10, "f": b"x" * 10}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    keys = content_keys([tmp_path / n for n in files] + [tmp_path / "missing"])
    assert keys[tmp_path / "a"] == keys[tmp_path / "b"] != keys[tmp_path / "c"]
    assert keys[tmp_path / "d"] == keys[tmp_path / "f"] != keys[tmp_path / "e"]
    assert keys[tmp_path / "missing"] == str(tmp_path / "missing")
