"""Input kinds (:mod:`medattn.data.input_kinds`): every registered kind answers every question, and no code outside
the module branches on a kind's name.

Generated from :data:`~medattn.data.input_kinds.KINDS`: for each kind a tiny model is built from its task and a good
file of the kind is read as predict reads it; the file's sample runs through the model as training, prediction and
the exported graph give it, explain writes its files and a report draws the case. The only table here is
:data:`TINY` (a preset and a file per kind), and a test fails until a new kind has its row.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from name_scan import name_branches

from medattn.data import input_kinds
from medattn.data.base import INPUT_KINDS, TaskInfo, collate
from medattn.data.input_kinds import KINDS, Heatmaps
from medattn.data.preprocessing import Preprocessing, from_dict, inference_dataset, items, stated_task
from medattn.errors import UserError

SRC = Path(__file__).resolve().parents[2] / "src" / "medattn"
MODULE = SRC / "data" / "input_kinds.py"


def _png(path: Path, rng) -> None:
    from PIL import Image

    Image.fromarray(rng.integers(0, 255, (40, 36), dtype=np.uint8)).save(path)


def _nifti(path: Path, rng) -> None:
    import nibabel as nib

    nib.save(nib.Nifti1Image(rng.normal(size=(18, 16, 9)).astype(np.float32), np.eye(4)), path)


def _h5(path: Path, rng) -> None:
    import h5py

    with h5py.File(path, "w") as f:
        f["features"] = rng.normal(size=(7, 16)).astype(np.float32)
        f["coords"] = rng.integers(0, 4000, (7, 2)).astype(np.float32)
        f.attrs["slide"] = "s.svs"


#: Per kind: a tiny preset of its contract, the task's input shape, and a good file (name, writer).
TINY = {
    "image2d": ("vit2d_tiny", (1, 32, 32), "a.png", _png),
    "volume3d": ("vit3d_tiny", (1, 16, 16, 8), "a.nii.gz", _nifti),
    "bag": ("vitwsi_tiny", (16,), "a.h5", _h5),
}


def test_every_kind_has_a_tiny_model_and_file():
    assert set(TINY) == set(KINDS), "add the new kind to TINY: a preset, an input shape and a good file"


def test_the_registry_is_the_stored_names():
    assert INPUT_KINDS == tuple(KINDS)
    for name, kind in KINDS.items():
        assert kind.name == name and input_kinds.of(name) is kind and input_kinds.known(name) is kind
        assert kind in input_kinds.taken_by(kind.contract)
    with pytest.raises(ValueError, match="input_kind must be one of"):
        input_kinds.of("video")
    assert input_kinds.known(["bag"]) is None and input_kinds.known(None) is None
    with pytest.raises(ValueError, match="input_kind must be one of"):
        TaskInfo("binary", "video", 1, (3,))


@pytest.fixture(scope="module", params=list(KINDS))
def case(request, tmp_path_factory):
    """A kind with its tiny model, preprocessing, a good file and the file's sample (as predict reads it)."""
    from medattn.runtime.build import build_model

    kind = KINDS[request.param]
    preset, shape, name, write = TINY[kind.name]
    torch.manual_seed(0)
    task = TaskInfo("binary", kind.name, 1, shape, ["x"])
    model = build_model({"name": preset}, task).eval()
    channels = {"mean": (0.5,) * shape[0], "std": (0.25,) * shape[0]} if kind.channel_statistics else {}
    prep = Preprocessing.of("test", task, **channels)
    path = tmp_path_factory.mktemp(kind.name) / name
    write(path, np.random.default_rng(0))
    sample = inference_dataset(prep, [(path,)])[0]
    return kind, model, prep, path, sample


def test_shapes_and_the_stored_description(case):
    kind, _, prep, path, sample = case
    assert len(prep.input_shape) == kind.spatial_dims + 1
    assert from_dict(prep.to_dict(), "test") == prep  # the shape's length and the channel statistics checked by kind
    if kind.instances:  # (N, F) with coords (N, 2)
        assert sample["input"].shape[1:] == prep.input_shape and sample["coords"].shape == (len(sample["input"]), 2)
    else:
        assert tuple(sample["input"].shape) == prep.input_shape
    placeholder = kind.placeholder(prep.input_shape)
    assert placeholder.keys() <= sample.keys() and placeholder["input"].shape[-1] == sample["input"].shape[-1]
    assert bool(kind.folder_suffixes) != kind.reads_folders  # a folder is searched or read, never both
    assert all(s.startswith(".") for s in kind.folder_suffixes)
    assert callable(kind.loader(prep))


def test_several_files_make_one_sample_only_where_the_kind_joins_them(case, tmp_path):
    kind, _, prep, path, _ = case
    pair = (path, path)
    if kind.joins_files:
        assert [item.paths for item in items(prep, [pair])] == [pair]
    else:
        with pytest.raises(UserError, match="this model takes one file per sample"):
            items(prep, [pair])


def test_the_model_takes_what_the_kind_gives(case):
    from medattn.deploy.export import Deployable
    from medattn.runtime.predictor import Predictor, forward, probabilities

    kind, model, prep, _, sample = case
    batch = collate([sample, sample])
    with torch.no_grad():
        logits = forward(model, batch, kind.name)
        assert logits.shape == (2, 1) and torch.isfinite(logits).all()
        predicted = Predictor(model, "binary", kind.name).probabilities(batch)
        graph = Deployable(model, "binary", kind.name)(*kind.graph_inputs(batch))
    assert torch.equal(predicted, probabilities(logits, "binary")) and torch.allclose(graph, predicted, atol=1e-6)
    assert len(kind.graph_inputs(batch)) == len(kind.input_names)
    statistic = kind.statistic(batch)
    assert statistic.shape == (2,) and statistic.dtype == torch.float64 and kind.statistic_name


def test_a_model_of_another_contract_is_refused(case):
    from medattn.runtime.build import build_model

    kind, _, prep, _, _ = case
    other = next(name for name, row in TINY.items() if KINDS[name].contract != kind.contract)
    with pytest.raises(UserError, match=f"takes .* but the data gives {kind.name} inputs"):
        build_model({"name": TINY[other][0]}, stated_task(prep))


def test_example_inputs_run_through_the_model_and_export_under_the_names_deploy_checks(case):
    from medattn.deploy.export import Deployable, example_inputs

    kind, model, prep, _, _ = case
    args, dynamic, names = example_inputs(prep, model, generator=torch.Generator().manual_seed(0))
    assert names == list(kind.input_names) and len(args) == len(names) == len(dynamic)
    wrapper = Deployable(model, "binary", kind.name).eval()
    with torch.no_grad():
        out = wrapper(*args)
    assert out.shape == (2, 1) and ((out >= 0) & (out <= 1)).all()
    program = torch.export.export(wrapper, args, dynamic_shapes=dynamic)
    user = [s.arg.name for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    assert len(user) == len(kind.input_names)  # deploy.runtime names a .pt2 program's inputs by these
    with torch.no_grad():
        assert torch.allclose(program.module()(*args), out, atol=1e-5)


class Recorder:
    """A :class:`Heatmaps` that records which drawing a kind asked for."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        if name not in _protocol():
            raise AttributeError(name)
        return lambda base, relevance: self.calls.append((name, np.asarray(base).shape, tuple(relevance.shape)))


def _protocol() -> list[str]:
    return [name for name in vars(Heatmaps) if not name.startswith("_")]


def test_explain_draws_every_kind_with_a_method_of_the_protocol():
    from medattn.explain.cases import CasePictures
    from medattn.explain.files import FileHeatmaps

    assert _protocol() == ["image", "volume", "tiles"]
    for implementation in (FileHeatmaps, CasePictures):
        assert all(callable(getattr(implementation, name, None)) for name in _protocol()), implementation


def test_explain_writes_what_the_kind_plans_and_a_report_shows_the_case(case, tmp_path):
    from medattn.explain.cases import CasePictures
    from medattn.explain.core import explain, is_bag_model
    from medattn.explain.files import FileHeatmaps
    from medattn.outputs import OutputFolder

    kind, model, prep, path, sample = case
    assert is_bag_model(model) == kind.instances
    tiles, attrs = kind.header(path)
    assert (tiles, bool(attrs)) == ((len(sample["input"]), True) if kind.instances else (0, False))
    x, kwargs = kind.one(sample, torch.device("cpu"))
    result = explain(model, x, "auto", **kwargs)
    relevance = result.relevance[0].detach()
    assert relevance.shape == (x.shape[1:2] if kind.instances else x.shape[2:])

    recorder = Recorder()
    kind.explain_file(recorder, path, sample, relevance)
    kind.show_case(recorder, sample, relevance)
    assert len(recorder.calls) == 2 and all(shape[-1] == relevance.shape[-1] for _, _, shape in recorder.calls)

    out = OutputFolder(tmp_path / "out", [path])
    for suffix in kind.explain_suffixes:
        out.path("a" + suffix)
    heatmaps = FileHeatmaps(out, "a", path, prep.spacing, "title", result.method, True, attrs, None)
    written = kind.explain_file(heatmaps, path, sample, relevance)
    assert written and set(written) <= {"a" + s for s in kind.explain_suffixes}
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if not p.name.startswith(".")) == sorted(written)
    picture = kind.show_case(CasePictures("title", result.method, True), sample, relevance)
    assert picture is not None and picture.size[0] > 100


# --- no branch on a kind's name outside the module ---------------------------------------------------------------

def kind_branches(code: str, names=tuple(KINDS)) -> list[int]:
    """The lines of ``code`` that decide by an input kind's name (:func:`name_scan.name_branches`)."""
    return name_branches(code, names)


def test_the_scanner_finds_each_way_of_branching_on_a_name():
    branches = {
        'if prep.input_kind == "bag":\n    pass': 1,
        'x = a if kind != "volume3d" else b': 1,
        'ok = task.input_kind in ("image2d", "volume3d")': 1,
        'ok = found["input_kind"] not in ["bag"]': 1,
        'NAMES = {"bag": ["features"], "image2d": ["x"]}': 2,  # each key
        'x = found.get("bag", {})': 1,
        'names = INPUT_NAMES["bag"]': 1,
        'match kind:\n    case "image2d":\n        pass': 1,
        'a = k == "bag"\nb = "image2d" == k': 2,
    }
    for code, count in branches.items():
        assert len(kind_branches(code)) == count, code
    clean = ('task = TaskInfo("binary", "bag", 1, (16,))\nif kind == "cosine":\n    pass\n'
             'kind = input_kinds.of(task.input_kind)\nif kind.instances:\n    pass\nNAMES = {"x": 1}')
    assert kind_branches(clean) == []


def test_no_code_outside_the_module_branches_on_a_kind_name():
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        if path != MODULE:
            lines = kind_branches(path.read_text(encoding="utf-8"))
            if lines:
                found[path.relative_to(SRC).as_posix()] = lines
    assert found == {}, (
        f"branches on an input kind's name outside medattn/data/input_kinds.py: {found}; ask the kind object "
        f"instead (a method or attribute of InputKind, docs/architecture.md 'An input kind')")
