"""medattn explain on 2D, 3D and bag files through the command, from tiny checkpoints saved by the checkpoint module;
files are prepared as medattn predict prepares them (the checkpoint's stored preprocessing)."""

from __future__ import annotations

import h5py
import nibabel as nib
import numpy as np
import pytest
import torch
from PIL import Image

from engine_data import rows, save_checkpoint
from medattn.cli import main
from medattn.data.base import TaskInfo
from medattn.data.readers.volumes import to_native_grid, uncrop_or_unpad
from medattn.errors import UserError
from pictures import colour_bar_span


@pytest.mark.parametrize("method", ["auto", "rollout", "gradxinput"])
def test_explain_images_writes_readable_heatmaps(tmp_path, method):
    """Image and map side by side at a readable size (a 48 x 40 image was a 48 x 40 PNG), with a colour bar and a
    title; the SYNTHETIC note lies below the panels, not over the data."""
    ck = save_checkpoint(tmp_path / "ck", "synthetic_cxr", ["model.name=vit2d_tiny"],
                         TaskInfo("binary", "image2d", 1, (1, 32, 32), ["cardiomegaly"], synthetic=True),
                         mean=[0.5], std=[0.5])
    files = []
    for i, size in enumerate([(48, 40), (32, 32)]):
        path = tmp_path / f"img{i}.png"
        Image.fromarray(np.random.default_rng(i).integers(0, 255, size[::-1], dtype=np.uint8)).save(path)
        files.append(str(path))
    assert main(["explain", str(ck), *files, "--out", str(tmp_path / "out"), "--method", method]) == 0
    figure = Image.open(tmp_path / "out" / "img0.png")
    assert figure.mode == "RGB" and figure.size[0] >= 2 * 400 and figure.size[1] >= 300
    pixels = np.asarray(figure)
    assert (pixels[-12:, :, 0] > 150).any() and (pixels[-12:, :, 1] < 80).any()  # the red SYNTHETIC note, at the foot
    summary = rows(tmp_path / "out" / "summary.csv")
    assert [r["outputs"] for r in summary] == ["img0.png", "img1.png"]
    assert 0 < float(summary[0]["prob_cardiomegaly"]) < 1
    assert summary[0]["method"] == {"auto": "gradrollout"}.get(method, method)
    assert summary[0]["target"] == ("" if method == "rollout" else "0")


def test_explain_volume_writes_nifti_on_the_input_grid(tmp_path):
    ck = save_checkpoint(tmp_path / "ck", "synthetic_breast_mri", ["model.name=vit3d_tiny"],
                         TaskInfo("binary", "volume3d", 1, (1, 16, 16, 8), ["cancer"], synthetic=True),
                         spacing=[2.0, 2.0, 3.0], normalize="zscore")
    affine = np.array([[-1.5, 0, 0, 10], [0, 0, 2.0, -5], [0, 1.0, 0, 3], [0, 0, 0, 1]])  # LSA-like, not RAS
    path = tmp_path / "vol.nii.gz"
    nib.save(nib.Nifti1Image(np.random.default_rng(0).normal(size=(20, 9, 30)).astype(np.float32), affine), path)
    assert main(["explain", str(ck), str(path), "--out", str(tmp_path / "out")]) == 0
    out = nib.load(tmp_path / "out" / "vol.nii.gz")
    assert out.shape == (20, 9, 30)
    np.testing.assert_allclose(out.affine, affine)
    assert np.isfinite(out.get_fdata()).all() and np.ptp(out.get_fdata()) > 0
    preview = Image.open(tmp_path / "out" / "vol_preview.png")  # three orthogonal slices beside every 3D map
    assert preview.size[0] >= 1000 and rows(tmp_path / "out" / "summary.csv")[0]["outputs"] == \
        "vol.nii.gz vol_preview.png"


def test_volume_map_returns_each_voxel_to_where_it_came_from(tmp_path):
    """Without resampling, the map of voxel values comes back as the volume itself (crop/pad and reorientation
    undone), checked on a volume whose value at every voxel is its own index."""
    from medattn.data.readers.volumes import crop_or_pad, read_volume

    affine = np.array([[0, -1.0, 0, 0], [1.0, 0, 0, 0], [0, 0, -1.0, 0], [0, 0, 0, 1]])
    index = np.arange(7 * 10 * 5, dtype=np.float32).reshape(7, 10, 5) + 1
    path = tmp_path / "v.nii"
    nib.save(nib.Nifti1Image(index, affine), path)
    volume, _ = read_volume(path)
    model_grid = crop_or_pad(volume, (8, 6, 5))  # the loader's crop/pad to the model's size
    back, kept = to_native_grid(model_grid, path, None)
    np.testing.assert_allclose(kept, affine)
    seen = back != 0
    np.testing.assert_array_equal(back[seen], index[seen])
    assert seen.sum() == 8 * 6 * 5  # RAS shape (10, 7, 5) cropped to (8, 6, 5): every kept voxel is back
    torch.testing.assert_close(uncrop_or_unpad(torch.ones(2, 2), (4, 1)), torch.tensor([[0.0], [1.0], [1.0], [0.0]]))


@pytest.mark.parametrize("attention, chunk, used", [("seqnorm", "40", "rollout"), ("seqnorm", "32768", "gradrollout"),
                                                    ("softmax", "40", "gradrollout")])
def test_explain_bag_writes_tile_tables_and_a_map(tmp_path, attention, chunk, used):
    """auto: gradrollout in memory, streamed rollout for a SeqNorm bag longer than --chunk-size."""
    ck = save_checkpoint(tmp_path / "ck", "synthetic_wsi", ["model.name=vitwsi_tiny", f"model.attention={attention}"],
                         TaskInfo("binary", "bag", 1, (16,), ["tumour"], synthetic=True))
    path = tmp_path / "slide.h5"
    coords = np.stack(np.meshgrid(np.arange(10), np.arange(12), indexing="ij"), -1).reshape(-1, 2) * 256
    with h5py.File(path, "w") as f:
        f["features"] = np.random.default_rng(0).normal(size=(len(coords), 16)).astype(np.float32)
        f["coords"] = coords
    assert main(["explain", str(ck), str(path), "--out", str(tmp_path / "out"), "--chunk-size", chunk]) == 0
    table = rows(tmp_path / "out" / "slide_tiles.csv")
    assert len(table) == len(coords) and table[5]["x"] == str(coords[5, 0])
    with h5py.File(tmp_path / "out" / "slide_tiles.h5") as f:
        assert f["scores"].shape == (len(coords),) and f["coords"].shape == (len(coords), 2)
        assert f.attrs["method"] == used
        scores = f["scores"][:]
    signed = scores.min() < 0  # a signed map is drawn red/blue around 0, a non-negative one dark to bright
    assert colour_bar_span(tmp_path / "out" / "slide.png", "RdBu_r" if signed else "inferno") > 0.8
    np.testing.assert_allclose([float(r["score"]) for r in table], scores, rtol=1e-6)
    assert rows(tmp_path / "out" / "summary.csv")[0]["method"] == used


def test_streamed_and_in_memory_bag_files_agree(tmp_path):
    ck = save_checkpoint(tmp_path / "ck", "synthetic_wsi", ["model.name=vitwsi_tiny"],
                         TaskInfo("binary", "bag", 1, (16,), ["tumour"], synthetic=True))
    path = tmp_path / "slide.h5"
    with h5py.File(path, "w") as f:
        f["features"] = np.random.default_rng(1).normal(size=(200, 16)).astype(np.float32)
    for chunk in ("16", "1000"):
        assert main(["explain", str(ck), str(path), "--out", str(tmp_path / chunk), "--chunk-size", chunk,
                     "--method", "rollout"]) == 0
    a, b = (np.array([float(r["score"]) for r in rows(tmp_path / c / "slide_tiles.csv")]) for c in ("16", "1000"))
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def test_explain_prepares_files_as_predict_does(tmp_path, capsys):
    """A subtraction model (DUKE's subtract_column): explain reads each pair through the stored preprocessing, so its
    probabilities are predict's. Before, explain read the first volume alone (and had no --subtract)."""
    ck = save_checkpoint(tmp_path / "ck", "synthetic_breast_mri", ["model.name=vit3d_tiny"],
                         TaskInfo("binary", "volume3d", 1, (1, 16, 16, 8), ["cancer"]),
                         subtract=True, normalize="zscore")
    rng = np.random.default_rng(2)
    pre, post = [], []
    for i in range(2):
        base = rng.normal(100, 30, (18, 14, 8)).astype(np.float32)
        for name, array, kept in (("pre", base + rng.normal(0, 1, base.shape).astype(np.float32), pre),
                                  ("post", base, post)):
            nib.save(nib.Nifti1Image(array, np.diag([0.7, 0.7, 3.0, 1.0])), tmp_path / f"{name}{i}.nii.gz")
            kept.append(str(tmp_path / f"{name}{i}.nii.gz"))
    assert main(["predict", str(ck), *pre, "--subtract", *post, "--out", str(tmp_path / "p.csv")]) == 0
    assert main(["explain", str(ck), *pre, "--subtract", *post, "--out", str(tmp_path / "out")]) == 0
    predicted = [float(r["prob_cancer"]) for r in rows(tmp_path / "p.csv")]
    explained = [float(r["prob_cancer"]) for r in rows(tmp_path / "out" / "summary.csv")]
    np.testing.assert_allclose(explained, predicted, rtol=1e-5)
    assert nib.load(tmp_path / "out" / "pre0.nii.gz").shape == (18, 14, 8)
    capsys.readouterr()
    assert main(["explain", str(ck), *pre, "--out", str(tmp_path / "o2")]) == 2
    assert "give --subtract" in capsys.readouterr().err


def test_bad_inputs_are_one_line_errors(tmp_path, capsys):
    ck = save_checkpoint(tmp_path / "ck", "synthetic_wsi", ["model.name=vitwsi_tiny"],
                         TaskInfo("binary", "bag", 1, (16,), ["tumour"], synthetic=True))
    wrong = tmp_path / "wrong.h5"
    with h5py.File(wrong, "w") as f:
        f["features"] = np.zeros((5, 7), np.float32)
    assert main(["explain", str(ck), str(wrong), "--out", str(tmp_path / "o")]) == 2
    assert "wrong.h5" in capsys.readouterr().err
    assert main(["explain", str(ck), str(tmp_path / "missing.h5"), "--out", str(tmp_path / "o")]) == 2
    assert "no such file" in capsys.readouterr().err
    with pytest.raises(UserError, match="no checkpoint"):
        main(["--debug", "explain", str(tmp_path), str(wrong), "--out", str(tmp_path / "o")])
