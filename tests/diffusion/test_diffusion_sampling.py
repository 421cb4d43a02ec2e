"""Sampling (inpainting, synthesis, the random baseline), masks, and PSNR/SSIM against references."""

import math

import pytest
import torch

from medattn.diffusion.inpaint import centre_mask, tokens_to_voxels, voxel_mask_to_tokens
from medattn.diffusion.metrics import gaussian_window, psnr, ssim
from medattn.diffusion.sampling import random_fill, sample_tokens
from medattn.diffusion.transformer import AbsorbingTransformer


def _model():
    return AbsorbingTransformer((3, 2, 2), num_codebooks=2, codebook_size=6, dim=16, depth=1, num_heads=2).eval()


def test_sampler_is_deterministic_under_a_seed_and_seeds_differ():
    model = _model()
    a = sample_tokens(model, batch=2, steps=5, temperature=0.8, seed=3)
    b = sample_tokens(model, batch=2, steps=5, temperature=0.8, seed=3)
    c = sample_tokens(model, batch=2, steps=5, temperature=0.8, seed=4)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.shape == (2, 12, 2) and a.min() >= 0 and a.max() < 6  # every position filled, no mask index left


def test_inpainting_keeps_known_tokens_and_fills_every_unknown_one():
    model = _model()
    tokens = torch.randint(6, (2, 12, 2))
    known = torch.rand(2, 12) < 0.5
    known[0, 0], known[1, 1] = False, False
    out = sample_tokens(model, tokens, known, steps=200, seed=0)
    assert torch.equal(out[known], tokens[known])
    assert (out != model.mask_index).all()


def test_each_step_reveals_a_group_of_positions_in_random_order():
    """With steps = unknown count, each model call sees exactly one more revealed position."""
    model = _model()
    seen = []
    forward = model.forward

    def spy(tokens):
        seen.append(int((tokens != model.mask_index).all(-1).sum()))
        return forward(tokens)

    model.forward = spy
    known = torch.zeros(1, 12, dtype=torch.bool)
    known[0, :4] = True
    sample_tokens(model, torch.zeros(1, 12, 2, dtype=torch.long), known, steps=200, seed=0)
    assert seen == list(range(4, 12))  # 8 unknown positions: 8 steps (fewer than 200), one new each
    seen.clear()
    sample_tokens(model, torch.zeros(1, 12, 2, dtype=torch.long), known, steps=3, seed=0)
    assert seen == [4, 6, 9]  # 8 positions in 3 groups of 2, 3, 3


def test_low_temperature_picks_the_most_likely_index():
    model = _model()
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.copy_(torch.tensor([0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 5.0]))
    out = sample_tokens(model, batch=1, steps=4, temperature=1e-3, seed=0)
    assert (out[..., 0] == 2).all() and (out[..., 1] == 5).all()


def test_random_fill_keeps_known_and_is_seeded():
    tokens = torch.randint(6, (1, 12, 2))
    known = torch.arange(12)[None] % 2 == 0
    a, b = random_fill(tokens, known, 6, seed=1), random_fill(tokens, known, 6, seed=1)
    assert torch.equal(a, b) and torch.equal(a[known], tokens[known]) and a.max() < 6


def test_masks_on_the_token_grid():
    unknown = centre_mask((10, 14, 12), 0.5)
    assert unknown.sum() == 5 * 7 * 6 and unknown[5, 7, 6] and not unknown[0, 0, 0]
    assert centre_mask((2, 2, 2), 0.1).sum() == 1
    voxels = torch.zeros(32, 32, 16)
    voxels[17, 3, 15] = 1
    tokens = voxel_mask_to_tokens(voxels, 16)
    assert tokens.shape == (2, 2, 1) and tokens.sum() == 1 and tokens[1, 0, 0]
    assert tokens_to_voxels(tokens, 16).sum() == 16 ** 3


def _ssim_brute(x, y, win=11, sigma=1.5, data_range=1.0):
    """SSIM by looping over every window position (float64), Wang et al. 2004 with Gaussian weights."""
    g = gaussian_window(win, sigma)
    w = g[:, None, None] * g[None, :, None] * g[None, None, :]
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    values = []
    for i in range(x.shape[0] - win + 1):
        for j in range(x.shape[1] - win + 1):
            for k in range(x.shape[2] - win + 1):
                a, b = x[i:i + win, j:j + win, k:k + win], y[i:i + win, j:j + win, k:k + win]
                ma, mb = (w * a).sum(), (w * b).sum()
                va, vb = (w * (a - ma) ** 2).sum(), (w * (b - mb) ** 2).sum()
                cov = (w * (a - ma) * (b - mb)).sum()
                values.append((2 * ma * mb + c1) * (2 * cov + c2) / ((ma ** 2 + mb ** 2 + c1) * (va + vb + c2)))
    return float(torch.stack(values).mean())


def test_ssim_matches_a_brute_force_reference_and_psnr_its_formula():
    torch.manual_seed(0)
    x = torch.rand(13, 12, 14, dtype=torch.float64)
    y = (x + 0.2 * torch.randn_like(x)).clamp(0, 1)
    assert ssim(x, y) == pytest.approx(_ssim_brute(x, y), abs=1e-10)
    assert ssim(x, x) == pytest.approx(1.0)
    mse = float(((x - y) ** 2).mean())
    assert psnr(x, y) == pytest.approx(10 * math.log10(1 / mse))
    assert psnr(x, y, data_range=2.0) == pytest.approx(10 * math.log10(4 / mse))
    assert psnr(x, x) == math.inf
    with pytest.raises(ValueError, match="smaller than the window"):
        ssim(torch.rand(8, 20, 20), torch.rand(8, 20, 20))


def test_ssim_with_sample_covariance_matches_monai():
    monai_metrics = pytest.importorskip("monai.metrics")
    torch.manual_seed(1)
    x = torch.rand(16, 18, 20)
    y = (x + 0.1 * torch.randn_like(x)).clamp(0, 1)
    theirs = monai_metrics.SSIMMetric(spatial_dims=3, data_range=1.0)(y[None, None], x[None, None])
    assert ssim(y, x, sample_covariance=True) == pytest.approx(float(theirs), abs=1e-5)
