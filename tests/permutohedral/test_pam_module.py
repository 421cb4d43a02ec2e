"""PAM module: shapes, gradients to every parameter, grouping, bad input."""

import pytest
import torch

from medattn.permutohedral import PAM, permutohedral_filter


def test_shapes_and_backward():
    torch.manual_seed(0)
    pam = PAM(6, 8, feature_dim=4, groups=2)
    x = torch.randn(2, 6, 5, 6, 7, requires_grad=True)
    out = pam(x)
    assert out.shape == (2, 8, 5, 6, 7)
    assert torch.isfinite(out).all()
    out.square().sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    for name, param in pam.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name


def test_groups_have_their_own_lattice():
    torch.manual_seed(1)
    pam = PAM(3, 4, feature_dim=2, groups=2)
    x = torch.randn(1, 3, 4, 4, 4)
    coords = pam._coordinates(x) * pam.coord_scale.view(1, 3, 1, 1, 1)
    f = pam.act(pam.features(torch.cat([x, coords], 1))).flatten(2)[0].t()  # (N, 4)
    v = pam.descriptors(x).flatten(2)[0].t()  # (N, 4)
    expected = torch.cat([permutohedral_filter(v[:, :2], f[:, :2], normalize=True),
                          permutohedral_filter(v[:, 2:], f[:, 2:], normalize=True)], dim=1)
    torch.testing.assert_close(pam(x).flatten(2)[0].t(), expected)


def test_batch_items_are_independent():
    torch.manual_seed(2)
    pam = PAM(2, 4)
    x = torch.randn(2, 2, 4, 4, 3)
    torch.testing.assert_close(pam(x)[1:], pam(x[1:]))


@pytest.mark.parametrize("kwargs", [dict(out_channels=5, groups=2), dict(out_channels=4, feature_dim=0)])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        PAM(3, **kwargs)


def test_bad_input_shape():
    with pytest.raises(ValueError):
        PAM(3, 4)(torch.randn(1, 3, 8, 8))


def test_pam_is_non_local():
    """An output voxel depends on an input voxel at the far end of the volume (a 1x1x1 layer could not)."""
    torch.manual_seed(3)
    pam = PAM(4, 4)
    x = torch.randn(1, 4, 4, 4, 8, requires_grad=True)
    pam(x)[0, :, 0, 0, 0].sum().backward()
    assert x.grad[0, :, -1, -1, -1].abs().max() > 1e-4


@pytest.mark.parametrize("name", ["descriptors", "features", "coord_scale"])
def test_output_follows_parameters(name):
    torch.manual_seed(4)
    pam = PAM(3, 4)
    x = torch.randn(1, 3, 4, 4, 4)
    before = pam(x)
    with torch.no_grad():
        param = pam.get_parameter(f"{name}.weight" if name != "coord_scale" else name)
        param.add_(torch.randn_like(param))
    assert (pam(x) - before).abs().max() > 1e-3
