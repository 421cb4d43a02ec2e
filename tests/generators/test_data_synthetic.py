"""The synthetic benchmark: shapes, determinism per (seed, split, index), labels that follow their rule."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from medattn.data import build_datasets, collate
from medattn.data.seeded import item_generator
from medattn.errors import UserError
from medattn.generators.synthetic_cxr import render_cxr
from medattn.generators.synthetic_wsi import PATCH_PIXELS, feature_space

SMALL = {  # the generators without training augmentation (its default: test_recipe.py)
    "synthetic_cxr": {"image_size": 32, "num_samples": [16, 8, 8], "augment": False},
    "synthetic_breast_mri": {"volume_size": [16, 16, 8], "num_samples": [16, 8, 8], "augment": False},
    "synthetic_wsi": {"num_instances": [20, 60], "feature_dim": 8, "num_samples": [16, 8, 8]},
}
SHAPES = {"synthetic_cxr": (1, 32, 32), "synthetic_breast_mri": (1, 16, 16, 8), "synthetic_wsi": (8,)}


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_shapes_task_and_names(kind):
    bundle = build_datasets({"kind": kind, **SMALL[kind]}, seed=3)
    assert bundle.task.synthetic and bundle.task.input_shape == SHAPES[kind] and bundle.task.task_type == "binary"
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (16, 8, 8)
    batch = collate([bundle.train[i] for i in range(4)])
    assert batch["input"].dtype == torch.float32 and torch.isfinite(batch["input"]).all()
    assert batch["label"].shape == (4, 1) and set(batch["label"].flatten().tolist()) <= {0.0, 1.0}
    assert all(i.startswith(kind) for i in batch["id"])
    if kind == "synthetic_wsi":
        assert batch["mask"].shape == batch["input"].shape[:2] and batch["coords"].shape[-1] == 2
    else:
        assert batch["input"].shape[1:] == SHAPES[kind]


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_deterministic_per_seed_split_index(kind):
    cfg = {"kind": kind, **SMALL[kind]}
    a, b = build_datasets(cfg, seed=1), build_datasets(cfg, seed=1)
    forward = [a.train[i]["input"] for i in range(4)]
    backward = [b.train[i]["input"] for i in reversed(range(4))][::-1]
    assert all(torch.equal(x, y) for x, y in zip(forward, backward))
    assert not torch.equal(a.train[0]["input"], a.val[0]["input"])
    assert not torch.equal(a.train[0]["input"], build_datasets(cfg, seed=2).train[0]["input"])
    assert torch.equal(build_datasets({**cfg, "seed": 7}, seed=1).train[0]["input"],
                       build_datasets({**cfg, "seed": 7}, seed=5).train[0]["input"])


def test_labels_are_balanced_enough():
    bundle = build_datasets({"kind": "synthetic_cxr", "image_size": 16, "num_samples": [200, 1, 1]})
    positives = sum(bundle.train[i]["label"].item() for i in range(200))
    assert 70 < positives < 130


def test_cxr_label_is_the_cardiothoracic_ratio_at_any_resolution():
    for index in range(4):
        small, ctr = render_cxr(64, item_generator("synthetic_cxr", 0, "train", index))
        large, ctr_large = render_cxr(128, item_generator("synthetic_cxr", 0, "train", index))
        assert ctr == ctr_large and small.shape == (1, 64, 64) and large.shape == (1, 128, 128)
        assert 0.35 <= ctr <= 0.65 and abs(ctr - 0.5) >= 0.03
        down = F.avg_pool2d(large[None], 2)[0]  # the same phantom, drawn at twice the resolution
        correlation = torch.corrcoef(torch.stack([down.flatten(), small.flatten()]))[0, 1]
        assert correlation > 0.9, correlation  # same anatomy; only the pixel noise differs
    bundle = build_datasets({"kind": "synthetic_cxr", "image_size": 64, "num_samples": [8, 1, 1]})
    for index in range(8):
        _, ctr = render_cxr(64, item_generator("synthetic_cxr", 0, "train", index))
        assert bundle.train[index]["label"].item() == float(ctr > 0.5)


def test_cxr_in_chans_and_normalisation():
    bundle = build_datasets({"kind": "synthetic_cxr", "image_size": 32, "in_chans": 3, "num_samples": 4,
                             "mean": 0.0, "std": 1.0})
    x = bundle.train[0]["input"]
    assert x.shape == (3, 32, 32) and torch.equal(x[0], x[2]) and 0 <= x.min() and x.max() <= 1
    assert bundle.task.input_shape == (3, 32, 32)


def test_breast_sides_share_a_patient():
    bundle = build_datasets({"kind": "synthetic_breast_mri", **SMALL["synthetic_breast_mri"]})
    left, right = bundle.train[4], bundle.train[5]
    assert left["patient"] == right["patient"] != bundle.train[6]["patient"]
    assert left["id"].endswith("left") and right["id"].endswith("right")
    labels = [bundle.train[i]["label"].item() for i in range(16)]
    assert 0 < sum(labels) < 16


def test_wsi_positive_bags_hold_tumour_instances():
    cfg = {"kind": "synthetic_wsi", "num_instances": [100, 300], "feature_dim": 16, "num_samples": [20, 1, 1],
           "tumour_shift": 6.0}
    bundle = build_datasets(cfg, seed=0)
    centres, tumour = feature_space(16, 6.0, 0)
    labels = []
    for i in range(20):
        sample = bundle.train[i]
        n = sample["input"].shape[0]
        assert 100 <= n <= 300 and sample["coords"].shape == (n, 2)
        assert torch.equal(sample["coords"] % PATCH_PIXELS, torch.zeros(n, 2))
        assert len({tuple(c) for c in sample["coords"].tolist()}) == n  # one patch per grid cell
        nearest = torch.cdist(sample["input"], torch.cat([centres, tumour[None]])).argmin(dim=1)
        tumour_like = int((nearest == len(centres)).sum())  # nearer to the tumour centre than to any tissue
        if sample["label"].item():
            assert tumour_like >= max(2, 0.015 * n), (i, tumour_like)
        else:
            assert tumour_like < 0.01 * n, (i, tumour_like)
        labels.append(sample["label"].item())
    assert 0 < sum(labels) < 20


def test_wsi_max_instances_only_in_training():
    cfg = {"kind": "synthetic_wsi", "num_instances": [50, 60], "feature_dim": 4, "num_samples": 2,
           "max_instances": 10}
    bundle = build_datasets(cfg)
    assert bundle.train[0]["input"].shape == (10, 4) and bundle.val[0]["input"].shape[0] >= 50


def test_augmentation_only_in_training_and_seeded():
    cfg = {"kind": "synthetic_cxr", "image_size": 32, "num_samples": 4, "augment": True}
    bundle, plain = build_datasets(cfg), build_datasets({**cfg, "augment": False})
    torch.manual_seed(0)
    first = bundle.train[0]["input"]
    torch.manual_seed(0)
    assert torch.equal(first, bundle.train[0]["input"])
    assert not torch.equal(first, plain.train[0]["input"])
    assert torch.equal(bundle.val[0]["input"], plain.val[0]["input"])


def test_bad_configs():
    with pytest.raises(UserError, match="unknown data kind"):
        build_datasets({"kind": "nope"})
    with pytest.raises(UserError, match="does not take image_sise"):
        build_datasets({"kind": "synthetic_cxr", "image_sise": 32})
    with pytest.raises(UserError, match="num_samples"):
        build_datasets({"kind": "synthetic_wsi", "num_samples": [1, 2]})
    with pytest.raises(ValueError, match="num_instances"):
        build_datasets({"kind": "synthetic_wsi", "num_instances": [10, 5]})


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_cache_equals_fresh_rendering_and_stays_unaugmented(kind):
    cfg = {"kind": kind, **SMALL[kind], "augment": True} if kind != "synthetic_wsi" else {
        "kind": kind, **SMALL[kind], "max_instances": 10}
    cached, fresh = build_datasets(cfg), build_datasets({**cfg, "cache": False})
    draws = []
    for dataset in (cached, fresh, cached):  # the second cached access comes from the cache
        torch.manual_seed(0)
        draws.append([dataset.train[i]["input"] for i in range(3)])
    assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(*draws))


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_datasets_pickle_for_spawned_workers(kind):
    import pickle

    train = build_datasets({"kind": kind, **SMALL[kind], "seed": 2}).train
    assert torch.equal(pickle.loads(pickle.dumps(train))[1]["input"], train[1]["input"])


def _auroc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Mann-Whitney estimate: the probability that a positive outscores a negative (ties count half)."""
    pos, neg = scores[labels == 1], scores[labels == 0]
    return float(((pos[:, None] > neg[None]).float() + 0.5 * (pos[:, None] == neg[None]).float()).mean())


LEARNABLE = {  # kind: (data config, model preset, epochs, batch size)
    "synthetic_cxr": ({"num_samples": [256, 128, 1]}, "vit2d_small", 6, 32),
    "synthetic_breast_mri": ({"num_samples": [256, 128, 1]}, "vit3d_small", 8, 32),
    "synthetic_wsi": ({"num_samples": [160, 80, 1], "num_instances": [50, 200]}, "vitwsi_small", 6, 8),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(LEARNABLE))
def test_learnable_by_a_small_vit_in_a_few_epochs(kind):
    """The benchmark's promise: a small preset reaches a clearly-above-chance validation AUROC on CPU."""
    from medattn.models import create_model

    cfg, preset, epochs, batch_size = LEARNABLE[kind]
    bundle = build_datasets({"kind": kind, **cfg}, seed=0)
    shape = bundle.task.input_shape
    kwargs = {"feature_dim": shape[0]} if kind == "synthetic_wsi" else {"in_chans": shape[0], "img_size": shape[1:]}
    torch.manual_seed(0)
    model = create_model(preset, attention="softmax", num_classes=1, **kwargs)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)

    def logits(batch):
        return model(batch["input"], mask=batch["mask"]) if "mask" in batch else model(batch["input"])

    train = [bundle.train[i] for i in range(len(bundle.train))]
    for _ in range(epochs):
        order = torch.randperm(len(train)).tolist()
        for start in range(0, len(train), batch_size):
            batch = collate([train[i] for i in order[start:start + batch_size]])
            loss = F.binary_cross_entropy_with_logits(logits(batch), batch["label"])
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
    model.eval()
    with torch.no_grad():
        outputs = [(logits(collate([bundle.val[i]]))[0, 0], bundle.val[i]["label"][0]) for i in range(len(bundle.val))]
    scores, labels = (torch.stack(x) for x in zip(*outputs))
    assert _auroc(scores, labels) > 0.7
