"""Generated over every registered data kind and model family: a file prepared by ``predict`` is the tensor
training built, and ``predict``'s probabilities are ``eval``'s.

For each data kind a few cases are built in its publisher's layout (table kinds: the files the table lists;
synthetic kinds: their generator's raw sample written as PNG, NIfTI or CLAM HDF5) and the description the
builder returned (``DataBundle.preprocessing``) prepares them again, as ``medattn predict`` does. For each model
family that fits the kind (the smallest preset of each model class and dimension), a checkpoint is written as
training writes it and opened as ``predict`` opens it; its probabilities on the files must equal those of the
evaluation path on the builder's own test tensors. A kind without a writer here, or a family without a place
in :data:`FAMILY_FITS`, fails the test: new kinds and families join it by construction.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import Subset

from medattn.catalogue import UNLABELLED_KINDS
from medattn.config import load_config
from medattn.data import available_data_kinds, build_datasets, collate
from medattn.data.preprocessing import inference_dataset, stated_task
from medattn.deploy.predict import predict_files
from medattn.deploy.runtime import open_model
from medattn.errors import UserError
from medattn.models import takes_attention
from medattn.models.presets import PRESETS
from medattn.runtime import checkpoint
from medattn.runtime.build import build_model
from medattn.runtime.predictor import Predictor
from medattn.train.objectives import objective_for
from medattn.train.predictions import predict
from medattn.train.sampling import make_loader
from writers import write_bag_cohort, write_csv, write_h5, write_nifti, write_pillow

pytest.importorskip("nibabel")
pytest.importorskip("h5py")

CASES = 2  # test cases compared per kind
IMAGE, VOLUME = (32, 32), (32, 32, 32)

#: model class name -> (input kind it takes, whether it segments). Spatial dimensions come from the preset.
FAMILY_FITS = {
    "VisionTransformer": ("image", False), "ResNet": ("image", False), "SwinClassifier": ("image", False),
    "PixelTransformer": ("image2d", False), "WSITransformer": ("bag", False), "AttentionMIL": ("bag", False),
    "TransMIL": ("bag", False), "UNet3D": ("volume3d", True), "DilatedFCN3D": ("volume3d", True),
    "SegmentationViT": ("image2d", True),
}
SUFFIX_ORDER = ("_tiny", "_small", "")


def _families() -> dict[tuple[str, int | None], str]:
    """(class name, spatial dims) -> its smallest preset (``_tiny`` before ``_small`` before the base name)."""
    chosen: dict[tuple[str, int | None], str] = {}
    for name, (cls, kwargs) in PRESETS.items():
        key = (cls.__name__, kwargs.get("spatial_dims"))
        rank = next(i for i, s in enumerate(SUFFIX_ORDER) if name.endswith(s))
        best = chosen.get(key)
        if best is None or (rank, len(name)) < (next(i for i, s in enumerate(SUFFIX_ORDER) if best.endswith(s)),
                                                len(best)):
            chosen[key] = name
    return chosen


FAMILIES = _families()


def _fits(family: tuple[str, int | None], input_kind: str, segmentation: bool) -> bool:
    cls_name, dims = family
    takes, segments = FAMILY_FITS[cls_name]
    if takes == "image":
        takes = {2: "image2d", 3: "volume3d"}[dims]
    return takes == input_kind and segments == segmentation


# --- each kind: a data config on files it writes, and the files of its first test cases --------------------------

def _table_images(root: Path) -> tuple[dict, callable]:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(12):
        write_pillow(root / f"img{i}.png", rng.integers(0, 256, (40, 36), dtype=np.uint8))
        rows.append([f"img{i}.png", i % 2, ["train", "val", "test"][i % 3]])
    csv = write_csv(root / "table.csv", ["path", "label", "split"], rows)
    cfg = {"kind": "image_table", "csv": str(csv), "label_columns": ["label"], "split_column": "split",
           "image_size": list(IMAGE), "in_chans": 1, "augment": False}
    return cfg, lambda bundle, i: bundle.test.records[i].paths


def _table_volumes(root: Path) -> tuple[dict, callable]:
    rng = np.random.default_rng(1)
    rows = []
    for i in range(12):
        write_nifti(root / f"v{i}.nii.gz", rng.normal(100, 20, (36, 30, 34)), spacing=(1.0, 1.2, 2.0))
        rows.append([f"v{i}.nii.gz", i % 2, ["train", "val", "test"][i % 3]])
    csv = write_csv(root / "table.csv", ["path", "label", "split"], rows)
    cfg = {"kind": "volume_table", "csv": str(csv), "label_columns": ["label"], "split_column": "split",
           "target_size": list(VOLUME), "target_spacing": [1.0, 1.0, 1.5], "augment": False}
    return cfg, lambda bundle, i: bundle.test.records[i].paths


def _pairs(root: Path, kind: str) -> tuple[dict, callable]:
    rng = np.random.default_rng(2)
    rows = []
    for i in range(9):
        label = np.zeros((36, 30, 34))
        label[8:20, 6:18, 10:24] = 1
        write_nifti(root / f"img{i}.nii.gz", rng.normal(50, 10, label.shape) + 30 * label)
        write_nifti(root / f"lab{i}.nii.gz", label)
        rows.append([f"img{i}.nii.gz", f"lab{i}.nii.gz", ["train", "val", "test"][i % 3]])
    csv = write_csv(root / "pairs.csv", ["image", "label", "split"], rows)
    cfg = {"kind": kind, "csv": str(csv), "split_column": "split", "num_classes": 2}
    if kind == "nifti_slices":
        cfg["slice_size"] = list(IMAGE)
        return cfg, lambda bundle, i: (root / bundle.test[i]["id"],)
    cfg["target_size"] = list(VOLUME)
    return cfg, lambda bundle, i: bundle.test.records[i].paths[:1]


def _bags(root: Path) -> tuple[dict, callable]:
    clinical = [[i % 2, ["train", "val", "test"][i % 3]] for i in range(12)]
    cfg = {**write_bag_cohort(root, clinical, ["label", "split"], tiles=lambda i: 7 + i, seed=3),
           "label_columns": ["label"], "split_column": "split"}
    return cfg, lambda bundle, i: bundle.test.records[i].paths


def _medmnist(root: Path) -> tuple[dict, callable]:
    rng = np.random.default_rng(4)
    arrays = {f"{s}_images": rng.integers(0, 256, (6, 28, 28), dtype=np.uint8) for s in ("train", "val", "test")}
    arrays |= {f"{s}_labels": np.arange(6)[:, None] % 2 for s in ("train", "val", "test")}
    np.savez(root / "m.npz", **arrays)
    return {"kind": "medmnist", "path": str(root / "m.npz"), "augment": False}, None


def _synthetic_cxr(root: Path) -> tuple[dict, callable]:
    from medattn.generators.synthetic_cxr import make_sample

    def files(bundle, i):  # the generator's raw [0, 1] image as an 8-bit PNG (read back as value / 255)
        raw = make_sample(IMAGE[0], 0, "test", i)
        assert raw["id"] == bundle.test[i]["id"]
        path = root / f"cxr{i}.png"
        write_pillow(path, np.round(raw["input"][0].numpy() * 255).astype(np.uint8))
        return (path,)

    return {"kind": "synthetic_cxr", "image_size": IMAGE[0], "num_samples": [8, 4, 4], "augment": False}, files


def _synthetic_breast_mri(root: Path) -> tuple[dict, callable]:
    from medattn.generators.synthetic_breast_mri import make_sample

    def files(bundle, i):
        raw = make_sample(VOLUME, 0, "test", i)
        assert raw["id"] == bundle.test[i]["id"]
        return (write_nifti(root / f"side{i}.nii.gz", raw["input"][0].numpy()),)

    return {"kind": "synthetic_breast_mri", "volume_size": list(VOLUME), "num_samples": [8, 4, 4],
            "augment": False}, files


def _synthetic_vertebrae(root: Path) -> tuple[dict, callable]:
    from medattn.generators.synthetic_vertebrae import make_sample

    def files(bundle, i):
        raw = make_sample(0, "test", i, size=VOLUME, num_blobs=2)
        return (write_nifti(root / f"spine{i}.nii.gz", raw["input"][0].numpy()),)

    return {"kind": "synthetic_vertebrae", "volume_size": list(VOLUME), "num_blobs": 2, "num_samples": [4, 2, 2]}, files


def _synthetic_wsi(root: Path) -> tuple[dict, callable]:
    def files(bundle, i):
        sample = bundle.test[i]
        return (write_h5(root / f"slide{i}.h5", sample["input"].numpy(), sample["coords"].numpy()),)

    return {"kind": "synthetic_wsi", "num_instances": [20, 40], "feature_dim": 16, "num_samples": [8, 4, 4]}, files


def _synthetic_mri_slices(root: Path) -> tuple[dict, callable]:
    from medattn.data.seeded import item_seed
    from medattn.generators.synthetic_mri_slices import NAME, make_phantom

    def files(bundle, i):  # the raw phantom, not z-scored: the description must say how the builder normalised
        image, _ = make_phantom(item_seed(NAME, 0, "test", i), (*IMAGE, 12))
        return (write_nifti(root / f"phantom{i}.nii.gz", image.numpy()),)

    return {"kind": "synthetic_mri_slices", "volume_size": [*IMAGE, 12], "num_patients": [2, 2, 2]}, files


KINDS = {
    "image_table": _table_images, "volume_table": _table_volumes, "wsi_bags": _bags, "medmnist": _medmnist,
    "nifti_segmentation": lambda root: _pairs(root, "nifti_segmentation"),
    "nifti_slices": lambda root: _pairs(root, "nifti_slices"),
    "synthetic_cxr": _synthetic_cxr, "synthetic_breast_mri": _synthetic_breast_mri,
    "synthetic_vertebrae": _synthetic_vertebrae, "synthetic_wsi": _synthetic_wsi,
    "synthetic_mri_slices": _synthetic_mri_slices,
}
TOLERANCE = {"synthetic_cxr": 0.5 / 255 / 0.5 + 1e-6}  # an 8-bit PNG rounds the generator's floats (std 0.5)
PROBABILITY_TOLERANCE = {"synthetic_cxr": 5e-3}  # ... and that rounding reaches the probabilities


def test_every_kind_and_family_is_covered():
    # the unlabelled kinds (the diffusion stages' volumes) make no model that predict opens
    assert sorted(KINDS) == [kind for kind in available_data_kinds() if kind not in UNLABELLED_KINDS]
    assert {cls for cls, _ in FAMILIES} <= set(FAMILY_FITS), "a new model class needs its place in FAMILY_FITS"


@pytest.fixture(scope="module")
def kinds(tmp_path_factory) -> dict:
    """kind -> (config, bundle, files of test case i)."""
    built = {}
    for kind, make in KINDS.items():
        root = tmp_path_factory.mktemp(kind)
        cfg, files = make(root)
        built[kind] = (cfg, build_datasets(cfg, seed=0), files)
    return built


def _inputs(kind: str, kinds: dict) -> list[tuple[Path, ...]]:
    _, bundle, files = kinds[kind]
    return [files(bundle, i) for i in range(CASES)]


@pytest.mark.parametrize("kind", sorted(k for k in KINDS if k != "medmnist"))
def test_a_file_prepared_for_predict_is_the_tensor_training_built(kind, kinds):
    _, bundle, _ = kinds[kind]
    prep = bundle.preprocessing
    assert prep is not None and stated_task(prep) == bundle.task
    dataset = inference_dataset(prep, _inputs(kind, kinds))
    for i in range(CASES):
        trained, predicted = bundle.test[i]["input"], dataset[i]["input"]
        assert predicted.shape == trained.shape, kind
        torch.testing.assert_close(predicted, trained, atol=TOLERANCE.get(kind, 2e-5), rtol=1e-5, msg=kind)


def test_a_slice_model_takes_a_png_as_the_one_slice_volume_it_is(kinds, tmp_path):
    """A 2D image given to a model trained on slices is one slice: the same input as a NIfTI of that slice."""
    _, bundle, _ = kinds["synthetic_mri_slices"]
    image = np.random.default_rng(5).random((30, 34))
    png = write_pillow(tmp_path / "slice.png", np.round(image * 65535).astype(np.uint16))
    nifti = write_nifti(tmp_path / "slice.nii.gz", image[:, :, None])
    dataset = inference_dataset(bundle.preprocessing, [(png,), (nifti,)])
    torch.testing.assert_close(dataset[0]["input"], dataset[1]["input"][..., 0], atol=1e-4, rtol=0)


def _save_checkpoint(folder: Path, kind: str, preset: str, bundle, cfg: dict) -> torch.nn.Module:
    attention = "seqnorm" if takes_attention(preset) else "null"  # the core mechanism where a model takes one
    config = load_config(None, [f"data.kind={kind}", f"model.name={preset}", f"model.attention={attention}",
                                "train.threads=1"])
    config["data"] = cfg
    torch.manual_seed(0)
    model = build_model(config["model"], bundle.task).eval()
    meta = {"config": config, "task": checkpoint.task_to_dict(bundle.task), "epoch": 1,
            "preprocessing": bundle.preprocessing.to_dict()}
    checkpoint.save(folder, model, meta)
    return model, config


CLASSIFICATION_PAIRS = [(kind, preset) for kind in sorted(KINDS) for family, preset in sorted(FAMILIES.items())
                        if kind != "medmnist"]


def _pairs_of_kind(kinds: dict) -> list[tuple[str, str]]:
    return [(kind, preset) for kind, preset in CLASSIFICATION_PAIRS
            if _fits(next(f for f, p in FAMILIES.items() if p == preset), kinds[kind][1].task.input_kind,
                     kinds[kind][1].task.task_type == "segmentation")]


def test_predict_gives_evals_probabilities_for_every_kind_and_family(kinds, tmp_path):
    """Kinds x families that fit: the checkpoint opened by predict, on files, gives eval's probabilities."""
    pairs = _pairs_of_kind(kinds)
    assert {kind for kind, _ in pairs} == set(KINDS) - {"medmnist"}, "every predictable kind meets a model family"
    assert {next(f for f, p in FAMILIES.items() if p == preset) for _, preset in pairs} >= \
        {f for f in FAMILIES if f[0] != "SwinClassifier" or _has("monai")}, "every family meets a data kind"
    for kind, preset in pairs:
        cfg, bundle, _ = kinds[kind]
        if PRESETS[preset][0].__name__ == "SwinClassifier" and not _has("monai"):
            continue
        folder = tmp_path / f"{kind}-{preset}"
        model, config = _save_checkpoint(folder, kind, preset, bundle, cfg)
        runner = open_model(folder)
        batch = collate([inference_dataset(runner.preprocessing, _inputs(kind, kinds))[i] for i in range(CASES)]) \
            if runner.preprocessing.slice_axis is None else None
        predictor = Predictor.for_run(model, config, bundle.task, torch.device("cpu"))
        with torch.no_grad():
            if bundle.task.task_type == "segmentation":  # per voxel, one case at a time (slice volumes differ)
                for i, paths in enumerate(_inputs(kind, kinds)):
                    single = collate([inference_dataset(runner.preprocessing, [paths])[0]])
                    expected = predictor.probabilities(collate([bundle.test[i]])).numpy()
                    np.testing.assert_allclose(runner.probabilities(single), expected, atol=2e-4,
                                               err_msg=f"{kind} {preset}")
                continue
            loader = make_loader(Subset(bundle.test, range(CASES)), CASES, False, 0)
            evaluated = predict(predictor, loader, objective_for(bundle.task), progress=False).outputs
        np.testing.assert_allclose(runner.probabilities(batch), evaluated, atol=PROBABILITY_TOLERANCE.get(kind, 2e-4),
                                   err_msg=f"{kind} {preset}")
        table = predict_files(runner, _inputs(kind, kinds))
        probs = [[float(v) for v in row[1:1 + bundle.task.num_outputs]] for row in table.rows]
        np.testing.assert_allclose(probs, evaluated, atol=PROBABILITY_TOLERANCE.get(kind, 2e-4),
                                   err_msg=f"{kind} {preset} CSV")


def test_a_kind_no_single_file_can_follow_is_refused_in_one_line_at_predict_and_export(kinds, tmp_path):
    from medattn.deploy.export import export_checkpoint

    cfg, bundle, _ = kinds["medmnist"]
    preset = FAMILIES[("ResNet", 2)]
    _save_checkpoint(tmp_path / "ckpt", "medmnist", preset, bundle, cfg)
    for action in (lambda: open_model(tmp_path / "ckpt"),
                   lambda: export_checkpoint(tmp_path / "ckpt", "pt2", tmp_path / "m.pt2")):
        with pytest.raises(UserError, match="MedMNIST") as error:
            action()
        assert "\n" not in str(error.value)


def test_families_are_taken_from_the_presets():
    assert all(inspect.isclass(PRESETS[p][0]) for p in FAMILIES.values())
    assert FAMILIES[("SegmentationViT", None)] == "vit_s8_seg_tiny"


def test_a_slice_segmenter_writes_label_maps_for_nifti_and_png_on_their_own_grids(kinds, tmp_path):
    """ViT-S/8 trained on slices: a NIfTI volume gets a NIfTI map on its grid and affine, a PNG a PNG map of its
    size; the exported ONNX graph (2D) runs a volume slice by slice to the same maps."""
    import nibabel as nib
    from PIL import Image

    cfg, bundle, _ = kinds["synthetic_mri_slices"]
    _save_checkpoint(tmp_path / "ckpt", "synthetic_mri_slices", "vit_s8_seg_tiny", bundle, cfg)
    volume = write_nifti(tmp_path / "vol.nii.gz", np.random.default_rng(6).normal(size=(36, 28, 9)),
                         spacing=(0.8, 0.9, 3.0))
    png = write_pillow(tmp_path / "slice.png", np.random.default_rng(7).integers(0, 256, (27, 41), dtype=np.uint8))
    runners = {"checkpoint": open_model(tmp_path / "ckpt")}
    if _has("onnxruntime") and _has("onnxscript"):
        from medattn.deploy.export import export_checkpoint

        export_checkpoint(tmp_path / "ckpt", "onnx", tmp_path / "m.onnx")
        runners["onnx"] = open_model(tmp_path / "m.onnx")
    maps = {}
    for name, runner in runners.items():
        table = predict_files(runner, [(volume,), (png,)], label_dir=tmp_path / name)
        nifti_map, png_map = (Path(row[1]) for row in table.rows)
        written = nib.load(nifti_map)
        assert written.shape == (36, 28, 9) and np.allclose(written.affine, nib.load(volume).affine)
        assert np.asarray(Image.open(png_map)).shape == (27, 41)
        assert table.rows[1][len(table.header) - 3] == ""  # a PNG has no mm^3
        maps[name] = (np.asarray(written.dataobj), np.asarray(Image.open(png_map)))
    for other in maps.values():
        assert all(np.array_equal(a, b) for a, b in zip(other, maps["checkpoint"]))


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True
