"""The VQ-AE's EMA sub-codebooks, patching, the absorbing transformer and its masking schedule."""

import math

import pytest
import torch
import torch.nn.functional as F

from medattn.attention import available_attentions
from medattn.diffusion.codebook import SubCodebookEMA
from medattn.diffusion.transformer import AbsorbingTransformer, absorbing_loss, mask_schedule, masked_ce, per_head_ce
from medattn.diffusion.vqae import (
    VQAutoencoder3d,
    decode_volume,
    encode_volume,
    from_patches,
    grid_to_patch_tokens,
    patch_tokens_to_grid,
    to_patches,
)
from medattn.errors import UserError


def test_ema_moves_assigned_codes_toward_their_vectors_and_leaves_others():
    book = SubCodebookEMA(dim=4, num_codebooks=2, codebook_size=3, decay=0.9, dead_threshold=0.0).train()
    book.initialised.fill_(True)
    book.codes.copy_(torch.tensor([[[0.0, 0.0], [10.0, 10.0], [-10.0, 5.0]],
                                   [[1.0, 1.0], [5.0, -5.0], [9.0, 9.0]]]))
    book.code_sum.copy_(book.codes)
    book.cluster_size.fill_(1.0)
    before = book.codes.clone()
    z = torch.tensor([[0.5, 0.5, 1.5, 1.5], [1.0, 0.0, 1.2, 0.8]])  # group 0 -> entry 0, group 1 -> entry 0
    _, indices, _ = book(z)
    assert indices.tolist() == [[0, 0], [0, 0]]
    for g, target in ((0, z[:, :2].mean(0)), (1, z[:, 2:].mean(0))):
        assert (book.codes[g, 0] - target).norm() < (before[g, 0] - target).norm()
    # the EMA formula by hand for group 0, entry 0: N = 0.9 + 0.1 * 2, S = 0.9 * e + 0.1 * sum
    n = book.cluster_size[0]
    assert torch.allclose(n, torch.tensor([1.1, 0.9, 0.9]))
    smoothed = (n + book.eps) / (n.sum() + 3 * book.eps) * n.sum()
    expected = (0.9 * before[0, 0] + 0.1 * z[:, :2].sum(0)) / smoothed[0]
    assert torch.allclose(book.codes[0, 0], expected, atol=1e-6)
    # unassigned entries keep their direction and only shrink or grow by the smoothing, not move to data
    assert torch.allclose(book.codes[0, 1] / book.codes[0, 1].norm(), before[0, 1] / before[0, 1].norm())


def test_ema_codebook_converges_to_cluster_means():
    torch.manual_seed(1)
    book = SubCodebookEMA(dim=2, num_codebooks=1, codebook_size=2, decay=0.8).train()
    centres = torch.tensor([[-3.0, 0.0], [3.0, 0.0]])
    for _ in range(60):
        z = centres[torch.randint(2, (64,))] + 0.1 * torch.randn(64, 2)
        book(z)
    found = sorted(book.codes[0].tolist())
    assert torch.allclose(torch.tensor(found), centres, atol=0.2)


def test_dead_codes_restart_at_batch_vectors_and_eval_never_changes_the_codebook():
    book = SubCodebookEMA(dim=2, num_codebooks=1, codebook_size=4, decay=0.5, dead_threshold=0.05).train()
    z = torch.tensor([[1.0, 1.0]]).repeat(8, 1)
    for _ in range(6):
        book(z)
    # every entry is now either assigned or restarted at the only batch vector
    assert torch.allclose(book.codes[0], torch.tensor([1.0, 1.0]).expand(4, 2), atol=1e-3)
    assert book.usage().item() == 1.0
    book.eval()
    state = {k: v.clone() for k, v in book.state_dict().items()}
    book(torch.randn(16, 2))
    assert all(torch.equal(state[k], v) for k, v in book.state_dict().items())


def test_straight_through_gradient_and_commitment():
    book = SubCodebookEMA(dim=8, num_codebooks=4, codebook_size=5).train()
    z = torch.randn(10, 8, requires_grad=True)
    quantised, indices, loss = book(z)
    assert quantised.shape == (10, 8) and indices.shape == (10, 4) and indices.max() < 5
    assert torch.allclose(quantised, book.lookup(indices))
    (quantised.sum() + loss).backward()
    expected = 1 + 2 * book.commitment * (z - book.lookup(indices)).detach() / z.numel()
    assert torch.allclose(z.grad, expected, atol=1e-6)
    with pytest.raises(ValueError, match="divisible"):
        SubCodebookEMA(dim=10, num_codebooks=4)


def test_patches_and_token_grids_round_trip():
    volume = torch.randn(2, 1, 16, 24, 8)
    patches = to_patches(volume, 8)
    assert patches.shape == (12, 1, 8, 8, 8)
    assert torch.equal(patches[1, 0], volume[0, 0, :8, 8:16, :8])  # raster order (h, w, d) with d fastest
    assert torch.equal(from_patches(patches, (2, 3, 1)), volume)
    tokens = torch.arange(2 * 4 * 6 * 2 * 3).reshape(2, 4, 6, 2, 3)
    per_patch = grid_to_patch_tokens(tokens, 2)
    assert torch.equal(per_patch[0, :, :, :, 0], tokens[0, :2, :2, :2, 0])
    assert torch.equal(patch_tokens_to_grid(per_patch, (2, 3, 1)), tokens)
    with pytest.raises(UserError, match="not a multiple of the patch size 8"):
        to_patches(torch.randn(1, 1, 16, 20, 8), 8)


def test_vqae_shapes_and_volume_encoding():
    vqae = VQAutoencoder3d(patch_size=8, latent_size=2, channels=[4, 4], embed_dim=16, num_codebooks=8,
                           codebook_size=8)
    patches = torch.randn(3, 1, 8, 8, 8)
    recon, indices, loss = vqae(patches)
    assert recon.shape == patches.shape and indices.shape == (3, 2, 2, 2, 8) and loss.ndim == 0
    vqae.eval()
    volume = torch.rand(1, 1, 16, 8, 24)
    tokens = encode_volume(vqae, volume)
    assert tokens.shape == (1, 4, 2, 6, 8)
    decoded = decode_volume(vqae, tokens)
    patch_tokens = vqae.quantise(vqae.encode(to_patches(volume, 8)))[1]
    assert torch.allclose(decoded, from_patches(vqae.decode_indices(patch_tokens), (2, 1, 3)))
    with pytest.raises(ValueError, match="power of two"):
        VQAutoencoder3d(patch_size=24, latent_size=2, channels=[4])


def test_mask_schedule_masks_round_n_t_over_t_positions():
    g = torch.Generator().manual_seed(0)
    t, masked = mask_schedule(500, 40, 16, g)
    assert t.min() >= 1 and t.max() <= 16 and len(t.unique()) == 16
    expected = (40 * t.double() / 16).round().clamp(1, 40).long()
    assert torch.equal(masked.sum(1), expected)
    # every position is equally likely to be masked
    per_position = masked.float().mean(0)
    assert (per_position - per_position.mean()).abs().max() < 0.15
    _, few = mask_schedule(50, 1000, 1000, torch.Generator().manual_seed(1))
    assert few.sum(1).min() >= 1


def test_loss_is_mean_of_head_cross_entropies_over_masked_positions():
    model = AbsorbingTransformer((2, 2, 2), num_codebooks=3, codebook_size=5, dim=16, depth=1, num_heads=2)
    tokens = torch.randint(5, (2, 8, 3))
    masked = torch.zeros(2, 8, dtype=torch.bool)
    masked[0, [1, 4]] = True
    masked[1, 7] = True
    logits = model(tokens.masked_fill(masked[..., None], model.mask_index))
    assert logits.shape == (2, 8, 3, 5)
    assert per_head_ce(logits, tokens).shape == (2, 8, 3)
    by_hand = []
    for b, positions in ((0, [1, 4]), (1, [7])):
        ces = [F.cross_entropy(logits[b, i, h][None], tokens[b, i, h][None]) for i in positions for h in range(3)]
        by_hand.append(torch.stack(ces).mean())
    assert torch.allclose(masked_ce(model, tokens, masked), torch.stack(by_hand).mean(), atol=1e-6)
    loss = absorbing_loss(model, tokens, timesteps=10, generator=torch.Generator().manual_seed(0))
    assert loss.ndim == 0 and math.isfinite(float(loss))
    with pytest.raises(ValueError, match="expected tokens"):
        model(torch.zeros(2, 7, 3, dtype=torch.long))


@pytest.mark.parametrize("attention", available_attentions())
def test_every_mechanism_plugs_into_the_transformer(attention):
    model = AbsorbingTransformer((2, 3, 2), num_codebooks=2, codebook_size=4, dim=16, depth=1, num_heads=2,
                                 attention=attention)
    tokens = torch.randint(5, (2, 12, 2))  # index 4 is the mask
    logits = model(tokens)
    assert logits.shape == (2, 12, 2, 4) and torch.isfinite(logits).all()
    absorbing_loss(model, tokens.clamp(max=3), 8, torch.Generator().manual_seed(0)).backward()
    assert model.pos_embed.grad.abs().sum() > 0
    assert model.encoder.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
