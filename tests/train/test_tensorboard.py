"""train.tensorboard=true: the epoch rows of metrics.csv as TensorBoard scalars, read back with TensorBoard's own
reader; a resumed run's events hold each epoch once."""

from __future__ import annotations

import csv

import pytest

from engine_data import image_bundle, tiny_config
from medattn.train import fit

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


class Stopped(Exception):
    pass


def stop_after_epoch_1(epoch, row):
    if epoch == 1:
        raise Stopped


def scalars(run) -> dict[str, dict[int, list[float]]]:
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    found: dict[str, dict[int, list[float]]] = {}
    for tag in events.Tags()["scalars"]:
        for event in events.Scalars(tag):
            found.setdefault(tag, {}).setdefault(event.step, []).append(event.value)
    return found


def test_scalars_equal_metrics_csv_and_a_resume_keeps_each_epoch_once(tmp_path):
    config, run = tiny_config("train.epochs=3", "train.tensorboard=true"), tmp_path / "run"
    with pytest.raises(Stopped):
        fit(config, image_bundle(), run, progress=False, log=lambda m: None, on_epoch_end=stop_after_epoch_1)
    fit(config, image_bundle(), run, resume=True, progress=False, log=lambda m: None)
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    written = scalars(run)
    assert set(written) == {"lr", "train_loss", "val_loss", "val_auroc", "seconds"}
    for tag, by_epoch in written.items():
        assert {epoch: len(values) for epoch, values in by_epoch.items()} == {1: 1, 2: 1, 3: 1}, tag  # each once
        assert [by_epoch[int(r["epoch"])][0] for r in rows] == pytest.approx([float(r[tag]) for r in rows], rel=1e-6)


def test_an_overwritten_run_takes_its_events_along(tmp_path):
    """--overwrite replaces the whole run, its TensorBoard events too (they had stayed beside the new run's)."""
    run = tmp_path / "run"
    fit(tiny_config("train.epochs=2", "train.tensorboard=true"), image_bundle(), run, progress=False,
        log=lambda m: None)
    first = sorted(p.name for p in (run / "tensorboard").iterdir())
    fit(tiny_config("train.epochs=1", "train.tensorboard=true"), image_bundle(), run, overwrite=True,
        progress=False, log=lambda m: None)
    assert not set(first) & {p.name for p in (run / "tensorboard").iterdir()}
    assert {tag: sorted(by_epoch) for tag, by_epoch in scalars(run).items()}["val_loss"] == [1]
