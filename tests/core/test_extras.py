"""Each optional dependency hidden in turn: the command that needs it says so in one line naming the extra."""

from __future__ import annotations

import sys

import pytest

from medattn.cli import main
from medattn.extras import EXTRAS


@pytest.fixture(scope="module")
def run_and_onnx(tmp_path_factory):
    """A one-epoch synthetic run, its ONNX export (made while every extra is installed) and a PNG."""
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")
    from PIL import Image

    root = tmp_path_factory.mktemp("extras")
    argv = ["train", "synthetic_cxr", "--out", str(root / "run"), "--no-progress", "model.name=vit2d_tiny",
            "data.image_size=32", "data.num_samples=[16,8,8]", "train.epochs=1", "eval.bootstrap=0"]
    assert main(argv) == 0
    assert main(["export", str(root / "run"), "--format", "onnx", "--out", str(root / "m.onnx"), "--no-check"]) == 0
    Image.new("L", (32, 32), 90).save(root / "x.png")
    return root


def _commands(root):
    """module -> the command that needs it (extra, argv)."""
    run, onnx, png = str(root / "run"), str(root / "m.onnx"), str(root / "x.png")
    export = ["export", run, "--format", "onnx", "--out", str(root / "again.onnx"), "--no-check"]
    return {
        "tifffile": ["wsi", "synthetic", str(root / "slides")],
        "openslide": ["wsi", "tile", png, "--out", str(root / "tiles"), "--no-progress"],
        "onnx": ["predict", onnx, png, "--out", str(root / "p.csv")],
        "onnxscript": export,
        "onnxruntime": ["predict", onnx, png, "--out", str(root / "p.csv")],
        "nilearn": ["realistic", "--out", str(root / "realistic"), "--tasks", "brain_mri_2d"],
        "skimage": ["realistic", "--out", str(root / "realistic"), "--tasks", "ihc_bags"],
        "monai": ["train", "synthetic_cxr", "--out", str(root / "swin"), "model.name=swin2d_tiny",
                  "model.attention=null", "data.num_samples=[8,4,4]", "data.image_size=32", "train.epochs=1"],
        "einops": None,  # MONAI's import of einops: monai's own case
        "tensorboard": ["train", "synthetic_cxr", "--out", str(root / "tb"), "model.name=vit2d_tiny",
                        "data.num_samples=[8,4,4]", "data.image_size=32", "train.epochs=1", "train.tensorboard=true"],
    }


def test_every_extra_module_has_a_command_that_needs_it(run_and_onnx):
    assert set(_commands(run_and_onnx)) == set(EXTRAS)


@pytest.mark.parametrize("module", sorted(m for m in EXTRAS if m != "einops"))
def test_a_hidden_extra_is_one_line_naming_it(module, run_and_onnx, monkeypatch, capsys):
    for name in [n for n in sys.modules if n == module or n.startswith(f"{module}.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)  # import now fails as if it were not installed
    capsys.readouterr()
    assert main(_commands(run_and_onnx)[module]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("medattn: error: ") and "\n" not in err, err
    assert f"needs {module}: pip install 'medattn[{EXTRAS[module]}]'" in err
