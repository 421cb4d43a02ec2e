"""One CSV dialect everywhere (issue 36): every CSV medattn writes ends its lines with "\\n" only (the csv module's
default is "\\r\\n", which most files had while explain's tile table had "\\n"), and a bag's tile table says the unit
of its coordinates and gives them in level-0 pixels as its GeoJSON does."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import h5py
import numpy as np

from medattn.cli import main
from medattn.outputs import OutputFolder

#: A bag model trained for two epochs (metrics.csv appended twice) in seconds.
BAGS = ["model.name=vitwsi_tiny", "data.num_instances=[10, 30]", "data.feature_dim=16",
        "data.num_samples={train: 24, val: 16, test: 16}", "train.epochs=2", "train.batch_size=4", "eval.bootstrap=0",
        "eval.heatmaps=0", "train.threads=1"]


def rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_the_writers_end_lines_with_a_newline_only(tmp_path):
    folder = OutputFolder.within(tmp_path)
    folder.save_csv("quoted.csv", ["a", "b"], [[1, "x, y"], [2, 'say "hi"']])
    assert (tmp_path / "quoted.csv").read_bytes() == b'a,b\n1,"x, y"\n2,"say ""hi"""\n'
    folder.save_dicts("dicts.csv", [{"a": 1, "b": 2}], ["a", "b"])
    assert (tmp_path / "dicts.csv").read_bytes() == b"a,b\n1,2\n"
    path = tmp_path / "old.csv"
    path.write_bytes(b"a,b\r\n1,2\r\n")  # a file an earlier medattn wrote
    folder.append_csv("old.csv", [{"a": 3, "b": 4}], ["a", "b"])
    assert path.read_bytes() == b"a,b\n1,2\n3,4\n"
    folder.save_csv("new.csv", ["a"], [[1]])
    assert (tmp_path / "new.csv").read_bytes() == b"a\n1\n"


def _bags(folder: Path) -> tuple[Path, Path]:
    """A CLAM-layout bag (coords in level-0 pixels, no attributes) and a STAMP-layout one (microns, mpp 0.5)."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    grid = np.stack(np.meshgrid(np.arange(4), np.arange(5), indexing="ij"), -1).reshape(-1, 2)
    clam, stamp = folder / "clam.h5", folder / "stamp.h5"
    with h5py.File(clam, "w") as f:
        f["features"] = rng.normal(size=(len(grid), 16)).astype(np.float32)
        f["coords"] = grid * 256
    with h5py.File(stamp, "w") as f:
        f["feats"] = rng.normal(size=(len(grid), 16)).astype(np.float32)
        f["coords"] = (grid * 128.0).astype(np.float32)  # 256 px tiles at 0.5 um per px
        f.attrs.update({"unit": "um", "mpp": 0.5, "tile_size_um": 128.0, "patch_size_level0": 256})
    return clam, stamp


def test_every_csv_of_train_predict_and_explain_ends_lines_with_a_newline_only(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "synthetic_wsi", *BAGS, "--out", str(run), "--no-progress"]) == 0
    clam, stamp = _bags(tmp_path / "bags")
    assert main(["predict", str(run), str(clam), str(stamp), "--out", str(tmp_path / "predict" / "p.csv")]) == 0
    assert main(["explain", str(run), str(clam), str(stamp), "--out", str(tmp_path / "explain")]) == 0, \
        capsys.readouterr().err
    written = sorted(tmp_path.rglob("*.csv"))
    names = {p.relative_to(tmp_path).as_posix() for p in written}
    assert {"run/metrics.csv", "run/predictions_test.csv", "predict/p.csv", "explain/summary.csv",
            "explain/clam_tiles.csv", "explain/stamp_tiles.csv"} <= names
    for path in written:
        data = path.read_bytes()
        assert b"\r" not in data and data.endswith(b"\n"), f"{path.relative_to(tmp_path)}: {data[:80]!r}"

    # the tile table's coordinates: as the bag stores them with their unit, and in level-0 pixels as the GeoJSON
    for name, unit, per_px in (("clam", "px", 1.0), ("stamp", "um", 0.5)):
        table = rows(tmp_path / "explain" / f"{name}_tiles.csv")
        assert list(table[0]) == ["tile", "x", "y", "coords_unit", "x_level0_px", "y_level0_px", "score"]
        assert {row["coords_unit"] for row in table} == {unit}
        stored = np.array([[float(row["x"]), float(row["y"])] for row in table])
        level0 = np.array([[float(row["x_level0_px"]), float(row["y_level0_px"])] for row in table])
        np.testing.assert_allclose(level0, stored / per_px)
        features = json.loads((tmp_path / "explain" / f"{name}_tiles.geojson").read_text())["features"]
        corners = np.array([feature["geometry"]["coordinates"][0][0] for feature in features])
        np.testing.assert_allclose(corners, level0)
        with h5py.File(tmp_path / "explain" / f"{name}_tiles.h5") as f:
            assert f.attrs["coords_unit"] == unit


def test_csv_files_are_written_by_the_outputs_module_only():
    """A csv writer made anywhere but medattn.outputs writes the module's default "\\r\\n"."""
    import ast

    import medattn

    root = Path(medattn.__file__).parent
    makers = set()
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("writer", "DictWriter") and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "csv"):
                makers.add(path.relative_to(root).as_posix())
    assert makers - {"outputs.py"} == set()
