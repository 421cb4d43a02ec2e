"""predict --patients predicts a patient from every slide the table lists, or says it did not (issue 49). Before, a
patient whose table lists two slides, given one, was predicted from that one with exit 0 (a risk moved from -0.026
to -0.168) and nothing in the CSV said so."""

from __future__ import annotations

import csv

import h5py
import numpy as np
import pytest

from engine_data import save_checkpoint
from medattn.cli import main
from medattn.data.base import TaskInfo


@pytest.fixture
def cohort(tmp_path):
    """A bag model of 16-d features and three bags: P1 has slides a and b, P2 has c."""
    ck = save_checkpoint(tmp_path / "ck", "synthetic_wsi", ["model.name=vitwsi_tiny", "model.attention=seqnorm"],
                         TaskInfo("binary", "bag", 1, (16,), ["tumour"], synthetic=True))
    rng = np.random.default_rng(0)
    for name, n in (("a", 30), ("b", 20), ("c", 25)):
        with h5py.File(tmp_path / f"{name}.h5", "w") as f:
            f["features"], f["coords"] = rng.normal(size=(n, 16)).astype(np.float32), np.zeros((n, 2), np.int64)
    (tmp_path / "slides.csv").write_text("PATIENT,FILENAME\nP1,a\nP1,b.h5\nP2,c\n")
    return ck


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_a_patient_missing_listed_slides_is_refused_naming_them(cohort, tmp_path, capsys):
    given = [str(tmp_path / "a.h5"), str(tmp_path / "c.h5")]
    capsys.readouterr()
    assert main(["predict", str(cohort), *given, "--patients", str(tmp_path / "slides.csv"),
                 "--out", str(tmp_path / "p.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "slides.csv: patient P1 lists 2 slides, 1 given (b.h5 not given)" in err
    assert "--partial-patients" in err and not (tmp_path / "p.csv").exists()


def test_partial_patients_predicts_from_those_given_and_the_csv_says_how_many(cohort, tmp_path, capsys):
    given = [str(tmp_path / "a.h5"), str(tmp_path / "c.h5")]
    assert main(["predict", str(cohort), *given, "--patients", str(tmp_path / "slides.csv"), "--partial-patients",
                 "--out", str(tmp_path / "p.csv")]) == 0
    assert "1 patient(s) predicted from part of their slides" in capsys.readouterr().err
    table = rows(tmp_path / "p.csv")
    assert [(r["patient"], r["slides_used"], r["slides_listed"]) for r in table] == [("P1", "1", "2"), ("P2", "1", "1")]
    everything = [str(tmp_path / f"{name}.h5") for name in "abc"]
    assert main(["predict", str(cohort), *everything, "--patients", str(tmp_path / "slides.csv"),
                 "--out", str(tmp_path / "all.csv")]) == 0
    full = rows(tmp_path / "all.csv")
    assert [(r["slides_used"], r["slides_listed"]) for r in full] == [("2", "2"), ("1", "1")]
    assert full[0]["prob_tumour"] != table[0]["prob_tumour"]  # part of a patient is another prediction
    assert main(["predict", str(cohort), *everything, "--partial-patients", "--out", str(tmp_path / "x.csv")]) == 2
