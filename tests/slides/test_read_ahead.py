"""ReadAhead: a background thread produces the next batches while the consumer computes."""

from __future__ import annotations

import threading
import time

import pytest

from medattn.errors import UserError
from medattn.slides.tiling import ReadAhead


def test_items_arrive_in_order_and_are_produced_while_the_consumer_works():
    produced_at, consumed = {}, []

    def items():
        for i in range(6):
            time.sleep(0.05)  # reading a batch
            produced_at[i] = time.perf_counter()
            yield i

    reader = ReadAhead(items(), depth=2)
    started = time.perf_counter()
    for item in reader:
        time.sleep(0.05)  # encoding it
        consumed.append(item)
    elapsed = time.perf_counter() - started
    assert consumed == list(range(6))
    # alternating would take 6 x (0.05 + 0.05) = 0.6 s; overlapped about 0.35 s
    assert elapsed < 0.5
    assert produced_at[1] < produced_at[0] + 0.09  # the second batch was read while the first was encoded


def test_an_error_while_reading_reaches_the_consumer_after_the_items_before_it():
    def items():
        yield 0
        yield 1
        raise UserError("slide.svs at (0, 0): cannot read the slide")

    got = []
    with pytest.raises(UserError, match="cannot read"):
        for item in ReadAhead(items()):
            got.append(item)
    assert got == [0, 1]


def test_a_consumer_that_stops_early_stops_the_thread():
    before = threading.active_count()
    with pytest.raises(RuntimeError):
        for item in ReadAhead(range(1000), depth=1):
            if item == 3:
                raise RuntimeError("the encoder failed")
    assert threading.active_count() == before
    assert len(ReadAhead([1, 2, 3])) == 3  # a progress bar's total


def test_extraction_reading_ahead_writes_the_features_it_writes_without(tmp_path, monkeypatch):
    pytest.importorskip("openslide")
    import h5py
    import numpy as np

    from medattn.generators.slides import write_synthetic_cohort
    from medattn.slides import extract as extract_module
    from medattn.slides.extract import extract_slide
    from medattn.slides.extractors import build_extractor
    from medattn.slides.settings import TileSettings

    (slide,) = write_synthetic_cohort(tmp_path / "slides", count=1, seed=1, shape=(384, 512))
    settings = TileSettings(patch_um=64, patch_px=32, thumbnail_px=256)
    extractor = build_extractor("descriptor")
    used = []
    monkeypatch.setattr(extract_module, "ReadAhead", lambda items: used.append(1) or ReadAhead(items))
    written = []
    for ahead in (True, False):
        out = tmp_path / f"ahead_{ahead}.h5"
        kept, _ = extract_slide(slide, out, extractor, settings, batch_size=4, read_ahead=ahead)
        with h5py.File(out) as f:
            written.append((kept, f["features"][:], f["coords"][:]))
    assert used == [1]  # the thread read for the first extraction only
    assert written[0][0] > 8  # several batches
    assert written[0][0] == written[1][0]
    assert np.array_equal(written[0][1], written[1][1]) and np.array_equal(written[0][2], written[1][2])
