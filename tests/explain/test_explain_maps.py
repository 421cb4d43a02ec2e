"""Issue 36's explain maps: attention-MIL's and TransMIL's own attention per tile (``--method attention``), percentile
colouring, ``--slides`` that cannot find a slide, and the 3D preview through the centre of the largest relevance,
with planes named from the affine and drawn at the voxels' physical aspect."""

from __future__ import annotations

import csv
import math

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine_data import save_checkpoint
from medattn.cli import main
from medattn.data.base import TaskInfo
from medattn.explain import METHODS, explain, outputs
from medattn.models import AttentionMIL, create_model
from medattn.models.transmil import TransMIL
from medattn.runtime.trained import load_checkpoint


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def padded_batch(feature_dim: int, lengths=(7, 4), seed: int = 0):
    """Bags of ``lengths`` padded into one batch (B, N, F) with their mask; the padding holds large values."""
    g = torch.Generator().manual_seed(seed)
    n = max(lengths)
    x = torch.full((len(lengths), n, feature_dim), 1e3)
    mask = torch.zeros(len(lengths), n, dtype=torch.bool)
    for i, length in enumerate(lengths):
        x[i, :length] = torch.randn(length, feature_dim, generator=g)
        mask[i, :length] = True
    return x, mask


def standardised(model, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    model.feature_norm.set_statistics(torch.randn(model.feature_dim, generator=g),
                                      torch.rand(model.feature_dim, generator=g) + 0.5)
    return model.eval()


# --- 1. the model's own attention per tile ---------------------------------------------------------------------------


def abmil_reference(model: AttentionMIL, features: torch.Tensor) -> torch.Tensor:
    """a_k of one bag (N, F) in float64 from the module's parameters: standardise, h = ReLU(W x + b),
    s = w^T (tanh(V h) * sigmoid(U h)), a = softmax(s)."""
    p = {k: v.double() for k, v in model.state_dict().items()}
    x = (features.double() - p["feature_norm.mean"]) / p["feature_norm.std"]
    h = torch.relu(x @ p["embed.weight"].T + p["embed.bias"])
    gate = torch.tanh(h @ p["attention_v.weight"].T + p["attention_v.bias"]) * \
        torch.sigmoid(h @ p["attention_u.weight"].T + p["attention_u.bias"])
    return torch.softmax(gate @ p["attention_w.weight"][0], dim=0)


def transmil_reference(model: TransMIL, features: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(the class token's head-mean attention in the last layer per tile (N,), the class token's own share) of one
    bag (N, F) in float64 from the module's parameters: embed, square the bag by repeating its first tiles, class
    token, layer 1, PPEG, layer 2's softmax row of the class token; each repeated copy's weight added to its tile."""
    p = {k: v.double() for k, v in model.state_dict().items()}
    heads = model.layer2.attn.num_heads
    x = (features.double() - p["feature_norm.mean"]) / p["feature_norm.std"]
    h = torch.relu(x @ p["embed.0.weight"].T + p["embed.0.bias"])  # (N, D)
    n, dim = h.shape
    side = math.ceil(math.sqrt(n))
    h = torch.cat([h, h[: side * side - n]])
    x = torch.cat([p["cls_token"][0], h])  # (1 + side^2, D)

    def attention(prefix: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = F.layer_norm(x, (dim,), p[f"{prefix}.norm.weight"], p[f"{prefix}.norm.bias"], eps=1e-5)
        q, k, v = (y @ p[f"{prefix}.attn.qkv.weight"].T).split(dim, dim=-1)  # qkv has no bias (TransMIL's)
        q, k, v = (t.reshape(len(x), heads, dim // heads).transpose(0, 1) for t in (q, k, v))  # (H, T, d)
        weights = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(dim // heads), dim=-1)  # (H, T, T)
        out = (weights @ v).transpose(0, 1).reshape(len(x), dim)
        return x + out @ p[f"{prefix}.attn.proj.weight"].T + p[f"{prefix}.attn.proj.bias"], weights

    x, _ = attention("layer1", x)
    grid = x[1:].T.reshape(dim, side, side)
    grid = grid + sum(F.conv2d(grid[None], p[f"ppeg.convs.{i}.weight"], p[f"ppeg.convs.{i}.bias"], padding=k // 2,
                               groups=dim)[0] for i, k in enumerate((7, 5, 3)))
    x = torch.cat([x[:1], grid.flatten(1).T])
    _, weights = attention("layer2", x)
    row = weights[:, 0].mean(dim=0)  # (1 + side^2,)
    tiles = row[1: n + 1].clone()
    tiles[: side * side - n] += row[n + 1:]
    return tiles, float(row[0])


def test_abmil_attention_map_is_the_models_pooling_weights():
    torch.manual_seed(0)
    model = standardised(AttentionMIL(feature_dim=6, embed_dim=8, attn_dim=5))
    x, mask = padded_batch(6)
    result = explain(model, x, "attention", mask=mask)
    assert result.method == "attention" and result.target is None and result.relevance.dtype == torch.float32
    for i, length in enumerate(mask.sum(1).tolist()):
        torch.testing.assert_close(result.relevance[i, :length].double(), abmil_reference(model, x[i, :length]),
                                   rtol=1e-5, atol=1e-7)
        assert (result.relevance[i, length:] == 0).all()  # padded tiles get 0
    torch.testing.assert_close(result.logits, model(x, mask=mask))


@pytest.mark.parametrize("lengths", [(7, 4), (9, 9), (2, 5)])
def test_transmil_attention_map_is_the_class_tokens_last_row_folded_onto_the_tiles(lengths):
    """7 tiles: a 3 x 3 grid with tiles 0 and 1 repeated, so those two tiles add their copies' weights."""
    torch.manual_seed(0)
    model = standardised(TransMIL(feature_dim=6, embed_dim=16, num_heads=4))
    x, mask = padded_batch(6, lengths, seed=3)
    result = explain(model, x, "attention", mask=mask)
    for i, length in enumerate(lengths):
        expected, own = transmil_reference(model, x[i, :length])
        torch.testing.assert_close(result.relevance[i, :length].double(), expected, rtol=1e-5, atol=1e-7)
        assert float(expected.sum()) + own == pytest.approx(1.0)  # the class token keeps the rest
        assert (result.relevance[i, length:] == 0).all()
    torch.testing.assert_close(result.logits, model(x, mask=mask))


def test_a_bag_transformer_with_an_attention_readout_gives_its_pooling_weights():
    model = create_model("vitwsi_tiny", feature_dim=6, readout="attention").eval()
    x, mask = padded_batch(6)
    result = explain(model, x, "attention", mask=mask)
    torch.testing.assert_close(result.relevance, model.pooling_weights(x, mask).float())
    assert (result.relevance[1, 4:] == 0).all() and torch.allclose(result.relevance.sum(1), torch.ones(2))


def test_the_command_offers_the_registrys_methods_and_scales():
    from medattn.commands import explain as command

    assert set(command.METHOD_CHOICES) == {"auto", *METHODS} and "attention" in METHODS
    assert command.COLOUR_SCALES == outputs.COLOUR_SCALES


def bag_file(path, n=30, dim=16, seed=0, **attrs):
    coords = np.stack(np.meshgrid(np.arange(6), np.arange(5), indexing="ij"), -1).reshape(-1, 2)[:n] * 256
    with h5py.File(path, "w") as f:
        f["features"] = np.random.default_rng(seed).normal(size=(len(coords), dim)).astype(np.float32)
        f["coords"] = coords
        f.attrs.update(attrs)
    return path


@pytest.mark.parametrize("preset", ["abmil_tiny", "transmil_tiny"])
def test_explain_method_attention_on_the_command_line(tmp_path, preset):
    ck = save_checkpoint(tmp_path / "ck", "synthetic_wsi", [f"model.name={preset}", "model.attention=null"],
                         TaskInfo("binary", "bag", 1, (16,), ["tumour"], synthetic=True))
    path = bag_file(tmp_path / "slide.h5")
    assert main(["explain", str(ck), str(path), "--out", str(tmp_path / "out"), "--method", "attention"]) == 0
    model = load_checkpoint(ck).model
    with h5py.File(path) as f:
        features = torch.from_numpy(f["features"][:])[None]
    with torch.no_grad():
        expected = model.tile_attention(features)[0].numpy()
    scores = np.array([float(r["score"]) for r in rows(tmp_path / "out" / "slide_tiles.csv")])
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-8)
    assert (scores >= 0).all() and (tmp_path / "out" / "slide.png").is_file()
    summary = rows(tmp_path / "out" / "summary.csv")[0]
    assert summary["method"] == "attention" and summary["target"] == ""


def test_method_attention_is_refused_in_one_line_for_models_without_it(tmp_path, capsys):
    ck = save_checkpoint(tmp_path / "ck", "synthetic_wsi", ["model.name=vitwsi_tiny"],
                         TaskInfo("binary", "bag", 1, (16,), ["tumour"], synthetic=True))
    path = bag_file(tmp_path / "slide.h5")
    capsys.readouterr()
    assert main(["explain", str(ck), str(path), "--out", str(tmp_path / "out"), "--method", "attention"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--method attention" in err and "WSITransformer" in err
    assert not (tmp_path / "out").exists()  # refused before anything was written


# --- 2. percentile colouring -----------------------------------------------------------------------------------------


def test_percentile_colouring_clips_at_the_documented_percentiles():
    values = np.concatenate([np.linspace(0.0, 1.0, 999), [1000.0]])  # one extreme tile
    assert outputs.colour_range(values) == ("inferno", 0.0, 1000.0)  # the default is unchanged: the whole map
    cmap, low, high = outputs.colour_range(values, "percentile")
    assert outputs.CLIP_PERCENTILES == (1.0, 99.0)
    assert cmap == "inferno" and (low, high) == pytest.approx(tuple(np.percentile(values, [1, 99])))
    assert high < 1.0
    signed = np.concatenate([np.linspace(-1.0, 1.0, 999), [-500.0]])
    assert outputs.colour_range(signed) == ("RdBu_r", -500.0, 500.0)
    cmap, low, high = outputs.colour_range(signed, "percentile")
    bound = np.percentile(np.abs(signed), 99)
    assert cmap == "RdBu_r" and (low, high) == pytest.approx((-bound, bound)) and bound < 1.0
    constant = np.full(10, 0.3)  # nothing to clip: the full range
    assert outputs.colour_range(constant, "percentile") == outputs.colour_range(constant)


def test_explain_colour_scale_percentile_changes_the_picture(tmp_path):
    ck = save_checkpoint(tmp_path / "ck", "synthetic_wsi", ["model.name=abmil_tiny", "model.attention=null"],
                         TaskInfo("binary", "bag", 1, (16,), ["tumour"]))
    path = tmp_path / "slide.h5"
    bag_file(path)
    with h5py.File(path, "r+") as f:
        f["features"][3] = 40.0  # one extreme tile
    for scale in ("full", "percentile"):
        assert main(["explain", str(ck), str(path), "--out", str(tmp_path / scale), "--method", "attention",
                     "--colour-scale", scale]) == 0
    full, clipped = (np.asarray(outputs.Image.open(tmp_path / s / "slide.png")) for s in ("full", "percentile"))
    assert full.shape == clipped.shape and (full != clipped).any()


# --- 3. --slides that cannot find a slide ----------------------------------------------------------------------------


def test_slides_folder_that_does_not_exist_is_refused(tmp_path, capsys):
    ck = save_checkpoint(tmp_path / "ck", "synthetic_wsi", ["model.name=vitwsi_tiny"],
                         TaskInfo("binary", "bag", 1, (16,), ["tumour"]))
    path = bag_file(tmp_path / "a.h5", slide="a.tif", patch_size_level0=256)
    capsys.readouterr()
    assert main(["explain", str(ck), str(path), "--out", str(tmp_path / "out"),
                 "--slides", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nowhere" in err and "no such folder" in err
    assert not (tmp_path / "out").exists()
    (tmp_path / "slides").mkdir()  # a folder without the one bag's slide: refused too
    assert main(["explain", str(ck), str(path), "--out", str(tmp_path / "out"), "--slides",
                 str(tmp_path / "slides")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "a.tif is not in" in err and not (tmp_path / "out").exists()


def test_several_bags_warn_per_missing_slide_and_count_them(tmp_path, capsys):
    ck = save_checkpoint(tmp_path / "ck", "synthetic_wsi", ["model.name=vitwsi_tiny"],
                         TaskInfo("binary", "bag", 1, (16,), ["tumour"]))
    bags = [bag_file(tmp_path / f"{name}.h5", seed=i, slide=f"{name}.tif", patch_size_level0=256)
            for i, name in enumerate(("a", "b"))]
    (tmp_path / "slides").mkdir()
    capsys.readouterr()
    assert main(["explain", str(ck), *map(str, bags), "--out", str(tmp_path / "out"), "--slides",
                 str(tmp_path / "slides")]) == 0
    printed = capsys.readouterr()
    warnings = [line for line in printed.err.splitlines() if "warning" in line]
    assert len(warnings) == 2 and "a.tif is not in" in warnings[0] and "b.tif is not in" in warnings[1]
    assert "0 of 2 bag map(s) drawn on their slide, 2 slide(s) not found" in printed.out
    assert (tmp_path / "out" / "a.png").is_file() and (tmp_path / "out" / "b.png").is_file()


# --- 4. the 3D preview -----------------------------------------------------------------------------------------------


def test_preview_goes_through_the_centre_of_a_plateau_of_tied_maxima():
    """Before, argmax took the first of the tied voxels: panels at the plateau's corner (here (5, 5, 5)), and at
    slice 0 for a map that is constant."""
    heat = np.zeros((40, 36, 30), np.float32)
    heat[5:36, 5:32, 5:26] = 2.0  # a plateau of tied maxima, away from the edge, centre (20, 18, 15)
    assert [cut.index for cut in outputs.preview_cuts(heat)] == [20, 18, 15]
    assert outputs.preview_centre(np.ones((9, 7, 5))) == (4, 3, 2)
    box = np.zeros((30, 24, 16))
    box[10:17, 4:11, 2:9] = -1.0  # the largest |relevance|, off-centre, odd sides
    assert outputs.preview_centre(box) == (13, 7, 5)


def test_preview_planes_are_named_from_the_affine_and_keep_the_physical_aspect():
    heat = np.random.default_rng(0).random((10, 12, 8))
    ras = outputs.preview_cuts(heat, np.diag([0.7, 0.7, 3.0, 1.0]))
    assert [(c.plane, c.axis) for c in ras] == [("sagittal", 0), ("coronal", 1), ("axial", 2)]
    assert [c.aspect for c in ras] == pytest.approx([3 / 0.7, 3 / 0.7, 1.0])
    # axis 0 runs superior (3 mm), axis 1 towards the patient's left (0.7 mm), axis 2 anterior (0.8 mm)
    permuted = np.array([[0, -0.7, 0, 0], [0, 0, 0.8, 0], [3.0, 0, 0, 0], [0, 0, 0, 1]])
    cuts = {c.plane: c for c in outputs.preview_cuts(heat, permuted)}
    assert (cuts["sagittal"].axis, cuts["coronal"].axis, cuts["axial"].axis) == (1, 2, 0)
    axial = cuts["axial"]  # R to the right (axis 1, flipped: it runs left), A upwards (axis 2)
    assert (axial.right, axial.up, axial.flipped) == (1, 2, (True, False))
    assert axial.aspect == pytest.approx(0.8 / 0.7) and cuts["sagittal"].aspect == pytest.approx(3.0 / 0.8)
    index = np.arange(10 * 12 * 8).reshape(10, 12, 8)
    panel = axial.take(index)  # rows upwards along axis 2, columns to the right along axis 1 reversed
    assert panel.shape == (8, 12)
    assert panel[0, -1] == index[axial.index, 0, 0] and panel[-1, 0] == index[axial.index, 11, 7]


def test_preview_figure_shows_the_image_beside_the_overlay_at_the_physical_aspect(monkeypatch):
    drawn = {}
    finish = outputs._finish

    def keep(fig, title, synthetic):
        drawn["axes"] = [(a.get_title(), len(a.get_images()), a.get_aspect()) for a in fig.axes if a.get_images()]
        return finish(fig, title, synthetic)

    monkeypatch.setattr(outputs, "_finish", keep)
    heat = np.zeros((12, 12, 6), np.float32)
    heat[4:8, 4:8, 2:4] = 1
    picture = outputs.volume_preview(np.random.default_rng(0).random((12, 12, 6)), heat, "t", "gradxinput",
                                     affine=np.diag([0.7, 0.7, 3.0, 1.0]))
    assert picture.size[0] >= 1000
    titles = [title for title, _, _ in drawn["axes"]]
    assert titles[:3] == ["sagittal (axis 0 = 5): image", "coronal (axis 1 = 5): image", "axial (axis 2 = 2): image"]
    assert titles[3:] == [f"{p}: relevance over the image" for p in ("sagittal", "coronal", "axial")]
    assert [n for _, n, _ in drawn["axes"]] == [1, 1, 1, 2, 2, 2]  # the image alone above, the map over it below
    assert [a for _, _, a in drawn["axes"]] == pytest.approx([3 / 0.7, 3 / 0.7, 1.0] * 2)
