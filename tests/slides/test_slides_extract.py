"""Patch features from SYNTHETIC slides (medattn.slides): extractors (descriptor, ResNet-50 state dicts with
torchvision's names, TorchScript, ONNX), CLAM HDF5 read by the wsi_bags loader, resume, sharding, Macenko,
heatmaps and the extract command."""

import json
import os
import sys
from dataclasses import asdict, replace

import h5py
import numpy as np
import pytest
import torch

pytest.importorskip("openslide")
pytest.importorskip("tifffile")

from medattn.cli import main  # noqa: E402
from medattn.data import build_datasets  # noqa: E402
from medattn.data.readers.bags import read_slide  # noqa: E402
from medattn.errors import UserError  # noqa: E402
from medattn.generators.slides import write_synthetic_cohort  # noqa: E402
from medattn.outputs import OutputFolder  # noqa: E402
from medattn.slides import (  # noqa: E402
    MacenkoNormalizer,
    TileSettings,
    build_extractor,
    draw_heatmap,
    extract_slides,
    fit_stains,
    rank_and_world,
    shard,
    tile_slide,
    write_tiles,
)
from medattn.slides.stain import IO, REFERENCE_STAINS  # noqa: E402

SMALL = TileSettings(patch_um=64, patch_px=32, thumbnail_px=512)


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cohort")
    return write_synthetic_cohort(folder, count=4, shape=(512, 768))


@pytest.fixture(scope="module")
def descriptor():
    return build_extractor("descriptor")


def torchvision_resnet50_shapes() -> dict[str, tuple]:
    """Names and shapes of torchvision's resnet50().state_dict(), written from the architecture."""
    shapes = {}

    def conv(name, out, inp, k):
        shapes[f"{name}.weight"] = (out, inp, k, k)

    def bn(name, c):
        shapes.update({f"{name}.{p}": (c,) for p in ("weight", "bias", "running_mean", "running_var")})
        shapes[f"{name}.num_batches_tracked"] = ()

    conv("conv1", 64, 3, 7)
    bn("bn1", 64)
    inp = 64
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512)), start=1):
        for b in range(blocks):
            p = f"layer{stage}.{b}"
            conv(f"{p}.conv1", width, inp, 1)
            bn(f"{p}.bn1", width)
            conv(f"{p}.conv2", width, width, 3)
            bn(f"{p}.bn2", width)
            conv(f"{p}.conv3", 4 * width, width, 1)
            bn(f"{p}.bn3", 4 * width)
            if b == 0:
                conv(f"{p}.downsample.0", 4 * width, inp, 1)
                bn(f"{p}.downsample.1", 4 * width)
            inp = 4 * width
    shapes["fc.weight"], shapes["fc.bias"] = (1000, 2048), (1000,)
    return shapes


def random_state_dict(shapes: dict) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    state = {}
    for name, shape in shapes.items():
        if name.endswith("num_batches_tracked"):
            state[name] = torch.tensor(7)
        elif name.endswith("running_var"):
            state[name] = torch.rand(shape, generator=gen) + 0.5
        else:
            state[name] = 0.05 * torch.randn(shape, generator=gen)
    return state


def patches(n=2, px=64, seed=0) -> torch.Tensor:
    return torch.randint(0, 256, (n, px, px, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def test_resnet50_loads_torchvision_names_strictly(tmp_path):
    shapes = torchvision_resnet50_shapes()
    assert len(shapes) == 320  # torchvision's resnet50 state dict holds 320 tensors
    state = random_state_dict(shapes)
    torch.save(state, tmp_path / "imagenet.pth")
    extractor = build_extractor(str(tmp_path / "imagenet.pth"))  # kind detected: a state dict
    assert extractor.name == "resnet50:imagenet.pth"
    model = extractor.forward
    loaded = model.state_dict()
    assert set(loaded) == set(shapes) - {"fc.weight", "fc.bias"}
    assert all(torch.equal(loaded[k], state[k]) for k in loaded)
    out = extractor(patches())
    assert out.shape == (2, 2048) and out.dtype == torch.float32 and torch.isfinite(out).all()
    # RetCCL-style: no fc, wrapped in {"state_dict": ...} with DataParallel's "module." prefix
    retccl = {"state_dict": {f"module.{k}": v for k, v in state.items() if not k.startswith("fc.")}}
    torch.save(retccl, tmp_path / "retccl.pth")
    assert torch.allclose(build_extractor(f"resnet50:{tmp_path / 'retccl.pth'}")(patches()), out)


def test_resnet50_refuses_other_state_dicts(tmp_path):
    state = random_state_dict(torchvision_resnet50_shapes())
    del state["layer4.2.bn3.running_var"]
    torch.save(state, tmp_path / "missing.pth")
    with pytest.raises(UserError, match=r"missing\.pth: not a torchvision ResNet-50 .*layer4\.2\.bn3\.running_var"):
        build_extractor(str(tmp_path / "missing.pth"))
    state = random_state_dict(torchvision_resnet50_shapes())
    state["layer1.0.conv1.weight"] = torch.zeros(32, 64, 1, 1)
    torch.save(state, tmp_path / "shape.pth")
    with pytest.raises(UserError, match=r"layer1\.0\.conv1\.weight has shape \(32, 64, 1, 1\)"):
        build_extractor(str(tmp_path / "shape.pth"))
    (tmp_path / "junk.pth").write_bytes(b"junk")
    with pytest.raises(UserError, match=r"junk\.pth: cannot load a state dict"):
        build_extractor(str(tmp_path / "junk.pth"))


class Pooled(torch.nn.Module):
    def __init__(self, flat: bool = True):
        super().__init__()
        self.conv, self.flat = torch.nn.Conv2d(3, 8, 3), flat

    def forward(self, x):
        y = self.conv(x)
        return y.mean(dim=(2, 3)) if self.flat else y


def test_torchscript_extractor_and_a_non_2d_output(tmp_path):
    torch.jit.script(Pooled()).save(str(tmp_path / "pooled.pt"))
    extractor = build_extractor(str(tmp_path / "pooled.pt"))
    assert extractor.name == "torchscript:pooled.pt"
    assert extractor(patches(3, 32)).shape == (3, 8)
    torch.jit.script(Pooled(flat=False)).save(str(tmp_path / "maps.pt"))
    with pytest.raises(UserError, match=r"torchscript:maps\.pt: output must be \(batch, features\)"):
        build_extractor(str(tmp_path / "maps.pt"))(patches(3, 32))


def test_onnx_extractor(tmp_path):
    pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("GlobalAveragePool", ["x"], ["pooled"]), helper.make_node("Flatten", ["pooled"], ["y"])],
        "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "pool.onnx")
    extractor = build_extractor(str(tmp_path / "pool.onnx"), imagenet=False)
    x = patches(2, 16)
    assert torch.allclose(extractor(x), x.float().mean(dim=(1, 2)) / 255, atol=1e-6)
    (tmp_path / "bad.onnx").write_bytes(b"not onnx")
    with pytest.raises(UserError, match=r"bad\.onnx: not an ONNX model"):
        build_extractor(str(tmp_path / "bad.onnx"))


class TinyTimmNet(torch.nn.Module):
    """A stand-in for a timm model: conv -> global pool -> ``head`` (Identity when num_classes=0)."""

    pretrained_cfg = {"classifier": "head"}

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.norm = torch.nn.BatchNorm2d(4)
        self.head = torch.nn.Linear(4, num_classes) if num_classes else torch.nn.Identity()

    def forward(self, x):
        return self.head(self.norm(self.conv(x)).mean(dim=(2, 3)))


@pytest.fixture
def fake_timm(monkeypatch):
    """A module named ``timm`` whose create_model records its arguments (timm itself is not installed here)."""
    import types

    module, calls = types.ModuleType("timm"), []

    def create_model(name, pretrained=True, num_classes=1000, **kwargs):
        calls.append((name, pretrained, num_classes, kwargs))
        if name != "tiny_net":
            raise RuntimeError(f"Unknown model ({name})")
        return TinyTimmNet(num_classes)

    module.create_model = create_model
    monkeypatch.setitem(sys.modules, "timm", module)
    return calls


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_timm_extractor_creates_the_model_without_download_and_loads_the_file(fake_timm, tmp_path, suffix):
    trained = TinyTimmNet(num_classes=10)  # a checkpoint with its classifier, as timm's weights come
    torch.nn.init.normal_(trained.conv.weight)
    trained.norm.running_mean.fill_(0.3)
    state = {f"module.{k}": v for k, v in trained.state_dict().items()}  # DataParallel's prefix too
    path = tmp_path / f"weights{suffix}"
    if suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(state, path)
    else:
        torch.save({"state_dict": state}, path)
    extractor = build_extractor(f"timm:tiny_net:{path}")
    assert fake_timm == [("tiny_net", False, 0, {})]  # pretrained=False: timm downloads nothing
    assert extractor.name == f"timm:tiny_net:{path.name}"
    assert all(torch.equal(v, trained.state_dict()[k]) for k, v in extractor.forward.state_dict().items())
    x = patches(3, 16)
    trained.head = torch.nn.Identity()
    with torch.no_grad():
        expected = trained.eval()(extractor.prepare(x))
    assert torch.allclose(extractor(x), expected, atol=1e-6) and expected.shape == (3, 4)


def test_timm_extractor_errors(fake_timm, tmp_path, monkeypatch):
    torch.save(TinyTimmNet(num_classes=0).state_dict(), tmp_path / "ok.pth")
    with pytest.raises(UserError, match=r"timm cannot create 'vit_nope'.*Unknown model"):
        build_extractor(f"timm:vit_nope:{tmp_path / 'ok.pth'}")
    state = TinyTimmNet(num_classes=0).state_dict()
    state["conv.weight"] = torch.zeros(8, 3, 3, 3)
    torch.save(state, tmp_path / "other.pth")
    with pytest.raises(UserError, match=r"other\.pth: not weights of timm's tiny_net .*1 of another shape"):
        build_extractor(f"timm:tiny_net:{tmp_path / 'other.pth'}")
    with pytest.raises(UserError, match="timm:MODEL_NAME:WEIGHTS_FILE"):
        build_extractor(f"timm:{tmp_path / 'ok.pth'}")
    monkeypatch.setitem(sys.modules, "timm", None)  # what `import timm` meets where it is not installed
    with pytest.raises(UserError, match=r"timm is not installed \(pip install timm\)"):
        build_extractor(f"timm:tiny_net:{tmp_path / 'ok.pth'}")


def test_unknown_extractor_names_the_choices():
    with pytest.raises(UserError, match="no such file.*descriptor, resnet50:FILE"):
        build_extractor("retccl")


def test_descriptor_tells_white_sharp_and_blurry_apart(descriptor):
    from scipy import ndimage

    rng = np.random.default_rng(0)
    sharp = rng.integers(0, 255, (32, 32, 3)).astype(np.uint8)
    blurry = ndimage.gaussian_filter(sharp.astype(np.float32), (3, 3, 0)).astype(np.uint8)
    white = np.full((32, 32, 3), 245, np.uint8)
    features = descriptor(torch.from_numpy(np.stack([sharp, blurry, white])))
    assert features.shape == (3, 32) and torch.isfinite(features).all()
    assert features[2, 30] == 1.0 and features[0, 30] < 0.1  # white fraction
    laplacian_low_bins = features[:, 20:23].sum(1)  # |Laplacian| below 0.01: flat
    assert laplacian_low_bins[1] > laplacian_low_bins[0] + 0.3 and laplacian_low_bins[2] == 1.0


def test_features_load_through_the_wsi_bags_loader(cohort, descriptor, tmp_path):
    out = tmp_path / "features"
    results = extract_slides(cohort, out, descriptor, SMALL)
    assert [r.status for r in results] == ["done"] * 4
    with h5py.File(out / "slide_001.h5") as f:
        assert f["features"].shape[1] == 32 and f["coords"].dtype == np.int64
        attrs = {k: v.tolist() if hasattr(v, "tolist") else v for k, v in f.attrs.items()}
        assert json.loads(attrs["slide_identity"])["width"] == 768  # tests/slides/test_slide_identity.py
        assert attrs | {"slide": "-", "slide_identity": "-"} == {
                                          "patch_size_um": 64.0, "patch_size_px": 32, "mpp": 1.0, "slide_identity": "-",
                                          "patch_size_level0": 64, "extractor": "descriptor", "stain_norm": "none",
                                          "slide": "-", "tile_settings": json.dumps(asdict(SMALL), sort_keys=True),
                                          "extractor_input_px": 0, "extractor_mean": [-1.0] * 3,
                                          "extractor_std": [-1.0] * 3, "extractor_mpp": -1.0,  # -1: none
                                          "synthetic": True}  # a slide of write_synthetic_cohort
        assert len(f["coords"]) == results[1].kept
    features, coords = read_slide(out / "slide_001.h5")
    assert features.shape == (results[1].kept, 32) and (coords % 64 == 0).all()
    folder = cohort[0].parent
    bundle = build_datasets({"kind": "wsi_bags", "feature_dir": str(out), "label_columns": ["TUMOUR"],
                             "slide_table": str(folder / "slide_table.csv"),
                             "clinical_table": str(folder / "clinical_table.csv"),
                             "val_fraction": 0.0, "test_fraction": 0.0})
    assert len(bundle.train) == 4 and bundle.train[0]["input"].shape[1] == 32


def test_extract_from_tiles_reads_the_kept_patches(cohort, descriptor, tmp_path):
    tiles = tile_slide(cohort[0], SMALL)
    write_tiles(tiles, tmp_path / "tiles")
    extract_slides(cohort[:1], tmp_path / "f", descriptor, SMALL, tiles_dir=tmp_path / "tiles")
    direct = tmp_path / "direct"
    extract_slides(cohort[:1], direct, descriptor, SMALL)
    a, b = read_slide(tmp_path / "f" / "slide_000.h5"), read_slide(direct / "slide_000.h5")
    assert torch.equal(a[1], torch.from_numpy(tiles.kept).float()) and torch.equal(a[1], b[1])
    assert torch.allclose(a[0], b[0])
    with pytest.raises(UserError, match="not 32 um"):
        extract_slides(cohort[:1], tmp_path / "g", descriptor, TileSettings(patch_um=32, patch_px=32),
                       tiles_dir=tmp_path / "tiles")


def test_resume_skips_done_slides_and_redoes_a_broken_one(cohort, descriptor, tmp_path):
    out = tmp_path / "features"
    extract_slides(cohort[:2], out, descriptor, SMALL)
    first, second = out / "slide_000.h5", out / "slide_001.h5"
    first.write_bytes(first.read_bytes()[:200])  # a truncated file under the final name
    (out / ".slide_002.h5.partial-1").write_bytes(b"half")  # a crashed writer's leftover
    with h5py.File(second, "a") as f:  # same settings, but 10 rows declared and only the first stored
        del f["features"]
        f.create_dataset("features", shape=(10, 32), chunks=(1, 32), dtype="f4")[0] = 1.0
        del f["coords"]
        f["coords"] = np.zeros((10, 2), np.int64)
    extract_slides(cohort[2:3], out, descriptor, SMALL)
    stamp = (out / "slide_002.h5").stat().st_mtime_ns
    results = extract_slides(cohort[:3], out, descriptor, SMALL)
    assert [r.status for r in results] == ["done", "done", "skipped"]
    assert (out / "slide_002.h5").stat().st_mtime_ns == stamp
    assert read_slide(first)[0].shape[1] == 32 and len(read_slide(second)[0]) == results[1].kept
    with pytest.raises(UserError, match=r"slide_000\.h5: exists with other settings \(extractor=descriptor\)"):
        torch.jit.script(Pooled()).save(str(tmp_path / "pooled.pt"))
        extract_slides(cohort[:1], out, build_extractor(str(tmp_path / "pooled.pt")), SMALL)
    assert [r.status for r in extract_slides(cohort[:1], out, descriptor, SMALL, overwrite=True)] == ["done"]
    # the filters chose other patches: refused, naming the option (the file records the settings it was made with)
    with pytest.raises(UserError, match=r"slide_000\.h5: exists with other settings \(--max-white 0\.5 -> 0\.3\)"):
        extract_slides(cohort[:1], out, descriptor, replace(SMALL, max_white=0.3))


def test_a_failed_write_leaves_nothing_under_the_final_name(tmp_path):
    def write(path):
        path.write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    with pytest.raises(UserError, match="No space left"), OutputFolder(tmp_path).write("x.h5") as tmp:
        write(tmp)
    assert list(tmp_path.iterdir()) == []


def test_bad_slides_are_skipped_with_skip_bad(cohort, descriptor, tmp_path):
    broken = tmp_path / "broken.tif"
    broken.write_bytes(cohort[0].read_bytes()[:5000])  # truncated TIFF
    with pytest.raises(UserError, match=r"broken\.tif"):
        extract_slides([broken], tmp_path / "f", descriptor, SMALL)
    results = {r.slide.name: r for r in extract_slides([broken, cohort[1]], tmp_path / "f", descriptor, SMALL,
                                                          skip_bad=True)}
    assert results["broken.tif"].status == "failed" and "broken.tif" in results["broken.tif"].message
    assert results["slide_001.tif"].status == "done"
    assert sorted(p.name for p in (tmp_path / "f").iterdir()) == ["slide_001.h5"]


def test_sharding_is_a_disjoint_cover():
    slides = [f"s{i}" for i in range(10)]
    shards = [shard(slides, r, 3) for r in range(3)]
    assert shards[0] == ["s0", "s3", "s6", "s9"] and sorted(sum(shards, [])) == sorted(slides)
    assert rank_and_world({}) == (0, 1) and rank_and_world({"RANK": "2", "WORLD_SIZE": "4"}) == (2, 4)
    for env in ({"RANK": "4", "WORLD_SIZE": "4"}, {"RANK": "x"}):
        with pytest.raises(UserError, match="RANK"):
            rank_and_world(env)


def test_sharded_ranks_write_their_own_slides(cohort, descriptor, tmp_path):
    for rank in range(2):
        results = extract_slides(cohort, tmp_path, descriptor, SMALL, rank=rank, world=2)
        assert [r.slide.name for r in results] == [p.name for p in cohort[rank::2]]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{p.stem}.h5" for p in cohort]


def render_stains(stains: np.ndarray, concentrations: np.ndarray) -> np.ndarray:
    """Beer-Lambert: RGB = Io exp(-S C) - 1, the inverse of the OD used by Macenko. -> (N, 3) uint8."""
    return np.clip(IO * np.exp(-stains @ concentrations).T - 1, 0, 255).round().astype(np.uint8)


def test_macenko_recovers_the_stains_and_normalises_them_away():
    rng = np.random.default_rng(0)
    concentrations = np.stack([rng.gamma(2.0, 0.4, 20000), rng.gamma(2.0, 0.25, 20000)])  # (2, N) H, E
    other = np.array([[0.65, 0.07], [0.70, 0.99], [0.29, 0.11]])
    other /= np.linalg.norm(other, axis=0)
    pixels_a, pixels_b = render_stains(REFERENCE_STAINS, concentrations), render_stains(other, concentrations)
    stains, _ = fit_stains(pixels_b)
    cosines = (stains * other).sum(0)
    assert (cosines > 0.98).all()  # H first, then E, each close to the truth
    a = MacenkoNormalizer().fit(pixels_a)(pixels_a[None])[0].astype(float)
    b = MacenkoNormalizer().fit(pixels_b)(pixels_b[None])[0].astype(float)
    assert np.abs(a - b).mean() < np.abs(pixels_a.astype(float) - pixels_b).mean() / 4


def test_heatmap_colours_the_tiles_and_nothing_else():
    import matplotlib

    thumb = np.full((60, 80, 3), 200, np.uint8)
    image = np.asarray(draw_heatmap(thumb, (4.0, 4.0), np.array([[0, 0], [160, 120]]), np.array([1.0, 0.0]),
                                    size0=40, alpha=1.0, cmap="viridis", outline=False))
    high, low = (np.round(np.array(matplotlib.colormaps["viridis"](v)[:3]) * 255) for v in (1.0, 0.0))
    assert (image[:10, :10] == high).all() and (image[30:40, 40:50] == low).all()
    untouched = np.ones((60, 80), bool)
    untouched[:10, :10] = untouched[30:40, 40:50] = False
    assert (image[untouched] == 200).all()
    with pytest.raises(UserError, match="align"):
        draw_heatmap(thumb, (4.0, 4.0), np.zeros((2, 2)), np.zeros(3), size0=40)


def test_extract_command(cohort, tmp_path, capsys):
    folder = cohort[0].parent
    argv = ["wsi", "extract", str(folder), "--out", str(tmp_path / "f"), "--patch-um", "64", "--patch-px", "32",
            "--thumbnail-px", "512", "--no-progress", "--stain-norm", "macenko", "--num-workers", "0"]
    assert main(argv) == 0
    assert "4 done" in capsys.readouterr().out
    with h5py.File(tmp_path / "f" / "slide_000.h5") as f:
        assert f.attrs["stain_norm"] == "macenko"
    assert main(argv) == 0  # same settings: nothing to do
    assert "4 already done" in capsys.readouterr().out
    assert main([*argv[:-4], "--no-progress"]) == 2  # other stain settings on the same folder: refused
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exists with other settings" in err[0]
    assert main(["wsi", "extract", str(folder), "--out", str(tmp_path / "g"), "--extractor", "nope.pt"]) == 2
    assert "nope.pt" in capsys.readouterr().err


@pytest.mark.skipif(not hasattr(os, "fork"), reason="DataLoader workers by fork")
def test_workers_read_the_same_patches(cohort, descriptor, tmp_path):
    extract_slides(cohort[:1], tmp_path / "a", descriptor, SMALL, num_workers=0)
    extract_slides(cohort[:1], tmp_path / "b", descriptor, SMALL, num_workers=2, batch_size=8)
    a, b = read_slide(tmp_path / "a" / "slide_000.h5"), read_slide(tmp_path / "b" / "slide_000.h5")
    assert torch.equal(a[1], b[1]) and torch.allclose(a[0], b[0])


def test_a_corrupt_tile_is_one_line_naming_the_slide_even_from_workers(cohort, tmp_path, capsys):
    import tifffile

    data = bytearray(cohort[1].read_bytes())
    with tifffile.TiffFile(cohort[1]) as tif:  # zero the compressed tiles of level 0; levels 1 and 2 stay whole
        for offset, count in zip(tif.pages[0].dataoffsets, tif.pages[0].databytecounts):
            data[offset:offset + count] = bytes(count)
    (tmp_path / "corrupt.tif").write_bytes(data)
    argv = ["wsi", "extract", str(tmp_path / "corrupt.tif"), "--out", str(tmp_path / "f"), "--patch-um", "64",
            "--patch-px", "32", "--thumbnail-px", "192", "--num-workers", "1", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "corrupt.tif at (" in err[0] and "cannot read the slide" in err[0]
    assert not (tmp_path / "f" / "corrupt.h5").exists()
