"""The realistic family's bag members beyond the IHC ones (issue 48): a second tissue (the retinal fundus) and a
second extractor, a count target; the finding sits in exactly the tiles chosen; the count task's target is the
number of lesion tiles written, whatever the bag's size; every member is read by medattn's builders."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from functools import partial

import numpy as np
import pytest

from medattn.config import load_config
from medattn.data import build_datasets
from medattn.generators.realistic import TASKS, make_task, outcomes, retina
from medattn.generators.realistic.bag_tasks import write_bags

pytest.importorskip("skimage")


def test_the_family_spans_tissues_rates_sizes_and_questions():
    specs = {name: task.bags for name, task in TASKS.items() if task.bags is not None}
    assert len(specs) >= 6 and {s.tissue for s in specs.values()} == {"ihc", "retina"}
    assert {s.target for s in specs.values()} == {"presence", "share", "count"}
    assert {t.data.get("task_type", "binary") for t in TASKS.values() if t.bags} == {"binary", "survival", "regression"}
    shares = [x for s in specs.values() if s.shares for x in s.shares]
    sizes = [x for s in specs.values() if s.sizes for x in s.sizes]
    assert min(shares) <= 0.005 and max(shares) >= 0.3 and min(sizes) <= 50 and max(sizes) >= 20_000


def test_the_retina_finding_sits_in_exactly_the_chosen_tiles():
    from medattn.generators.realistic.anatomy import retina_image

    image = retina_image()
    plain, coords = retina.retina_bag(image, np.random.default_rng(3), (60, 61), count=0)
    planted, same = retina.retina_bag(image, np.random.default_rng(3), (60, 61), count=7)
    assert plain.shape == (60, retina.FEATURE_DIM) and (coords == same).all()
    assert int((planted != plain).any(axis=1).sum()) == 7
    tiles_inside = all(image[y:y + 32, x:x + 32].mean(-1).min() > 20 for y, x in coords)
    assert tiles_inside  # inside the field of view, never the dark surround


def _small_task(name: str, folder, monkeypatch, sizes: dict):
    """``name`` written to ``folder`` with bags of 80-120 tiles (the same generator, seconds instead of minutes)."""
    task = TASKS[name]
    spec = replace(task.bags, sizes=(80, 120))
    monkeypatch.setitem(TASKS, name, replace(task, write=partial(write_bags, spec=spec), bags=spec))
    return make_task(name, folder, sizes=sizes, log=lambda m: None)


def test_the_count_task_writes_the_number_of_lesion_tiles_as_its_target(tmp_path, monkeypatch):
    folder = _small_task("retina_count", tmp_path, monkeypatch, {"train": 12, "val": 4, "test": 4})
    config = load_config(str(folder / "config.yaml"))
    assert config["data"]["label_columns"] == outcomes.COUNT_COLUMN and config["data"]["task_type"] == "regression"
    with open(folder / "clinical.csv", newline="") as f:
        counts = [int(r[outcomes.COUNT_COLUMN]) for r in csv.DictReader(f)]
    assert all(0 <= c <= outcomes.MAX_COUNT for c in counts) and len(set(counts)) > 3
    bundle = build_datasets(config["data"], seed=0)
    assert bundle.task.task_type == "regression" and bundle.task.input_shape == (retina.FEATURE_DIM,)
    assert sorted(float(bundle.train[i]["label"][0]) for i in range(12)) == sorted(float(c) for c in counts[:12])


def test_the_count_driven_survival_task_reads_the_count_as_the_burden(tmp_path, monkeypatch):
    """retina_survival: more lesion tiles, earlier events; the count is planted in the bag and is not in the table."""
    folder = _small_task("retina_survival", tmp_path, monkeypatch, {"train": 40, "val": 10, "test": 10})
    config = load_config(str(folder / "config.yaml"))
    assert config["data"]["task_type"] == "survival" and "label_columns" not in config["data"]
    with open(folder / "clinical.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert outcomes.COUNT_COLUMN not in rows[0] and {outcomes.TIME_COLUMN, outcomes.EVENT_COLUMN} <= set(rows[0])
    probe = json.loads((folder / "probe.json").read_text())
    assert probe["burden_c_index"] > 0.6  # the planted count tells the order of the events
    same = outcomes.count_survival(np.array([0, 30, 60]), np.random.default_rng(0))
    burden = outcomes.survival(outcomes.S_MAX * np.array([0, 0.5, 1.0]), np.random.default_rng(0))
    assert same == burden
