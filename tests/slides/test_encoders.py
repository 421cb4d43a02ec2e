"""The tile encoders' cards (medattn.slides.encoders) are the one table: the extractor kinds, `wsi extract --help`,
`bench extract` and the layouts tests/slides/test_vit_encoders.py builds come from them; every card's layout check and
loader run against randomly initialised weights of its own architecture; one strict loader (medattn.models.weights)
reads every encoder's file."""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest
import torch
from safetensors.torch import save_file

from medattn.errors import UserError
from medattn.slides import encoders
from medattn.slides.encoders import ENCODERS


def extractor_help() -> str:
    from medattn.commands import wsi

    parser = argparse.ArgumentParser()
    wsi.add_arguments(parser)
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return next(a.help for a in subcommands.choices["extract"]._actions if a.dest == "extractor")


def test_the_help_and_the_error_list_exactly_the_registered_encoders(tmp_path):
    from medattn.slides.extractors import build_extractor

    kinds = [name for name, card in ENCODERS.items() if card.kind]
    assert kinds == encoders.extractor_kinds() and "vit-b16" not in kinds  # a reference layout, no kind
    named = re.findall(r"([\w.-]+):FILE", extractor_help())
    assert named == ["torchscript", "onnx", "MODEL_NAME", *kinds]
    with pytest.raises(UserError) as error:
        build_extractor(str(tmp_path / "none"))
    assert sorted(re.findall(r"([\w.-]+):FILE", str(error.value))) == sorted(["torchscript", "onnx", "MODEL_NAME",
                                                                              *kinds])


def test_the_bench_and_the_vit_module_read_the_same_table():
    from medattn.bench import extract
    from medattn.slides import vit_encoder

    assert vit_encoder.ENCODERS is ENCODERS
    assert extract.ARCHITECTURES == [name for name, card in ENCODERS.items() if card.buildable]
    assert {"vit-b16", "uni", "virchow2", "uni2-h", "h-optimus-0", "prov-gigapath", "ctranspath",
            "resnet50"} == set(extract.ARCHITECTURES)  # the names `bench extract --encoders` has always taken


@pytest.mark.parametrize("name", [name for name, card in ENCODERS.items() if card.architecture is not None])
def test_each_vit_card_reads_back_from_a_state_dict_of_its_architecture(name):
    """At full depth on the meta device (shapes, no memory): the file's architecture is the card's, its check passes,
    the embedding has the card's width, and the cards of other shapes refuse it."""
    from medattn.slides.vit_encoder import TileViT, check_layout, infer_architecture

    card = ENCODERS[name]
    with torch.device("meta"):
        model = TileViT(card.architecture, card.pooling)
        assert model(torch.empty(1, 3, 224, 224)).shape == (1, card.features)
    architecture = infer_architecture(model.state_dict())
    assert architecture == card.architecture
    check_layout(card, architecture, "file")
    check_layout(ENCODERS["vit"], architecture, "file")  # any timm-layout ViT
    for other in ENCODERS.values():
        if other.module == "vit_encoder" and other.dim and (other.dim, other.depth, other.patch) != (
                card.dim, card.depth, card.patch):
            with pytest.raises(UserError, match=f"file: not the {other.name} encoder"):
                check_layout(other, architecture, "file")


@pytest.mark.parametrize("name", [name for name, card in ENCODERS.items() if card.buildable])
def test_each_card_loads_random_weights_of_its_architecture_strictly(name, tmp_path):
    """Random weights in the card's architecture (ViTs at depth 1, the card's depth relaxed), saved and loaded through
    the card as `wsi extract` loads them: every tensor back, the embedding of the card's width."""
    card = ENCODERS[name]
    if card.architecture is not None:
        card = dataclasses.replace(card, depth=1)
    torch.manual_seed(0)
    built = card.build()
    path = tmp_path / f"{name}.safetensors"
    save_file({f"module.{k}": v.contiguous() for k, v in built.state_dict().items()}, path)  # DDP's prefix, too
    loaded = card.load(path)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in built.state_dict().items())
    with torch.no_grad():
        assert loaded(torch.randn(1, 3, 224, 224)).shape == (1, card.features)


def test_a_vit_card_builds_and_loads_with_another_attention_and_the_others_refuse_one(tmp_path):
    """``card.build(attention=...)`` and ``card.load(path, attention=...)`` reach the ViT's blocks (UNI's layout,
    depth 1): SeqNorm's own tensors are built, saved and read back; CTransPath and ResNet-50 run their own softmax
    only."""
    card = dataclasses.replace(ENCODERS["uni"], depth=1)
    torch.manual_seed(0)
    built = card.build(attention="seqnorm")
    assert built.attention == "seqnorm" and type(built.blocks[0].attn).__name__ == "SeqNormAttention"
    assert built.mechanism_tensors() == [f"blocks.0.attn.{n}_norm.{p}" for n in "qkv" for p in ("weight", "bias")]
    path = tmp_path / "uni_seqnorm.safetensors"
    save_file({k: v.contiguous() for k, v in built.state_dict().items()}, path)
    loaded = card.load(path, attention="seqnorm")
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in built.state_dict().items())
    for name in ("ctranspath", "resnet50"):
        with pytest.raises(ValueError, match=f"the {name} encoder runs its own softmax attention, not 'seqnorm'"):
            ENCODERS[name].build(attention="seqnorm")


def test_one_strict_loader_reports_and_words_every_refusal():
    from medattn.models.weights import load_strictly

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    state = {f"module.{k}": v.clone() for k, v in model.state_dict().items()}
    report = load_strictly(model, {**state, "head.weight": torch.zeros(1)}, "w.pt", "not the net", drop=("head.",))
    assert report == {"loaded": ["0.weight", "0.bias", "1.weight", "1.bias"], "dropped": ["head.weight"]}
    with pytest.raises(UserError, match=r"w.pt: not the net \(0 missing, e.g. \[\]; 1 unexpected, e.g. "
                                        r"\['head.weight'\]; 0 of another shape\)"):
        load_strictly(model, {**state, "head.weight": torch.zeros(1)}, "w.pt", "not the net")
    wrong = {**state, "module.1.bias": torch.zeros(3)}
    del wrong["module.0.bias"]
    with pytest.raises(UserError, match=r"w.pt: not the net \(1 missing, e.g. \['0.bias'\]; 0 unexpected, e.g. \[\]; "
                                        r"1 of another shape, e.g. 1.bias has shape \(3,\), the model's \(2,\)\)"):
        load_strictly(model, wrong, "w.pt", "not the net")
