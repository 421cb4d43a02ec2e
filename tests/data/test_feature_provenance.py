"""Feature provenance: a bag model records what made its training features (extractor, tile side in microns, mpp,
layout) and predict, explain and eval refuse bags made otherwise in one line naming both, before writing anything;
--accept-features uses them and the outputs say so. Before, a model trained on 256 um, 1 um/px features explained a
128 um, 0.5 um/px bag with exit 0 and a changed map, and a width mismatch pointed to --skip-bad."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from engine_data import tiny_config
from medattn.cli import main
from medattn.data.kinds.bags import build_wsi_bags
from medattn.data.provenance import collect, differences
from medattn.data.readers.bags import write_bag
from medattn.outputs import OutputFolder
from medattn.runtime import checkpoint
from medattn.train.loop import fit

WIDTH = 16
TRAINED = {"extractor": "descriptor-A", "patch_size_um": 256.0, "patch_size_px": 256, "mpp": 1.0}


def bag(path, seed, attrs, layout="clam", width=WIDTH, tiles=12):
    rng = np.random.default_rng(seed)
    coords = np.stack(np.meshgrid(np.arange(4), np.arange(tiles // 4), indexing="ij"), -1).reshape(-1, 2) * 256
    write_bag(OutputFolder.within(path.parent), path.name, rng.normal(size=(len(coords), width)).astype(np.float32),
              coords, attrs, layout)
    return path


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_table(path, header, body):
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([header, *body])
    return str(path)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny bag model trained on extractor A features: 256 um tiles of slides at 1 um/px, CLAM layout."""
    root = tmp_path_factory.mktemp("provenance")
    (root / "feats").mkdir()
    slides, patients = [], []
    for i in range(12):
        bag(root / "feats" / f"s{i}.h5", i, TRAINED)
        slides.append([f"P{i}", f"s{i}.h5"])
        patients.append([f"P{i}", i % 2, ["train", "val", "test"][(i // 2) % 3]])
    cfg = {"kind": "wsi_bags", "feature_dir": str(root / "feats"),
           "slide_table": write_table(root / "slides.csv", ["PATIENT", "FILENAME"], slides),
           "clinical_table": write_table(root / "clinical.csv", ["PATIENT", "label", "split"], patients),
           "label_columns": ["label"], "split_column": "split"}
    bundle = build_wsi_bags(cfg)
    config = tiny_config("model.name=abmil_tiny", "model.attention=null", "train.epochs=1", "eval.bootstrap=10")
    torch.manual_seed(0)
    fit(config, bundle, root / "run", progress=False, log=lambda m: None)
    return root


def test_training_records_the_features_provenance(run):
    meta = checkpoint.load_meta(checkpoint.resolve(run / "run"))
    assert meta["features"] == {"extractor": "descriptor-A", "patch_size_um": 256.0, "patch_size_px": 256, "mpp": 1.0,
                                "layout": "clam"}


def test_predict_and_explain_refuse_other_features_in_one_line(run, tmp_path, capsys):
    other = bag(tmp_path / "other.h5", 99, {**TRAINED, "patch_size_um": 128.0, "mpp": 0.5}, layout="stamp")
    capsys.readouterr()
    assert main(["predict", str(run / "run"), str(other), "--out", str(tmp_path / "p" / "p.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    for part in ("other.h5", "patch_size_um 128 (model: 256)", "mpp 0.5 (model: 1)", "layout stamp (model: clam)",
                 "--accept-features"):
        assert part in err
    assert not (tmp_path / "p").exists() or not any((tmp_path / "p").iterdir())
    assert main(["explain", str(run / "run"), str(other), "--out", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "other.h5" in err and "patch_size_um 128 (model: 256)" in err
    assert not (tmp_path / "e").exists() or not any((tmp_path / "e").iterdir())
    extractor = bag(tmp_path / "b.h5", 98, {**TRAINED, "extractor": "descriptor-B"})
    assert main(["predict", str(run / "run"), str(extractor), "--out", str(tmp_path / "q.csv")]) == 2
    assert "extractor descriptor-B (model: descriptor-A)" in capsys.readouterr().err
    assert not (tmp_path / "q.csv").exists()


def test_accept_features_uses_them_and_the_outputs_say_so(run, tmp_path):
    same = bag(tmp_path / "same.h5", 97, {**TRAINED, "mpp": 1.04})  # a scanner's few percent: the same
    other = bag(tmp_path / "other.h5", 99, {**TRAINED, "patch_size_um": 128.0, "mpp": 0.5})
    assert main(["predict", str(run / "run"), str(same), str(other), "--out", str(tmp_path / "p.csv"),
                 "--accept-features"]) == 0
    table = rows(tmp_path / "p.csv")
    assert table[0]["features_accepted"] == ""
    assert table[1]["features_accepted"] == "patch_size_um 128 (model: 256); mpp 0.5 (model: 1)"
    assert main(["explain", str(run / "run"), str(other), "--out", str(tmp_path / "e"), "--accept-features"]) == 0
    assert rows(tmp_path / "e" / "summary.csv")[0]["features_accepted"].startswith("patch_size_um 128")
    assert main(["predict", str(run / "run"), str(same), "--out", str(tmp_path / "plain.csv")]) == 0
    assert "features_accepted" not in rows(tmp_path / "plain.csv")[0]  # matching bags: the CSV as before


def test_width_mismatch_names_the_extractor_the_model_expects(run, tmp_path, capsys):
    wide = bag(tmp_path / "wide.h5", 5, {**TRAINED, "extractor": "uni"}, width=384)
    for command in (["predict", str(run / "run"), str(wide), "--out", str(tmp_path / "w.csv")],
                    ["explain", str(run / "run"), str(wide), "--out", str(tmp_path / "we")]):
        capsys.readouterr()
        assert main(command) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "wide.h5" in err and "width 384" in err
        assert "descriptor-A" in err and "--skip-bad" not in err


def test_a_checkpoint_without_provenance_still_works(run, tmp_path, capsys):
    import shutil

    old = tmp_path / "old"
    shutil.copytree(checkpoint.resolve(run / "run"), old)
    meta = json.loads((old / checkpoint.META_FILE).read_text())
    del meta["features"]
    (old / checkpoint.META_FILE).write_text(json.dumps(meta))
    other = bag(tmp_path / "other.h5", 99, {**TRAINED, "patch_size_um": 128.0, "mpp": 0.5}, layout="stamp")
    assert main(["predict", str(old), str(other), "--out", str(tmp_path / "p.csv")]) == 0
    assert main(["explain", str(old), str(other), "--out", str(tmp_path / "e")]) == 0
    wide = bag(tmp_path / "wide.h5", 5, TRAINED, width=8)
    capsys.readouterr()
    assert main(["predict", str(old), str(wide), "--out", str(tmp_path / "w.csv")]) == 2
    assert "width 8, the model takes 16-wide features" in capsys.readouterr().err


def test_a_damaged_features_record_is_refused(run, tmp_path):
    import shutil

    from medattn.errors import UserError

    bad = tmp_path / "bad"
    shutil.copytree(checkpoint.resolve(run / "run"), bad)
    meta = json.loads((bad / checkpoint.META_FILE).read_text())
    meta["features"] = {"extractor": {"nested": 1}}
    (bad / checkpoint.META_FILE).write_text(json.dumps(meta))
    with pytest.raises(UserError, match="features must map"):
        checkpoint.load_meta(bad)


def test_mixed_training_bags_record_every_value(tmp_path):
    paths = [bag(tmp_path / "a.h5", 0, TRAINED), bag(tmp_path / "b.h5", 1, {**TRAINED, "extractor": "B"}),
             bag(tmp_path / "c.h5", 2, {"patch_size_um": 256.0, "patch_size_px": 256, "mpp": 1.0}, layout="stamp")]
    recorded = collect(paths)
    assert recorded == {"extractor": ["B", "descriptor-A"], "patch_size_um": 256.0, "patch_size_px": 256, "mpp": 1.0,
                        "layout": ["clam", "stamp"]}
    assert differences(recorded, {"extractor": "B", "layout": "stamp"}) == []
    assert differences(recorded, {"extractor": "C"}) == ["extractor C (model: B or descriptor-A)"]


# --- one feature space per cohort (issue 49) --------------------------------------------------------------------------


def cohort(root, other: dict, width=WIDTH):
    """12 patients of one slide each, P0-P5 of features made as TRAINED, P6-P11 as TRAINED | ``other``: the wsi_bags
    config."""
    (root / "feats").mkdir(parents=True, exist_ok=True)
    slides, patients = [], []
    for i in range(12):
        made = TRAINED if i < 6 else {**TRAINED, **other}
        bag(root / "feats" / f"s{i}.h5", i, made, width=width if i >= 6 else WIDTH)
        slides.append([f"P{i}", f"s{i}.h5"])
        patients.append([f"P{i}", i % 2, ["train", "val", "test"][(i // 2) % 3]])
    return {"kind": "wsi_bags", "feature_dir": str(root / "feats"),
            "slide_table": write_table(root / "slides.csv", ["PATIENT", "FILENAME"], slides),
            "clinical_table": write_table(root / "clini.csv", ["PATIENT", "label", "split"], patients),
            "label_columns": ["label"], "split_column": "split"}


@pytest.mark.parametrize("other, shown", [
    ({"patch_size_um": 128.0}, ("patch_size_um 256", "patch_size_um 128")),  # another magnification
    ({"extractor": "descriptor-B"}, ("extractor descriptor-A", "extractor descriptor-B")),  # same width
    ({"stain_norm": "macenko"}, ("stain_norm unrecorded", "stain_norm macenko")),
    ({"extractor_sha256": "ab" * 32}, ("extractor_digest unrecorded", f"extractor_digest {'ab' * 32}")),
])
def test_a_table_mixing_feature_spaces_is_refused_before_training(tmp_path, other, shown):
    """Before, the cohort trained without a word and checkpoint.json recorded both values as a list."""
    from medattn.errors import UserError

    cfg = cohort(tmp_path, other)
    with pytest.raises(UserError) as err:
        build_wsi_bags(cfg)
    message = str(err.value)
    assert "\n" not in message and "bags of two feature spaces" in message and "mixed_feature_spaces: true" in message
    assert f"s0.h5 has {shown[0]}" in message and f"s6.h5 has {shown[1]}" in message


def test_mixed_feature_spaces_true_mixes_them_knowingly_and_the_checkpoint_records_it(tmp_path, capsys):
    cfg = cohort(tmp_path, {"patch_size_um": 128.0})
    bundle = build_wsi_bags({**cfg, "mixed_feature_spaces": True})
    assert bundle.features["patch_size_um"] == [128.0, 256.0] and bundle.features["mixed_feature_spaces"] is True
    from medattn.data.provenance import check_recorded
    from medattn.errors import UserError

    check_recorded(bundle.features, "checkpoint.json")  # the record is one a checkpoint may hold
    with pytest.raises(UserError, match="features must map"):
        check_recorded({**bundle.features, "mixed_feature_spaces": "yes"}, "checkpoint.json")
    with pytest.raises(UserError, match="mixed_feature_spaces must be true or false"):
        build_wsi_bags({**cfg, "mixed_feature_spaces": "yes"})
    same = build_wsi_bags(cohort(tmp_path / "same", {"mpp": 0.5}))  # another scanner: one feature space
    assert "mixed_feature_spaces" not in same.features and same.features["mpp"] == [0.5, 1.0]


def test_the_train_command_refuses_a_mixed_cohort_in_one_line(tmp_path, capsys):
    cfg = cohort(tmp_path, {"patch_size_um": 128.0})
    data = [f"data.{key}={cfg[key]}" for key in ("feature_dir", "slide_table", "clinical_table")]
    capsys.readouterr()
    assert main(["train", "synthetic_slides", *data, "data.label_columns=[label]", "data.split_column=split",
                 "train.epochs=1", "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "s0.h5 has patch_size_um 256" in err and "s6.h5 has patch_size_um 128" in err
    assert not (tmp_path / "run" / "checkpoint").exists()


def test_width_mismatch_in_a_table_names_the_two_files(tmp_path):
    """Before, a patient whose two slides differ in width was refused naming "clini.csv row 2" twice."""
    from medattn.errors import UserError

    cfg = cohort(tmp_path, {})
    bag(tmp_path / "feats" / "s0b.h5", 50, TRAINED, width=WIDTH + 8)
    with open(tmp_path / "slides.csv", "a", newline="") as f:
        csv.writer(f).writerow(["P0", "s0b.h5"])
    with pytest.raises(UserError) as err:
        build_wsi_bags(cfg)
    message = str(err.value)
    assert "s0.h5 has 16" in message and "s0b.h5 has 24" in message and "row 2" not in message


def test_predict_refuses_another_tile_side_in_pixels(run, tmp_path, capsys):
    """The tile side in pixels is part of the record (issue 49): 256 um read at 224 px is another feature space."""
    other = bag(tmp_path / "px.h5", 96, {**TRAINED, "patch_size_px": 224})
    capsys.readouterr()
    assert main(["predict", str(run / "run"), str(other), "--out", str(tmp_path / "p.csv")]) == 2
    assert "patch_size_px 224 (model: 256)" in capsys.readouterr().err
