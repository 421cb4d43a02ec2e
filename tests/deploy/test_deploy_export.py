"""Every preset x mechanism at tiny size exports to ONNX and matches onnxruntime; torch.export programs load and run.

One export per (preset, mechanism), checked at another batch size (and token count / image size where
those are dynamic) than it was exported with, so the dynamic axes are tested too.

Every run exports each preset with SeqNorm, the bag preset (dynamic tokens and a padding mask) with softmax too, and
every plain preset; each mechanism's attention module alone is exported in every run with a dynamic token count and
a padding mask (tests/attention/test_contract_attention.py). The other (preset, mechanism) pairs, the other
mechanisms inside the bag preset included, about 12 s of one core each, are ``-m slow``.
"""

import json

import pytest
import torch

from medattn.attention import available_attentions
from medattn.attention.base import Attention
from medattn.data.preprocessing import Preprocessing, stated_task
from medattn.deploy import Deployable, export_model, read_metadata
from medattn.deploy.format import metadata
from medattn.errors import UserError
from medattn.runtime.build import build_model
from references import randomize_norm_affines

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

# preset -> (input kind, input shape, task type, outputs)
ATTENTION_PRESETS = {
    "vit2d_tiny": ("image2d", (1, 32, 32), "binary", 1),
    "vit3d_tiny": ("volume3d", (1, 16, 16, 8), "multilabel", 2),
    "vitwsi_tiny": ("bag", (16,), "binary", 1),
    "pixel_tiny": ("image2d", (1, 8, 8), "multiclass", 3),
}
PLAIN_PRESETS = {
    "resnet2d_tiny": ("image2d", (3, 32, 32), "multiclass", 4),
    "resnet3d_tiny": ("volume3d", (1, 16, 16, 8), "binary", 1),
    "abmil_tiny": ("bag", (16,), "multilabel", 2),
    "unet3d": ("volume3d", (1, 16, 16, 8), "segmentation", 3),
    "dilated_fcn": ("volume3d", (1, 16, 16, 8), "segmentation", 3),
}
CONV_STEM_PRESETS = {"vit3d_small": ("volume3d", (1, 32, 32, 16), "binary", 1)}  # the stem's BatchNorm in eval mode
EVERY_RUN = {(p, "seqnorm") for p in ATTENTION_PRESETS} | {("vitwsi_tiny", "softmax")}
CASES = ([pytest.param(p, m, marks=[] if (p, m) in EVERY_RUN else [pytest.mark.slow])
          for p in ATTENTION_PRESETS for m in available_attentions()]
         + [(p, None) for p in PLAIN_PRESETS] + [(p, "seqnorm") for p in CONV_STEM_PRESETS])


def _prep(preset: str) -> Preprocessing:
    kind, shape, task_type, k = {**ATTENTION_PRESETS, **PLAIN_PRESETS, **CONV_STEM_PRESETS}[preset]
    return Preprocessing(data_kind="test", input_kind=kind, task_type=task_type, num_outputs=k,
                         class_names=tuple(f"c{i}" for i in range(k)), input_shape=shape,
                         mean=(0.5,) * shape[0] if kind == "image2d" else (),
                         std=(0.5,) * shape[0] if kind == "image2d" else ())


def _model(preset: str, mechanism: str | None):
    torch.manual_seed(0)
    model = build_model({"name": preset, "attention": mechanism, "kwargs": {}}, stated_task(_prep(preset)))
    for module in model.modules():
        if isinstance(module, Attention):
            randomize_norm_affines(module)  # non-trivial norm weights, so statistics paths are exercised
    return model.eval()


def _inputs(prep: Preprocessing, batch: int, size: int) -> tuple[torch.Tensor, ...]:
    """Random inputs of another batch size / token count / image size than the export's examples."""
    gen = torch.Generator().manual_seed(size)
    if prep.input_kind == "bag":
        mask = torch.arange(size) < torch.tensor([[size]] + [[size - 4]] * (batch - 1))
        return (torch.randn(batch, size, prep.input_shape[0], generator=gen), mask,
                torch.rand(batch, size, 2, generator=gen) * 500)
    shape = list(prep.input_shape)
    if prep.data_kind == "test" and prep.input_kind == "image2d" and prep.num_outputs == 3:  # pixel_tiny: any size
        shape[1:] = [size % 7 + 3, size % 5 + 4]
    return (torch.randn(batch, *shape, generator=gen),)


@pytest.mark.parametrize(("preset", "mechanism"), CASES)
def test_onnx_matches_onnxruntime(preset, mechanism, tmp_path):
    """ONNX (opset 18, dynamic batch; dynamic tokens for bags, dynamic H x W for the pixel transformer)
    against the eager model to 1e-4 relative, at batch 3 and 1 (export examples have batch 2)."""
    prep, model = _prep(preset), _model(preset, mechanism)
    _check_onnx(model, prep, export_model(model, prep, "onnx", tmp_path / "m.onnx", {"model_id": preset}))


@pytest.mark.parametrize("readout", ["max", "attention", "mean"])
def test_a_bag_model_with_pooled_features_exports_both_paths(readout, tmp_path):
    """The pooled-feature path (mean and maximum over the real tiles, its running standardiser frozen) exports with
    the readout, at other token counts and with padding."""
    torch.manual_seed(0)
    prep = _prep("vitwsi_tiny")
    model = build_model({"name": "vitwsi_tiny", "attention": "seqnorm",
                         "kwargs": {"readout": readout, "pooled_features": True}}, stated_task(prep))
    model.train()
    with torch.no_grad():
        model(torch.randn(4, 20, 16) * 3 + 1)  # running statistics away from their prior
        torch.nn.init.normal_(model.pooled_head.weight)
        torch.nn.init.normal_(model.head.weight)
    model.eval()
    _check_onnx(model, prep, export_model(model, prep, "onnx", tmp_path / "m.onnx", {"model_id": "pooled"}))


def _check_onnx(model, prep: Preprocessing, path) -> None:
    """The exported file against the eager model to 1e-4 relative, at batch 3 and 1 (export examples: batch 2)."""
    session = ort.InferenceSession(str(path))
    names = [i.name for i in session.get_inputs()]
    assert session.get_modelmeta().custom_metadata_map["medattn"]
    for batch, size in ((3, 17), (1, 5)):
        inputs = _inputs(prep, batch, size)
        (actual,) = session.run(None, {n: t.numpy() for n, t in zip(names, inputs)})
        with torch.no_grad():
            expected = Deployable(model, prep.task_type, prep.input_kind)(*inputs)
        assert actual.shape == tuple(expected.shape)
        torch.testing.assert_close(torch.from_numpy(actual), expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("preset", ["upamnet", "dilated_fcn_pam"])
def test_permutohedral_models_are_refused_in_one_line(preset, tmp_path):
    kind, shape = "volume3d", (1, 16, 16, 8)
    prep = Preprocessing("test", kind, "segmentation", 2, ("bg", "fg"), shape)
    model = build_model({"name": preset, "attention": None, "kwargs": {}}, stated_task(prep)).eval()
    with pytest.raises(UserError, match="cannot export this model to onnx: PAM: the permutohedral lattice") as error:
        export_model(model, prep, "onnx", tmp_path / "m.onnx", {})
    assert "\n" not in str(error.value) and not (tmp_path / "m.onnx").exists()


class _DataDependent(torch.nn.Module):
    """A model whose forward branches on its input's values: torch.export cannot capture it."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.linear(x.mean((2, 3))) if x.sum() > 0 else self.linear(x.amax((2, 3)))


@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
def test_an_exporter_failure_prints_nothing_and_is_one_line_without_colour_codes(fmt, tmp_path, capfd):
    prep = Preprocessing("test", "image2d", "binary", 1, ("x",), (4, 8, 8), mean=(0.5,) * 4, std=(0.5,) * 4)
    with pytest.raises(UserError, match=f"cannot export this model to {fmt}: ") as error:
        export_model(_DataDependent().eval(), prep, fmt, tmp_path / f"m.{fmt}", {})
    out, err = capfd.readouterr()
    assert out == err == "" and "\n" not in str(error.value) and "\x1b[" not in str(error.value)


@pytest.mark.parametrize(("preset", "mechanism"), [("vit2d_tiny", "seqnorm"), ("vitwsi_tiny", "binary-hamming"),
                                                   ("pixel_tiny", "sima"), ("unet3d", None)])
def test_pt2_program_loads_and_runs(preset, mechanism, tmp_path):
    """torch.export programs (.pt2) with the metadata inside the archive; loaded and run at another batch size."""
    prep, model = _prep(preset), _model(preset, mechanism)
    meta = metadata(prep, [0.3] if prep.num_outputs == 1 else None, "run/x", "ab" * 32, [])
    path = export_model(model, prep, "pt2", tmp_path / "m.pt2", meta)
    extra = {"medattn.json": ""}
    program = torch.export.load(str(path), extra_files=extra)
    stored = json.loads(extra["medattn.json"])
    assert stored == read_metadata(path) and stored["checkpoint_sha256"] == "ab" * 32
    assert Preprocessing(**{k: tuple(v) if isinstance(v, list) else v
                            for k, v in stored["preprocessing"].items() if k != "version"}) == prep
    inputs = _inputs(prep, 3, 13)
    with torch.no_grad():
        expected = Deployable(model, prep.task_type, prep.input_kind)(*inputs)
        torch.testing.assert_close(program.module()(*inputs), expected, rtol=1e-4, atol=1e-6)


def test_unknown_format_and_foreign_files(tmp_path):
    prep = _prep("vitwsi_tiny")
    with pytest.raises(UserError, match="--format must be one of onnx, pt2"):
        export_model(_model("vitwsi_tiny", "softmax"), prep, "tflite", tmp_path / "m", {})
    (tmp_path / "x.onnx").write_bytes(b"not onnx")
    with pytest.raises(UserError, match=r"x\.onnx: not a readable exported model"):
        read_metadata(tmp_path / "x.onnx")
