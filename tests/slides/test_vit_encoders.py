"""The pathology ViT encoders in medattn's own module (medattn.slides.vit_encoder) against timm's VisionTransformer
built in each publisher's layout with random weights (depth 2; timm is installed --no-deps, torchvision replaced by
a stand-in): the file saved from timm loads strictly, the architecture is read from it, the embedding is timm's."""

from __future__ import annotations

import warnings

import pytest
import torch
from safetensors.torch import save_file

from medattn.errors import UserError
from medattn.slides.encoders import ENCODERS, HEADS
from medattn.slides.extractors import build_extractor
from medattn.slides.vit_encoder import TileViT, infer_architecture, load_tile_vit
from stand_ins.torchvision import import_timm

vit = import_timm()


def swiglu():
    from timm.layers import SwiGLUPacked

    return {"mlp_layer": SwiGLUPacked, "act_layer": torch.nn.SiLU}


def timm_kwargs(card) -> dict:
    """timm's keyword arguments for the card's layout (medattn.slides.encoders): the card is the one source."""
    fc1 = card.mlp_hidden * (2 if card.swiglu else 1)
    return {"embed_dim": card.dim, "num_heads": HEADS[card.dim], "patch_size": card.patch,
            "mlp_ratio": (fc1 + 0.5) / card.dim,  # timm takes int(dim * mlp_ratio)
            "reg_tokens": card.registers, "no_embed_class": not card.embed_prefix,
            **({"init_values": 1e-5} if card.layer_scale else {}), **(swiglu() if card.swiglu else {})}


#: publisher -> (timm architecture, keyword arguments of its layout, pooling), from the cards with a timm architecture
LAYOUTS = {name: (card.timm, timm_kwargs(card), card.pooling) for name, card in ENCODERS.items() if card.timm}


def timm_encoder(name: str):
    import timm

    architecture, kwargs, _ = LAYOUTS[name]
    torch.manual_seed(0)
    model = timm.create_model(architecture, pretrained=False, num_classes=0, img_size=224, depth=2, **kwargs)
    with torch.no_grad():  # non-trivial LayerScale, tokens and biases, so that each is tested
        for tensor in model.parameters():
            tensor.add_(0.02 * torch.randn_like(tensor))
    return model.eval()


def timm_embedding(model, images, pooling):
    tokens = model.forward_features(images)
    prefix = model.num_prefix_tokens
    return tokens[:, 0] if pooling == "cls" else torch.cat([tokens[:, 0], tokens[:, prefix:].mean(dim=1)], dim=-1)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_each_layout_loads_strictly_and_embeds_as_timm(name, tmp_path):
    model = timm_encoder(name)
    path = tmp_path / f"{name}.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    images = torch.randn(2, 3, 224, 224)
    ours = TileViT(infer_architecture(model.state_dict()), LAYOUTS[name][2]).eval()
    ours.load_state_dict(model.state_dict(), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(ours(images), timm_embedding(model, images, LAYOUTS[name][2]), rtol=1e-4,
                                   atol=1e-4)
    loaded, _ = load_tile_vit(path, "vit")  # from the file, strictly, architecture inferred
    assert loaded.arch == ours.arch and loaded.arch.depth == 2


def test_a_publisher_name_checks_the_file_and_records_its_input(tmp_path):
    model = timm_encoder("uni")
    path = tmp_path / "uni.safetensors"
    save_file({**{k: v.contiguous() for k, v in model.state_dict().items()}, "head.weight": torch.zeros(2, 1024)},
              path)
    with pytest.raises(UserError, match=r"not the uni encoder: depth 2 \(expected 24\)"):
        load_tile_vit(path, "uni")
    with pytest.raises(UserError, match=r"not the prov-gigapath encoder: width 1024 \(expected 1536\)"):
        load_tile_vit(path, "prov-gigapath")
    extractor = build_extractor(f"vit:{path}")  # the head is dropped, the rest loads strictly
    features = extractor(torch.randint(0, 255, (3, 256, 256, 3), dtype=torch.uint8))  # resized to 224
    assert features.shape == (3, 1024)
    assert extractor.record()["extractor_input_px"] == 224
    assert extractor.record()["extractor_mean"] == pytest.approx([0.485, 0.456, 0.406])


def test_int8_and_bf16_extraction_keep_the_features_and_say_so_in_the_name(tmp_path):
    path = tmp_path / "vit.safetensors"
    save_file({k: v.contiguous() for k, v in timm_encoder("vit-b16").state_dict().items()}, path)
    pixels = torch.randint(0, 255, (4, 224, 224, 3), dtype=torch.uint8)
    reference = build_extractor(f"vit:{path}")(pixels)
    for precision, least in (("int8", 0.99), ("bf16", 0.995)):
        extractor = build_extractor(f"vit:{path}", precision=precision)
        assert extractor.name == f"vit:vit.safetensors@{precision}"  # another name: never taken for fp32 features
        cosine = torch.nn.functional.cosine_similarity(extractor(pixels), reference)
        assert least < cosine.min() < 1.0
    with pytest.raises(UserError, match="--precision int8 is for the transformer encoders"):
        build_extractor("descriptor", precision="int8")


def test_files_that_are_no_vit_are_one_line(tmp_path):
    path = tmp_path / "resnet.safetensors"
    save_file({"conv1.weight": torch.zeros(64, 3, 7, 7)}, path)
    with pytest.raises(UserError, match="not a ViT in timm's layout"):
        load_tile_vit(path)


def test_extract_with_a_publisher_encoder_writes_its_input_record_and_warns_on_magnification(tmp_path, capsys,
                                                                                              monkeypatch):
    """The UNI layout (depth 2 here, the depth check relaxed) through `medattn wsi extract` on a SYNTHETIC slide."""
    import dataclasses

    import h5py

    from medattn.cli import main
    from medattn.generators.slides import write_synthetic_cohort
    from medattn.slides.vit_encoder import ENCODERS

    pytest.importorskip("openslide")
    monkeypatch.setitem(ENCODERS, "uni", dataclasses.replace(ENCODERS["uni"], depth=None))
    path = tmp_path / "uni.safetensors"
    save_file({k: v.contiguous() for k, v in timm_encoder("uni").state_dict().items()}, path)
    write_synthetic_cohort(tmp_path / "slides", count=1, seed=3, shape=(384, 512))
    assert main(["wsi", "extract", str(tmp_path / "slides"), "--out", str(tmp_path / "features"), "--extractor",
                 f"uni:{path}", "--patch-um", "64", "--patch-px", "32", "--thumbnail-px", "256", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "WARNING: uni:uni.safetensors was trained on tiles of 0.5 um per pixel; these patches are 2 um" in out
    assert "use --patch-um 112 --patch-px 224" in out
    with h5py.File(tmp_path / "features" / "slide_000.h5") as f:
        assert f["features"].shape[1] == 1024
        assert f.attrs["extractor_input_px"] == 224 and f.attrs["extractor_mpp"] == 0.5


@pytest.mark.parametrize("attention", ["seqnorm", "sima"])
def test_another_mechanism_loads_a_publishers_file_and_attends_its_own_way(attention, tmp_path):
    """Virchow2's layout (registers, SwiGLU, LayerScale) from timm's file into TileViT(attention=...): every tensor of
    timm's layout loaded bit for bit; SeqNorm's own affines, absent from the file, at their identity (weight 1, bias 0)
    with a warning naming them (SimA has none); it embeds otherwise than softmax; saved, it reloads silently; a
    softmax TileViT refuses its file (strict)."""
    model = timm_encoder("virchow2")
    path = tmp_path / "virchow2.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours, _ = load_tile_vit(path, "vit", attention=attention)
    new = ours.mechanism_tensors()
    assert len(new) == (2 * 6 if attention == "seqnorm" else 0)  # depth 2: {q,k,v}_norm.{weight,bias} per block
    assert [str(w.message) for w in caught] == [
        f"{path}: 12 tensor(s) of the seqnorm attention are not in the file and keep their initial values (e.g. "
        f"blocks.0.attn.q_norm.weight, blocks.0.attn.q_norm.bias, blocks.0.attn.k_norm.weight)"] * bool(new)
    state = ours.state_dict()
    assert set(state) == set(model.state_dict()) | set(new)
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(state[k], torch.ones_like(state[k]) if k.endswith("weight") else torch.zeros_like(state[k]))
               for k in new)
    images = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        embedding, softmax = ours(images), load_tile_vit(path, "vit")[0](images)
    assert embedding.shape == softmax.shape == (2, 1280) and embedding.isfinite().all()  # "vit": the class token
    assert (embedding - softmax).abs().max() > 1e-2
    saved = tmp_path / f"virchow2_{attention}.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, saved)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again, _ = load_tile_vit(saved, "vit", attention=attention)
    with torch.no_grad():
        assert torch.equal(again(images), embedding)
    if new:
        with pytest.raises(UserError, match=r"not a vit encoder in timm's layout \(0 missing, e.g. \[\]; 12 unexp"):
            load_tile_vit(saved, "vit")
