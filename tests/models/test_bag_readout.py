"""The bag transformer's readouts (class token, gated attention pooling, max pooling): each equals a slow reference,
builds only what it uses and is explained by a method that applies."""

from __future__ import annotations

import pytest
import torch

from medattn.explain import default_method
from medattn.models import create_model
from medattn.models.wsi import READOUTS


def _model(readout: str, attention: str = "seqnorm"):
    torch.manual_seed(0)
    model = create_model("vitwsi_tiny", attention=attention, readout=readout).eval()
    torch.nn.init.normal_(model.head.weight, std=0.5)  # the max readout's head starts at zero
    return model


@pytest.mark.parametrize("attention", ["seqnorm", "softmax"])
def test_pooling_readouts_equal_a_loop_over_the_tokens(attention):
    bag = torch.randn(1, 30, 16)
    for readout in ("max", "attention"):
        model = _model(readout, attention)
        with torch.no_grad():
            x = model.encoder.residual_stream(model.feature_proj(model.feature_norm(bag)))[0]  # (N, D')
            if readout == "max":
                pooled = torch.tensor([max(float(x[k, c]) for k in range(30)) for c in range(x.shape[1])])
            else:
                s = torch.stack([model.pool.scores(model.encoder.norm(x[k])) for k in range(30)])
                pooled = model.encoder.norm((torch.softmax(s, 0)[:, None] * x).sum(0))
            torch.testing.assert_close(model(bag)[0], model.head(pooled), rtol=1e-5, atol=1e-5)


def test_each_readout_builds_only_what_it_uses_and_bad_names_fail():
    names = {readout: set(dict(create_model("vitwsi_tiny", readout=readout).named_parameters()))
             for readout in READOUTS}
    assert "cls_token" in names["cls"] and not any("pool" in n for n in names["cls"])
    assert "cls_token" not in names["attention"] and "pool.attention_w.weight" in names["attention"]
    assert "cls_token" not in names["max"] and not any("pool" in n for n in names["max"])
    assert not create_model("vitwsi_tiny", readout="max").head.weight.any()  # logits start at 0
    with pytest.raises(ValueError, match="readout must be one of"):
        create_model("vitwsi_tiny", readout="median")


def test_pooling_weights_are_a_distribution_over_the_real_instances():
    model = _model("attention")
    bag = torch.randn(2, 10, 16)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 6:] = False
    with torch.no_grad():
        a = model.pooling_weights(bag, mask)
    torch.testing.assert_close(a.sum(1), torch.ones(2))
    assert (a[1, 6:] == 0).all() and (a[mask] > 0).all()
    with pytest.raises(ValueError, match="only with readout='attention'"):
        _model("max").pooling_weights(bag)


def test_pooling_readouts_are_explained_by_gradient_x_input():
    assert default_method(_model("cls")) == "gradrollout"
    assert default_method(_model("max")) == default_method(_model("attention")) == "gradxinput"



def test_a_class_token_checkpoint_loads_as_such_when_its_presets_readout_changes(tmp_path, monkeypatch):
    """A checkpoint saved with a class token and no readout key builds with readout cls even where the preset's
    default became a pooling readout; without the rule the class token would be an unexpected tensor."""
    from medattn.config import load_config
    from medattn.data.base import TaskInfo
    from medattn.models import presets
    from medattn.runtime import checkpoint
    from medattn.runtime.build import build_model

    model = create_model("vitwsi_tiny", attention="seqnorm")  # readout "cls"
    config = load_config(None, ["data.kind=synthetic_wsi", "model.name=vitwsi_tiny", "model.attention=seqnorm"])
    task = TaskInfo("binary", "bag", 1, (16,), synthetic=True)
    checkpoint.save(tmp_path / "old", model, {"config": config, "task": checkpoint.task_to_dict(task)})
    cls, kwargs = presets.PRESETS["vitwsi_tiny"]
    monkeypatch.setitem(presets.PRESETS, "vitwsi_tiny", (cls, {**kwargs, "readout": "max"}))
    meta = checkpoint.load_meta(tmp_path / "old")
    assert meta["config"]["model"]["kwargs"]["readout"] == "cls"
    rebuilt = build_model(meta["config"]["model"], task)
    checkpoint.load_model(tmp_path / "old", rebuilt)
    bag = torch.randn(1, 9, 16)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.eval()(bag), model.eval()(bag))


class HotSpotBags(torch.utils.data.Dataset):
    """Bags of 80-160 tiles whose 16 features are one pattern times a per-tile scale (0.7-1.3) on an offset of 10;
    in a positive bag 4% of the tiles are 1.6 times brighter (a hot spot: every feature raised together)."""

    def __init__(self, n: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        pattern = torch.rand(16, generator=torch.Generator().manual_seed(7)) + 0.5
        self.bags = []
        for i in range(n):
            size = int(torch.randint(80, 161, (), generator=gen))
            scale = 0.7 + 0.6 * torch.rand(size, 1, generator=gen)
            if i % 2:
                scale[torch.randperm(size, generator=gen)[: max(2, size // 25)]] *= 1.6
            self.bags.append(50 * scale * pattern + 10 + 2.5 * torch.randn(size, 16, generator=gen))

    def __len__(self) -> int:
        return len(self.bags)

    def __getitem__(self, index: int) -> dict:
        bag = self.bags[index]
        return {"input": bag, "coords": torch.zeros(len(bag), 2), "label": torch.tensor([float(index % 2)]),
                "id": f"bag{index}", "patient": f"p{index}"}


@pytest.mark.parametrize("standardize", [False, True])
def test_the_cpu_bag_preset_finds_a_hot_spot_with_raw_and_with_standardised_features(tmp_path, standardize):
    """vitwsi_small with its own settings learns a finding in 4% of the tiles in two epochs, whether or not the
    features are standardised. With the class token (the readout it had before issue 40) it did not learn on the
    raw features (test AUROC 0.35-0.50 over 8 epochs) and learned slowly on standardised ones."""
    from engine_data import tiny_config
    from medattn.data.base import DataBundle, TaskInfo
    from medattn.train import fit

    bundle = DataBundle(HotSpotBags(60, 0), HotSpotBags(20, 1), HotSpotBags(40, 2),
                        TaskInfo("binary", "bag", 1, (16,), synthetic=True))
    config = tiny_config("model.name=vitwsi_small", "model.attention=seqnorm", "train.epochs=2",
                         "train.batch_size=1", "train.lr=null", "train.warmup_epochs=null", "eval.bootstrap=0",
                         "eval.heatmaps=0", f"model.kwargs.standardize_features={str(standardize).lower()}")
    results = fit(config, bundle, tmp_path / "run", progress=False, log=lambda m: None)
    assert results["defaults"]["model.kwargs.readout"] == "max"
    assert results["learning"]["learned"] and results["test"]["auroc"] >= 0.9
