"""The PAM protocol's pieces: random (class-balanced) patches, sliding-window inference, Dice-only loss."""

import copy

import pytest
import torch
import torch.nn.functional as F

from medattn.config import load_config
from medattn.data.base import TaskInfo
from medattn.data.kinds.patches import RandomPatches, crop_at, sample_centre
from medattn.errors import UserError
from medattn.models.segmentation import soft_dice_loss
from medattn.runtime.sliding import gaussian_weights, inference_window, patch_shape, sliding_window_logits
from medattn.train.objectives import objective_for

SEG = TaskInfo("segmentation", "volume3d", 3, (1, 12, 12, 20), ["background", "a", "b"])


def two_class_label() -> torch.Tensor:
    label = torch.zeros(12, 12, 20, dtype=torch.int64)
    label[2:8, 2:8, 2:10] = 1  # 288 voxels
    label[10, 10, 18] = 2  # one voxel: class-balanced sampling still centres on it half the forced time
    return label


def test_centres_are_class_balanced():
    label = two_class_label()
    torch.manual_seed(0)
    n, forced = 4000, 0.6
    hits = torch.tensor([label[sample_centre(label, forced)].item() for _ in range(n)])
    share = {k: (hits == k).float().mean().item() for k in (1, 2)}
    uniform = {k: (label == k).float().mean().item() for k in (1, 2)}
    # forced patches pick class 1 or 2 with p 1/2 each; the others land on a class as often as it has voxels
    for k in (1, 2):
        expected = forced / 2 + (1 - forced) * uniform[k]
        assert abs(share[k] - expected) < 4 * (expected * (1 - expected) / n) ** 0.5, (k, share[k], expected)


def test_centres_without_forcing_are_uniform_and_without_foreground_fall_back():
    label = two_class_label()
    torch.manual_seed(1)
    n = 3000
    hits = torch.tensor([label[sample_centre(label, 0.0)].item() > 0 for _ in range(n)]).float().mean().item()
    expected = (label > 0).float().mean().item()
    assert abs(hits - expected) < 4 * (expected * (1 - expected) / n) ** 0.5
    empty = torch.zeros(4, 5, 6, dtype=torch.int64)
    for _ in range(50):  # forced foreground on a label without foreground: a uniform voxel, no error
        centre = sample_centre(empty, 1.0)
        assert all(0 <= c < n for c, n in zip(centre, empty.shape))


def test_crop_holds_its_centre_and_stays_inside():
    image = torch.arange(12 * 12 * 20, dtype=torch.float32).reshape(1, 12, 12, 20)
    label = torch.arange(12 * 12 * 20).reshape(12, 12, 20)
    for centre in [(0, 0, 0), (11, 11, 19), (6, 3, 10), (11, 0, 7)]:
        patch, patch_label = crop_at(image, label, centre, (4, 5, 8))
        assert patch.shape == (1, 4, 5, 8) and patch_label.shape == (4, 5, 8)
        assert (patch_label == label[centre]).sum() == 1  # the centre voxel is in the patch
        assert torch.equal(patch[0].long(), patch_label)  # image and label cut at the same place


def test_random_patches_pad_small_volumes_and_keep_other_entries():
    image = torch.rand(2, 6, 12, 20) + 1.0
    label = two_class_label()[:6]

    class One(torch.utils.data.Dataset):
        def __len__(self):
            return 1

        def __getitem__(self, i):
            return {"input": image, "label": label, "id": "x", "patient": "p"}

    torch.manual_seed(0)
    sample = RandomPatches(One(), (8, 8, 8), foreground=1.0)[0]
    assert sample["input"].shape == (2, 8, 8, 8) and sample["label"].shape == (8, 8, 8)
    assert sample["id"] == "x" and sample["patient"] == "p"
    # along H (6 < 8) one padded row on each side: label background, image its minimum
    assert (sample["label"][[0, -1]] == 0).all()
    assert torch.allclose(sample["input"][:, [0, -1]], image.min().expand(2, 2, 8, 8))
    with pytest.raises(UserError, match="patch_foreground"):
        RandomPatches(One(), (8, 8, 8), foreground=1.5)
    with pytest.raises(UserError, match="axes"):
        RandomPatches(One(), (8, 8), foreground=0.5)[0]


def conv_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv3d(2, 4, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv3d(4, 3, 3, padding=1))


@pytest.mark.parametrize("shape, window, overlap", [((2, 2, 13, 16, 30), (8, 16, 12), 0.5),
                                                    ((1, 2, 6, 9, 20), (8, 8, 8), 0.25)])
def test_sliding_window_matches_monai(shape, window, overlap):
    inferers = pytest.importorskip("monai.inferers")
    net = conv_net()
    x = torch.randn(shape)
    ours = sliding_window_logits(net, x, window, overlap, batch_size=3)
    with torch.no_grad():
        theirs = inferers.sliding_window_inference(x, window, 3, net, overlap=overlap, mode="gaussian")
    assert ours.shape == x.shape[:1] + (3,) + x.shape[2:]
    torch.testing.assert_close(ours, torch.as_tensor(theirs), rtol=1e-5, atol=1e-6)


def test_sliding_window_equals_whole_volume_forward():
    net = conv_net().eval()
    x = torch.randn(2, 2, 12, 12, 20)
    with torch.no_grad():
        whole = net(x)
    # a window covering the volume is one forward (up to rounding: weighted by g then divided by g, and
    # convolutions of one volume vs. a batch of two)
    torch.testing.assert_close(sliding_window_logits(net, x, (12, 12, 20), 0.5), whole, rtol=1e-5, atol=1e-6)
    # a pointwise model (1x1x1 convolutions) is translation-equivariant without border effects: any tiling
    torch.manual_seed(1)
    pointwise = torch.nn.Sequential(torch.nn.Conv3d(2, 5, 1), torch.nn.Tanh(), torch.nn.Conv3d(5, 3, 1)).eval()
    with torch.no_grad():
        reference = pointwise(x)
    for window, overlap in [((5, 7, 8), 0.5), ((12, 4, 9), 0.0), ((16, 16, 16), 0.25)]:
        torch.testing.assert_close(sliding_window_logits(pointwise, x, window, overlap, batch_size=2), reference,
                                   rtol=1e-5, atol=1e-6)


def test_sliding_window_blends_by_gaussian_weights():
    weights = gaussian_weights((9, 4))
    assert weights.shape == (9, 4) and weights.min() >= 1e-3
    assert weights[4, 1] == weights[4, 2] == weights.max()  # centred at (m - 1) / 2
    # two windows of a model that outputs a constant per call: the blend is the weighted mean of the constants
    calls = []

    def constant(x):
        calls.append(len(calls))
        return torch.full((x.shape[0], 1, *x.shape[2:]), float(len(calls)))

    out = sliding_window_logits(constant, torch.zeros(1, 1, 12), (8,), 0.5)  # windows at 0 and 4
    w = gaussian_weights((8,))
    expected = torch.zeros(12)
    norm = torch.zeros(12)
    expected[0:8] += 1 * w
    norm[0:8] += w
    expected[4:12] += 2 * w
    norm[4:12] += w
    torch.testing.assert_close(out[0, 0], expected / norm)


def test_dice_only_loss_and_its_errors():
    logits, labels = torch.randn(2, 3, 4, 4, 4), torch.randint(0, 3, (2, 4, 4, 4))
    dice = soft_dice_loss(logits, labels, include_background=False)
    assert torch.equal(objective_for(SEG, "dice").loss(logits, labels), dice)
    for default in (None, "dice_ce"):
        torch.testing.assert_close(objective_for(SEG, default).loss(logits, labels),
                                   dice + F.cross_entropy(logits, labels))
    binary = TaskInfo("binary", "image2d", 1, (1, 8, 8))
    with pytest.raises(UserError, match="train.loss=dice"):
        objective_for(binary, "dice")
    with pytest.raises(UserError, match="train.loss"):
        load_config("synthetic_vertebrae", ["train.loss=focal"])


def test_patch_and_window_options():
    config = load_config("synthetic_vertebrae", ["train.patch_size=8"])
    assert patch_shape(config, SEG) == (8, 8, 8)
    assert inference_window(config, SEG) == ((8, 8, 8), 0.5)
    off = copy.deepcopy(config)
    off["eval"]["sliding_window"] = False
    assert inference_window(off, SEG) is None
    assert inference_window(load_config("synthetic_vertebrae"), SEG) is None
    with pytest.raises(UserError, match="needs train.patch_size"):
        inference_window(load_config("synthetic_vertebrae", ["eval.sliding_window=true"]), SEG)
    with pytest.raises(UserError, match="2 axes"):
        patch_shape(load_config("synthetic_vertebrae", ["train.patch_size=[8,8]"]), SEG)
    with pytest.raises(UserError, match="applies to segmentation"):
        patch_shape(config, TaskInfo("binary", "volume3d", 1, (1, 8, 8, 8)))
    with pytest.raises(UserError, match="window_overlap"):
        load_config("synthetic_vertebrae", ["eval.window_overlap=1"])


def test_training_on_patches_with_sliding_window_evaluation(tmp_path, monkeypatch):
    from medattn.data import build_datasets
    from medattn.train import fit, supervised

    config = load_config("synthetic_vertebrae", [
        "train.epochs=1", "train.patch_size=[16,16,32]", "train.loss=dice", "data.num_samples=[4,2,2]",
        "eval.bootstrap=0", "model.name=unet3d"])
    inputs = []  # (batch, spatial shape) of every forward call
    build = supervised.build_model

    def build_and_hook(*args, **kwargs):
        model = build(*args, **kwargs)
        model.register_forward_pre_hook(lambda module, args: inputs.append((args[0].shape[0], args[0].shape[2:])))
        return model

    monkeypatch.setattr(supervised, "build_model", build_and_hook)
    results = fit(config, build_datasets(config["data"], seed=0), tmp_path / "run", progress=False, log=print)
    assert results["test"]["dice"] is not None and results["n_train"] == 4
    # training and evaluation both ran on (16, 16, 32) inputs: patches, then windows over 64-voxel columns
    assert {tuple(shape) for _, shape in inputs} == {(16, 16, 32)}
    # 4 training patches; validation and test: 2 volumes each, windows starting at 0, 16 and 32 along D
    assert sum(n for n, _ in inputs) == 4 + 2 * 3 + 2 * 3
