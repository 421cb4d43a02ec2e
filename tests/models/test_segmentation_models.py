"""3D segmentation networks with and without PAM, Dice loss and metric, and the synthetic vertebra task."""

import pytest
import torch

from medattn.generators.synthetic_vertebrae import SyntheticVertebrae, make_vertebrae
from medattn.models.segmentation import DilatedFCN3D, UNet3D, dice_per_class, soft_dice_loss
from medattn.models.segmentation.blocks import count_parameters

# Networks without PAM get the fewest extra first-layer channels that give them at least the parameters of
# their PAM twin: the excess is below one such channel, and below 2 % at the paper-sized defaults.
NETWORKS = [(UNet3D, dict(base_channels=4, depth=2)), (DilatedFCN3D, dict(width=6, num_blocks=2))]


@pytest.mark.parametrize("cls, kwargs", NETWORKS)
def test_matched_parameter_counts(cls, kwargs):
    with_pam = count_parameters(cls(num_classes=3, use_pam=True, **kwargs))
    without = cls(num_classes=3, **kwargs)
    assert without.pam is None and without.stem_extra > 0
    one_less = count_parameters(cls(num_classes=3, stem_extra=without.stem_extra - 1, **kwargs))
    assert one_less < with_pam <= count_parameters(without)


@pytest.mark.parametrize("cls", [UNet3D, DilatedFCN3D])
def test_matched_parameter_counts_at_defaults(cls):
    with_pam, without = count_parameters(cls(use_pam=True)), count_parameters(cls())
    assert with_pam <= without <= 1.02 * with_pam


@pytest.mark.parametrize("cls, kwargs", NETWORKS)
@pytest.mark.parametrize("use_pam", [False, True])
def test_forward_backward(cls, kwargs, use_pam):
    torch.manual_seed(0)
    net = cls(in_chans=2, num_classes=3, use_pam=use_pam, **kwargs)
    x = torch.randn(2, 2, 8, 8, 12)
    logits = net(x)
    assert logits.shape == (2, 3, 8, 8, 12)
    soft_dice_loss(logits, torch.randint(0, 3, (2, 8, 8, 12))).backward()
    missing = [name for name, p in net.named_parameters() if p.grad is None]
    assert not missing


PAM_NETWORKS = [(UNet3D, dict(base_channels=4, depth=depth)) for depth in (1, 2, 3)] + [
    (DilatedFCN3D, dict(width=6, num_blocks=2))]


@pytest.mark.parametrize("cls, kwargs", PAM_NETWORKS)
def test_pam_acts(cls, kwargs):
    """The PAM runs once per forward, its parameters get gradients and changing them changes the output."""
    torch.manual_seed(0)
    net = cls(num_classes=3, use_pam=True, **kwargs)
    calls = []
    net.pam.register_forward_hook(lambda module, inputs, output: calls.append(inputs[0].shape[2:]))
    x = torch.randn(1, 1, 8, 8, 16)
    logits = net(x)
    assert len(calls) == 1
    logits.square().sum().backward()
    for name, param in net.pam.named_parameters():
        assert param.grad is not None and param.grad.abs().max() > 0, name
    with torch.no_grad():
        pam = net.pam[0].pam if isinstance(net.pam, torch.nn.Sequential) else net.pam.pam
        pam.descriptors.weight.add_(torch.randn_like(pam.descriptors.weight))
        assert (net(x) - logits).abs().max() > 1e-3


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_unet_pam_is_at_half_resolution(depth):
    # The landed U-Net applied the PAM only after decoder level 1, which depth 1 (the presets) does not have.
    net = UNet3D(num_classes=2, base_channels=4, depth=depth, use_pam=True)
    seen = []
    net.pam.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0].shape[1:]))
    net(torch.randn(1, 1, 8, 8, 16))
    assert seen == [torch.Size([8, 4, 4, 8])]  # level-1 width (2 x base), half of (8, 8, 16)


def test_unet_rejects_indivisible_size():
    with pytest.raises(ValueError):
        UNet3D(depth=2)(torch.randn(1, 1, 6, 8, 8))


def test_dilated_rejects_bad_width():
    with pytest.raises(ValueError):
        DilatedFCN3D(width=10, dilations=(1, 2, 4))


def test_dice_loss_perfect_and_wrong():
    target = torch.randint(0, 3, (1, 4, 4, 4))
    perfect = torch.nn.functional.one_hot(target, 3).movedim(-1, 1).float() * 100
    assert soft_dice_loss(perfect, target).item() == pytest.approx(0, abs=1e-4)
    wrong = torch.nn.functional.one_hot((target + 1) % 3, 3).movedim(-1, 1).float() * 100
    assert soft_dice_loss(wrong, target).item() == pytest.approx(1, abs=1e-4)


def test_dice_per_class_by_hand():
    target = torch.tensor([0, 0, 1, 1, 2, 2])
    prediction = torch.tensor([0, 1, 1, 1, 0, 0])
    dice = dice_per_class(prediction, target, num_classes=4)
    expected = [2 * 1 / (3 + 2), 2 * 2 / (3 + 2), 0.0]
    torch.testing.assert_close(dice[:3], torch.tensor(expected, dtype=torch.float64))
    assert torch.isnan(dice[3])


def test_synthetic_task_is_deterministic_and_labelled_top_down():
    image, label = make_vertebrae(5)
    image2, label2 = make_vertebrae(5)
    assert torch.equal(image, image2) and torch.equal(label, label2)
    assert image.shape == (1, 16, 16, 64) and image.dtype == torch.float32 and label.dtype == torch.int64
    assert not torch.equal(make_vertebrae(6)[1], label)
    centres = [(label == k).nonzero()[:, 2].float().mean().item() for k in range(1, 5)]
    assert centres == sorted(centres)  # label k is the k-th blob from the top of the column


def test_synthetic_blobs_look_alike_and_column_start_varies():
    starts = []
    for seed in range(8):
        image, label = make_vertebrae(seed, noise=0.0)
        means = [image[0][label == k].mean().item() for k in range(1, 5)]
        assert max(means) - min(means) < 0.25  # blobs are near-identical in brightness
        starts.append((label == 1).nonzero()[:, 2].float().mean().item())
    assert max(starts) - min(starts) > 10  # more than one spacing: position alone does not give the label


def test_synthetic_dataset_splits_differ():
    train, val = SyntheticVertebrae(2, seed=1), SyntheticVertebrae(2, seed=1, split="val")
    assert train.num_classes == 5 and len(train) == 2
    assert torch.equal(train[1][0], SyntheticVertebrae(2, seed=1)[1][0])
    assert not torch.equal(train[0][1], val[0][1])
    with pytest.raises(IndexError):
        train[2]
