"""Pretraining on unlabelled bags (medattn.pretrain.bag_views): a view holds only real tiles of its bag in the
stated share, padding never reaches the loss, NT-Xent equals its explicit sum, and a pretraining run lowers its loss,
is reproducible and starts a bag run (any readout) through --init-from."""

from __future__ import annotations

import csv
import math

import pytest
import torch

from engine_data import bag_bundle
from medattn.config import load_config
from medattn.errors import UserError
from medattn.models import create_model
from medattn.pretrain import pretrain
from medattn.pretrain.bag_views import BagViews, nt_xent, random_view
from medattn.pretrain.objectives import OBJECTIVES
from medattn.runtime import checkpoint


def _bags(lengths: list[int], features: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Bags whose tile k of bag b holds 1000 b + k + 1 in every feature (zero padding), and their mask."""
    n = max(lengths)
    mask = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    values = (1000 * torch.arange(len(lengths))[:, None] + torch.arange(n)[None, :] + 1).float()
    return (values * mask).unsqueeze(-1).expand(-1, -1, features).contiguous(), mask


@pytest.mark.parametrize(("share", "most"), [(0.5, 512), (0.3, 2), (0.01, 512)])
def test_a_view_holds_only_real_tiles_of_its_bag_in_the_stated_share(share, most):
    lengths = [7, 3, 12, 1]
    features, mask = _bags(lengths)
    view, view_mask, coords = random_view(features, mask, share, most, generator=torch.Generator().manual_seed(0))
    assert coords is None and view_mask.shape == view.shape[:2]
    for b, n in enumerate(lengths):
        tiles = view[b, view_mask[b], 0].long().tolist()
        assert len(tiles) == min(most, max(1, round(share * n)))
        assert len(set(tiles)) == len(tiles) and all(1000 * b < t <= 1000 * b + n for t in tiles)  # no padding
        assert not view[b, ~view_mask[b]].any()
    again = random_view(features, mask, share, most, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again[0], view) and torch.equal(again[1], view_mask)


def test_two_views_of_a_bag_differ_and_coords_follow_their_tiles():
    features, mask = _bags([40, 30])
    coords = torch.stack([features[..., 0], -features[..., 0]], dim=-1)
    gen = torch.Generator().manual_seed(1)
    a, a_mask, a_coords = random_view(features, mask, 0.5, 512, coords, gen)
    b, _, _ = random_view(features, mask, 0.5, 512, coords, gen)
    assert not torch.equal(a, b)
    assert torch.equal(a_coords[..., 0], a[..., 0]) and torch.equal(a_coords[..., 1], -a[..., 0])
    assert (a_mask.sum(1) == torch.tensor([20, 15])).all()


def test_nt_xent_equals_the_explicit_sum():
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 5, generator=gen, dtype=torch.float64), torch.randn(4, 5, generator=gen, dtype=torch.float64)
    z = [v / v.norm() for v in [*a, *b]]
    total = 0.0
    for i in range(8):
        positive = (i + 4) % 8
        others = sum(math.exp(float(z[i] @ z[j]) / 0.2) for j in range(8) if j != i)
        total += -math.log(math.exp(float(z[i] @ z[positive]) / 0.2) / others)
    assert nt_xent(a, b, 0.2).item() == pytest.approx(total / 8, rel=1e-12)
    with pytest.raises(ValueError, match="B >= 2"):
        nt_xent(a[:1], b[:1])


def test_padding_never_reaches_the_loss_or_its_gradient():
    model = create_model("vitwsi_tiny", attention="seqnorm", feature_dim=3, num_classes=1)
    views = BagViews(model, 0.5, 512)
    features, mask = _bags([6, 9, 4])
    features = (features / 1000).requires_grad_()
    loss = views(features, mask, generator=torch.Generator().manual_seed(0))[0]
    loss.backward()
    assert features.grad[~mask].abs().sum() == 0 and features.grad[mask].abs().sum() > 0
    changed = features.detach().clone()
    changed[~mask] = 7.0
    assert views(changed, mask, generator=torch.Generator().manual_seed(0))[0].item() == pytest.approx(loss.item())
    view, view_mask, _ = random_view(features.detach(), mask, 0.5, 512, generator=torch.Generator().manual_seed(0))
    assert not view_mask.all()  # the views of unequal bags are padded in turn
    padded = view.clone()
    padded[~view_mask] = 7.0
    assert torch.allclose(views.embed(padded, view_mask), views.embed(view, view_mask), atol=1e-6)


def test_the_objective_refuses_what_it_cannot_pretrain():
    with pytest.raises(TypeError, match="WSITransformer"):
        BagViews(create_model("abmil_tiny", feature_dim=3, num_classes=1))
    model = create_model("vitwsi_tiny", feature_dim=3, num_classes=1)
    for share in (0.0, 1.0):
        with pytest.raises(ValueError, match="view_share"):
            BagViews(model, share)


@pytest.mark.parametrize("batch", [2, 5])
def test_the_chance_level_is_the_loss_of_views_that_learned_nothing(batch):
    model = create_model("vitwsi_tiny", attention="seqnorm", feature_dim=3, num_classes=1)
    views = BagViews(model)
    last = views.projector[-1]
    torch.nn.init.zeros_(last.weight)
    torch.nn.init.ones_(last.bias)  # every projection alike, whatever the bag
    features, mask = _bags([6, 9, 4, 7, 5][:batch])
    loss = views(features, mask, generator=torch.Generator().manual_seed(0))[0]
    assert loss.item() == pytest.approx(BagViews.chance_loss(batch), rel=1e-5)


def _config(*overrides):
    return load_config(None, ["data.kind=synthetic_wsi", "model.name=vitwsi_tiny", "model.attention=seqnorm",
                              "pretrain.epochs=4", "pretrain.batch_size=8", "pretrain.warmup_epochs=1",
                              "pretrain.lr=3e-3", "train.threads=1", *overrides])


def test_bag_pretraining_lowers_its_loss_reproducibly_and_starts_a_bag_run_of_any_readout(tmp_path):
    from medattn.train import fit

    bundle = bag_bundle(24)
    config = _config()
    summary = pretrain(config, bundle, tmp_path / "pre", progress=False, log=lambda m: None)
    assert summary["objective"] == "two views of a bag" and summary["steps"] == 12
    assert summary["feature_norm"]["bags"] == 24
    assert summary["chance_loss"] == pytest.approx(math.log(15))  # batches of 8 bags: 15 others for each view
    rows = list(csv.DictReader((tmp_path / "pre" / "metrics.csv").open()))
    assert float(rows[-1]["loss"]) < float(rows[0]["loss"])
    again = pretrain(config, bundle, tmp_path / "again", progress=False, log=lambda m: None)
    assert again["final_loss"] == summary["final_loss"]
    best = tmp_path / "pre" / "checkpoints" / "best"
    stored = checkpoint.header_shapes(best)
    assert not any(k.startswith(("projector", "norm.")) for k in stored)
    assert checkpoint.load_meta(best)["pretrained"]["objective"] == "two views of a bag"
    trained = checkpoint.load_weights(best)
    for readout in ("max", "mean"):
        lines = []
        run = fit(load_config(None, [*_config_args(), f"model.kwargs.readout={readout}"]), bundle,
                  tmp_path / readout, init_from=tmp_path / "pre", progress=False, log=lines.append)
        assert run["init_from"]["pretrained"]["objective"] == "two views of a bag"
        assert any("pretrained by two views of a bag" in line for line in lines)
        assert not any(k.startswith(("encoder.blocks", "feature_proj")) for k in run["init_from"]["new_tensors"])
    fresh = create_model("vitwsi_tiny", attention="seqnorm", feature_dim=16, num_classes=1)
    from medattn.train.model_setup import initialise

    initialise(fresh, tmp_path / "pre", lambda m: None)
    assert torch.equal(fresh.state_dict()["feature_proj.weight"], trained["feature_proj.weight"])


def _config_args():
    return ["data.kind=synthetic_wsi", "model.name=vitwsi_tiny", "model.attention=seqnorm", "train.epochs=1",
            "train.batch_size=4", "train.threads=1", "eval.bootstrap=0", "eval.heatmaps=0", "recipe.search=false"]


def test_bag_pretraining_refuses_a_batch_without_negatives_and_a_model_it_cannot_pretrain(tmp_path):
    with pytest.raises(UserError, match="two views of a bag needs at least 2 samples a step"):
        pretrain(_config("pretrain.batch_size=1"), bag_bundle(8), tmp_path / "one", progress=False,
                 log=lambda m: None)
    with pytest.raises(UserError, match="two views of a bag needs at least 2 unlabelled inputs, got 1"):
        pretrain(_config(), bag_bundle(1), tmp_path / "single", progress=False, log=lambda m: None)
    offered = "; ".join(f"{o.name} pretrains {o.model_type.__name__}" for o in OBJECTIVES)
    with pytest.raises(UserError, match="no objective pretrains model 'abmil_tiny'") as error:
        pretrain(_config("model.name=abmil_tiny", "model.attention=null"), bag_bundle(8), tmp_path / "mil",
                 progress=False, log=lambda m: None)
    assert offered in str(error.value)


def test_an_unlabelled_pool_of_feature_files_joins_the_training_bags_but_never_the_held_out_ones(tmp_path):
    """CLAM H5 bags listed in a CSV of paths are read by the training split's bag reader; the config's validation
    and test bags listed there are left out."""
    from medattn.data import build_datasets
    from writers import write_bag_cohort, write_csv

    splits = ["train", "train", "val", "test", "train", "train", "val", "test", "train"]
    labelled = write_bag_cohort(tmp_path, [[i % 2, split] for i, split in enumerate(splits)], ["label", "split"],
                                tiles=lambda i: 6 + i)
    write_bag_cohort(tmp_path / "pool", [[]] * 5, [], tiles=lambda i: 10, seed=1)  # five bags of no patient listed
    pool = write_csv(tmp_path / "pool.csv", ["path"], [[f"pool/feats/s{i}.h5"] for i in range(5)] + [["feats/s2.h5"]])
    config = _config(*(f"data.{key}={value}" for key, value in labelled.items()), "data.label_columns=label",
                     "data.split_column=split", "pretrain.epochs=1", "pretrain.batch_size=4", f"pretrain.pool={pool}")
    bundle = build_datasets(config["data"], seed=0)
    summary = pretrain(config, bundle, tmp_path / "pre", progress=False, log=lambda m: None)
    assert (summary["train_cases"], summary["pool_cases"], summary["pool_held_out"]) == (5, 5, 1)
    assert summary["feature_norm"]["bags"] == 10 and summary["steps"] == 2
