"""Augmentation: exact rotations and flips, seeded randomness, bad arguments."""

from __future__ import annotations

import math

import pytest
import torch

from medattn.data.transforms import RandomFlip3d, RandomRotateFlip2d, rotate2d


def test_rotate_by_right_angles_is_exact():
    image = torch.rand(2, 6, 6)
    torch.testing.assert_close(rotate2d(image, 0.0), image)
    quarter = rotate2d(image, math.pi / 2)
    assert torch.allclose(quarter, torch.rot90(image, 1, (1, 2)), atol=1e-5) or torch.allclose(
        quarter, torch.rot90(image, -1, (1, 2)), atol=1e-5)
    torch.testing.assert_close(rotate2d(image, math.pi), image.flip(1, 2), atol=1e-5, rtol=0)


def test_rotation_keeps_a_non_square_disc_round():
    H, W = 20, 40
    y, x = torch.meshgrid(torch.arange(H) - (H - 1) / 2, torch.arange(W) - (W - 1) / 2, indexing="ij")
    disc = ((x**2 + y**2) < 36).float()[None]
    rotated = rotate2d(disc, math.radians(37))
    assert (rotated - disc).abs().mean() < 0.02  # the aspect ratio is undone: a disc stays a disc


def test_random_rotate_flip():
    image = torch.rand(1, 8, 8)
    flip_only = RandomRotateFlip2d(max_degrees=0, p_vflip=1.0)
    torch.testing.assert_close(flip_only(image), image.flip(1))
    augment = RandomRotateFlip2d()
    torch.manual_seed(5)
    first = [augment(image) for _ in range(4)]
    torch.manual_seed(5)
    assert all(torch.equal(a, augment(image)) for a in first)
    assert not torch.equal(first[0], first[1])


def test_random_flip_3d():
    volume = torch.rand(1, 3, 4, 5)
    assert torch.equal(RandomFlip3d(p=1.0)(volume), volume.flip(1, 2, 3))
    assert torch.equal(RandomFlip3d(p=0.0)(volume), volume)
    torch.manual_seed(0)
    outcomes = {tuple(RandomFlip3d()(volume)[0, 0, 0, :1].tolist() + RandomFlip3d()(volume)[0, :1, 0, 0].tolist())
                for _ in range(30)}
    assert len(outcomes) > 2


def test_bad_arguments():
    with pytest.raises(ValueError):
        RandomRotateFlip2d(max_degrees=-1)
    with pytest.raises(ValueError):
        RandomFlip3d(p=2)
    with pytest.raises(ValueError, match=r"\(C, H, W, D\)"):
        RandomFlip3d()(torch.zeros(3, 3))
