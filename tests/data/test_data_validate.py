"""Every file decoded once before training (medattn.data.validate), and not again while unchanged."""

from __future__ import annotations

import os

import numpy as np
import pytest
from PIL import Image

from medattn.data import build_datasets
from medattn.data.validate import cache_path, decode_all
from medattn.errors import UserError


def _table(folder, n=9):
    rng = np.random.default_rng(0)
    lines = ["path,label"]
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (12, 12), dtype=np.uint8)).save(folder / f"{i}.png")
        lines.append(f"{i}.png,{i % 2}")
    (folder / "t.csv").write_text("\n".join(lines) + "\n")
    return {"kind": "image_table", "csv": str(folder / "t.csv"), "label_columns": ["label"], "image_size": 8,
            "in_chans": 1, "augment": False}


def test_files_are_decoded_once_and_again_only_when_changed(tmp_path, monkeypatch):
    monkeypatch.setenv("MEDATTN_CACHE_DIR", str(tmp_path / "cache"))
    bundle = build_datasets(_table(tmp_path), seed=0)
    assert decode_all(bundle, progress=False) == 9 and cache_path().is_file()
    assert decode_all(bundle, progress=False) == 0
    stat = os.stat(tmp_path / "3.png")
    os.utime(tmp_path / "3.png", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert decode_all(bundle, progress=False) == 1
    (tmp_path / "5.png").write_bytes(b"\x89PNG broken")
    with pytest.raises(UserError, match="5.png"):
        decode_all(bundle, progress=False)
    cache_path().write_text("not json")  # an unreadable cache is ignored, never an error
    with pytest.raises(UserError, match="5.png"):
        decode_all(bundle, progress=False)


def test_generated_data_are_not_read_again():
    assert decode_all(build_datasets({"kind": "synthetic_cxr", "image_size": 16, "num_samples": [2, 2, 2]})) == 0
