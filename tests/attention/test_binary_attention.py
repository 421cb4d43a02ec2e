"""BinaryFormer mechanisms: gradients, bit-kernel exactness, tiling, masks, value width, training, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from medattn.attention import build_attention
from medattn.attention.binary import binary_attention, binary_dot, pack_signs
from medattn.attention.binary.core import emulated_attention
from medattn.attention.binary.sign import bernoulli_sign, modified_tanh, sign, sign_ste

MECHANISMS = ["binary-ste", "binary-sg", "binary-hamming", "binary-bernoulli"]


def make(name: str, dim: int = 32, num_heads: int = 4, **kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_attention(name, dim=dim, num_heads=num_heads, **kwargs)


def pm1(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x >= 0, 1.0, -1.0).to(x.dtype)


# --- binarisation ---------------------------------------------------------------------------------

def test_sign_of_zero_is_plus_one_and_ste_gradient_is_clipped_identity():
    x = torch.tensor([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0], requires_grad=True)
    y = sign_ste(x)
    assert y.tolist() == [-1, -1, -1, 1, 1, 1, 1]
    y.sum().backward()
    assert x.grad.tolist() == [0, 1, 1, 1, 1, 1, 0]
    assert not sign(x).requires_grad


def test_modified_tanh_and_bernoulli_sign():
    x = torch.linspace(-50, 50, 101)
    assert torch.allclose(modified_tanh(x), 4 * torch.tanh(x / 2))
    small = torch.linspace(-1e-3, 1e-3, 101, dtype=torch.float64)  # through the sigmoid: absolute error only
    torch.testing.assert_close(modified_tanh(small.float()).double(), 4 * torch.tanh(small / 2), rtol=0, atol=1e-6)
    torch.testing.assert_close(modified_tanh(small, beta=2.0), torch.tanh(2 * small) / 0.375)  # float64: exact
    x64 = torch.randn(20, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: modified_tanh(t, 0.5), (x64,))
    # |x| >= 1 is deterministic; x = 0 gives +1 half the time
    assert torch.equal(bernoulli_sign(torch.tensor([-3.0, -1.0, 1.0, 3.0])), torch.tensor([-1.0, -1.0, 1.0, 1.0]))
    g = torch.Generator().manual_seed(0)
    frac = (bernoulli_sign(torch.zeros(20000), generator=g) > 0).float().mean()
    assert abs(float(frac) - 0.5) < 0.02
    with pytest.raises(ValueError):
        modified_tanh(x, beta=0)


# --- bit kernel -----------------------------------------------------------------------------------

@pytest.mark.parametrize("c", [1, 63, 64, 65, 256])
def test_packed_popcount_equals_float_dot_product_exactly(c):
    torch.manual_seed(c)
    a, b = torch.randn(2, 9, c), torch.randn(2, 13, c)
    a[0, 0, 0] = 0.0  # sign(0) = +1 in both
    expected = (pm1(a).double() @ pm1(b).double().transpose(1, 2)).numpy()
    got = binary_dot(pack_signs(a), pack_signs(b), c)
    assert np.issubdtype(got.dtype, np.integer)
    np.testing.assert_array_equal(got.astype(np.float64), expected)


@pytest.mark.parametrize("shape", [(5,), (3, 7), (2, 3, 65), (2, 3, 4, 64), (1, 2, 3, 4, 130)])
def test_packed_bits_equal_numpys_packbits_in_any_layout(shape):
    """The packing kernel against NumPy's ``packbits`` (little bit order, padding cleared) for any rank, a
    permuted (strided) view as a QKV projection gives it, and float64 and bfloat16 input."""
    torch.manual_seed(len(shape))
    x = torch.randn(*shape)
    x[..., 0] = 0.0  # x = 0 packs as set, as sgn(0) = +1

    def reference(t):
        c = t.shape[-1]
        bits = np.zeros((*t.shape[:-1], -(-c // 64) * 64), dtype=bool)
        bits[..., :c] = (t >= 0).numpy()
        return np.packbits(bits, axis=-1, bitorder="little").view(np.uint64)

    np.testing.assert_array_equal(pack_signs(x), reference(x))
    np.testing.assert_array_equal(pack_signs(x.double()), reference(x))
    np.testing.assert_array_equal(pack_signs(x.bfloat16()), reference(x.bfloat16().float()))
    qkv = torch.randn(2, 50, 3, 4, 72).permute(2, 0, 3, 1, 4)  # (3, B, H, N, d) view, last axis contiguous
    np.testing.assert_array_equal(pack_signs(qkv[0]), reference(qkv[0].contiguous()))


@pytest.mark.parametrize("layout", ["contiguous", "qkv-view", "sliced", "expanded", "strided-last", "rank-1"])
def test_storage_rows_are_the_tensors_rows_in_memory_order(layout):
    from medattn.attention.binary.packing import storage_rows

    base = torch.randn(2, 50, 3, 4, 72)
    x = {"contiguous": base[0, :, 0], "qkv-view": base.permute(2, 0, 3, 1, 4)[1],
         "sliced": base[:, ::3, 1, :, 5:40], "expanded": torch.randn(1, 4, 1, 9).expand(3, 4, 5, 9),
         "strided-last": base[0, :, 0, :, ::2], "rank-1": base[0, 0, 0, 0]}[layout]
    rows, flat, starts, order = storage_rows(x)
    c = x.shape[-1]
    assert torch.equal(rows, x.permute(*order, x.ndim - 1))
    got = np.stack([flat[s : s + c] for s in starts]).reshape(rows.shape)
    np.testing.assert_array_equal(got, rows.numpy())
    if layout == "qkv-view":  # (B, H, N, d) of a (B, N, H d) projection: read token by token, heads inside
        assert order == [0, 2, 1] and bool((np.diff(starts) > 0).all())


def test_fused_token_features_equal_the_pytorch_form_on_a_qkv_view():
    from medattn.attention.binary.token_weight import token_features

    q = torch.randn(2, 33, 3, 4, 64).mul_(4).permute(2, 0, 3, 1, 4)[0]  # (B, H, N, d) view, as a layer hands it
    q[0, 0, 0, :3] = torch.tensor([0.0, -0.0, 1e-30])
    for beta in (0.5, 2.0):
        features, order = token_features(q, beta)
        expected = torch.cat([modified_tanh(q.double(), beta), sign(q).double()], dim=-1).permute(*order, 3)
        assert features.is_contiguous() and features.shape == expected.shape
        torch.testing.assert_close(features.double(), expected, rtol=0, atol=1.2e-6)
        assert torch.equal(features[..., 64:], sign(q).permute(*order, 3))  # the signs exactly, sgn(0) = sgn(-0) = +1


def test_hamming_token_weights_take_the_fused_features_only_without_gradient(monkeypatch):
    import medattn.attention.binary.token_weight as token_weight

    calls, hooked = [], []
    real = token_weight.token_features
    monkeypatch.setattr(token_weight, "token_features", lambda *a: calls.append(1) or real(*a))
    weight = make("binary-hamming").q_weight
    weight.fc1.register_forward_hook(lambda *_: hooked.append(1))
    x = torch.randn(2, 4, 9, 8).transpose(1, 2)  # strided, as from a QKV projection
    with torch.no_grad():
        fused = weight(x)
    assert calls and hooked  # the Numba features, and the MLP still called as modules
    plain = weight(x.clone().requires_grad_())  # a gradient must reach x: the PyTorch form
    assert len(calls) == 1 and len(hooked) == 2
    torch.testing.assert_close(fused, plain.detach(), rtol=1e-6, atol=1e-6)
    assert fused.shape == (2, 9, 4)
    with torch.no_grad():
        weight.double()(x.double())  # float64 keeps the PyTorch form
    assert len(calls) == 1


def test_tiled_online_softmax_equals_untiled_and_emulation():
    torch.manual_seed(1)
    B, H, N, c = 2, 3, 37, 20
    q, k, v = torch.randn(B, H, N, c), torch.randn(B, H, N, c), torch.randn(B, H, N, 5)
    wq, wk = torch.rand(B, H, N) + 0.5, torch.rand(B, H, N) + 0.5
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, 20:] = False
    args = ([(q, wq)], [(k, wk)], v, 0.4, mask)
    untiled = binary_attention(*args, tile_size=N)
    for tile in (1, 8, 16):
        torch.testing.assert_close(binary_attention(*args, tile_size=tile), untiled, rtol=1e-5, atol=1e-6)
    reference = emulated_attention([(pm1(q), wq)], [(pm1(k), wk)], v, 0.4, mask)
    torch.testing.assert_close(untiled, reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("c", [1, 8, 64, 128, 129, 256])
def test_counts_in_byte_lanes_hold_every_head_width(c):
    """Ones are counted in uint8 lanes, 16 bytes (128 bits) at a time: keys equal to a query (no ones) and opposite
    to it (c ones, the most a byte lane may hold at c = 128) on the single-term path (c <= 128) and the general one."""
    torch.manual_seed(c)
    B, H, N = 1, 2, 12
    q, k, v = torch.randn(B, H, N, c), torch.randn(B, H, N, c), torch.randn(B, H, N, 3)
    k[:, :, 0], k[:, :, 1] = q[:, :, 0], -q[:, :, 0]
    wk = torch.rand(B, H, N) + 0.5
    reference = emulated_attention([(pm1(q), None)], [(pm1(k), wk)], v, 4 / c, None)
    torch.testing.assert_close(binary_attention([(q, None)], [(k, wk)], v, 4 / c, None, tile_size=5), reference,
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("c", [20, 64, 130])
def test_query_blocks_key_tiles_and_leading_padding_equal_emulation(c):
    # Several query blocks x key tiles (the P V GEMM per tile), two query and key terms (hamming-like), and
    # padding at the start of a sequence: its first key tiles hold no real key (the finite sentinel path).
    torch.manual_seed(2)
    B, H, N = 2, 2, 41
    q, k, v = torch.randn(B, H, N, c), torch.randn(B, H, N, c), torch.randn(B, H, N, 6)
    q2, k2 = torch.randn(B, H, N, c), torch.randn(B, H, N, c)
    wq, wk = torch.rand(B, H, N) + 0.5, torch.rand(B, H, N) + 0.5
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[0, :17] = False
    mask[1, 30:] = False
    q_terms, k_terms = [(q, wq), (q2, None)], [(k, wk), (k2, None)]
    reference = emulated_attention([(pm1(q), wq), (pm1(q2), None)], [(pm1(k), wk), (pm1(k2), None)], v, 0.3, mask)
    for tile, rows in ((5, 3), (8, 41), (41, 7), (64, 64)):
        got = binary_attention(q_terms, k_terms, v, 0.3, mask, tile_size=tile, block_rows=rows)
        torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="block_rows"):
        binary_attention(q_terms, k_terms, v, 0.3, mask, block_rows=0)


def test_rows_beyond_the_spread_limit_take_their_exact_maximum_and_match_float64():
    # Query weights from 0.1 to 30: the score bound scale c |wq| max|wk| spreads from below SPREAD_LIMIT (the bound
    # is the shift) to far above it (the kernel finds the row's maximum first); both equal float64 softmax.
    from medattn.attention.binary.bits import SPREAD_LIMIT

    torch.manual_seed(5)
    B, H, N, c = 1, 2, 50, 64
    q, k, v = torch.randn(B, H, N, c), torch.randn(B, H, N, c), torch.randn(B, H, N, 4)
    wq = torch.logspace(-1, 1.5, N).expand(B, H, N).contiguous()
    wk = torch.rand(B, H, N) + 0.5
    scale = c**-0.5
    spread = 2 * scale * c * wq * wk.amax(dim=-1, keepdim=True)
    assert (spread < SPREAD_LIMIT).any() and (spread > SPREAD_LIMIT).any()
    got = binary_attention([(q, wq)], [(k, wk)], v, scale, None, tile_size=16)
    reference = emulated_attention([(pm1(q).double(), wq.double())], [(pm1(k).double(), wk.double())], v.double(),
                                   scale, None)
    torch.testing.assert_close(got.double(), reference, rtol=1e-5, atol=1e-6)


def test_exp2_of_the_kernel_is_accurate_to_3e_7_and_clamped():
    from numba import njit

    from medattn.attention.binary.bits import _exp2

    @njit(fastmath=True)
    def all_exp2(y, out):
        for j in range(y.size):
            out[j] = _exp2(y[j])

    y = np.linspace(-130, 10, 200_001).astype(np.float32)
    out = np.empty_like(y)
    all_exp2(y, out)
    expected = np.exp2(np.clip(y.astype(np.float64), -126, 0))  # clamped: a masked key's term stays finite
    assert np.max(np.abs(out - expected) / expected) < 3e-7


@pytest.mark.parametrize("name", MECHANISMS)
@pytest.mark.parametrize("value_dim", [None, 3])
def test_bit_kernel_path_equals_float_emulation(name, value_dim):
    attn = make(name, value_dim=value_dim, tile_size=7).eval()
    x = torch.randn(2, 19, 32)
    mask = torch.ones(2, 19, dtype=torch.bool)
    mask[0, 11:] = False
    with torch.no_grad():
        fast = attn(x, mask)
        attn.bit_kernel = False
        slow = attn(x, mask)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-6)


def test_bernoulli_training_samples_are_shared_by_both_paths():
    attn = make("binary-bernoulli").train()
    x = torch.randn(2, 10, 32)
    with torch.no_grad():
        torch.manual_seed(3)
        fast = attn(x)
        attn.bit_kernel = False
        torch.manual_seed(3)
        slow = attn(x)
        torch.manual_seed(4)
        other = attn(x)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(slow, other)  # training really samples


def test_bit_kernel_runs_only_without_gradient(monkeypatch):
    import medattn.attention.binary.core as core

    calls = []
    real = core.binary_attention
    monkeypatch.setattr(core, "binary_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    attn = make("binary-hamming")
    x = torch.randn(1, 6, 32)
    attn(x).sum().backward()
    assert not calls
    with torch.no_grad():
        attn(x)
    assert calls


# --- gradients ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, reaches", [("binary-ste", True), ("binary-sg", False),
                                           ("binary-hamming", True), ("binary-bernoulli", True)])
def test_gradient_reaches_qk_projections(name, reaches):
    attn = make(name).train()
    x = torch.randn(2, 12, 32)
    torch.manual_seed(5)
    (attn(x) * torch.randn(2, 12, 32)).sum().backward()
    grad = attn.qkv.weight.grad
    qk, v = grad[: 2 * attn.inner_dim], grad[2 * attn.inner_dim:]
    assert v.abs().sum() > 0
    assert (qk.abs().sum() > 0) == reaches
    if name == "binary-hamming":
        assert attn.q_weight.fc2.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("name", ["binary-hamming", "binary-bernoulli"])
def test_gradcheck_float64(name):
    attn = make(name, dim=8, num_heads=2).double().train()
    x = torch.randn(1, 5, 8, dtype=torch.float64, requires_grad=True)

    def fn(inp):
        torch.manual_seed(7)  # the same Bernoulli samples on every evaluation
        return attn(inp)

    assert torch.autograd.gradcheck(fn, (x,), eps=1e-6, atol=1e-5)


def test_hamming_weights_start_near_one_and_are_positive():
    attn = make("binary-hamming")
    with torch.no_grad():
        w = attn.q_weight(torch.randn(2, 4, 9, attn.head_dim) * 10)
    assert w.shape == (2, 4, 9)
    assert bool((w > 0).all()) and float((w - 1).abs().max()) < 0.5


# --- masks and layout -----------------------------------------------------------------------------

def test_value_dim_layout():
    attn = make("binary-ste", dim=32, num_heads=4, value_dim=5)
    assert attn.qkv.out_features == 2 * 32 + 4 * 5
    assert attn.proj.in_features == 4 * 5
    assert make("binary-ste").qkv.out_features == 3 * 32  # the standard layout when value_dim is unset
    assert attn(torch.randn(3, 6, 32)).shape == (3, 6, 32)


# --- training -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", MECHANISMS)
def test_short_training_run_decreases_loss(name):
    torch.manual_seed(0)
    attn = build_attention(name, dim=16, num_heads=2)
    head = torch.nn.Linear(16, 1)
    opt = torch.optim.Adam([*attn.parameters(), *head.parameters()], lr=1e-2)
    x = torch.randn(16, 8, 16)
    y = x[:, :, :4].mean(dim=(1, 2))  # a target that needs mixing tokens
    losses = []
    for _ in range(40):
        loss = torch.nn.functional.mse_loss(head(attn(x).mean(1)).squeeze(-1), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])


# --- bad input ------------------------------------------------------------------------------------

def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError, match="value_dim"):
        make("binary-ste", value_dim=0)
    with pytest.raises(ValueError, match="tile_size"):
        make("binary-sg", tile_size=0)
    with pytest.raises(ValueError, match="weight_hidden"):
        make("binary-hamming", weight_hidden=0)
    with pytest.raises(ValueError, match="beta"):
        make("binary-bernoulli", beta=-1.0)
    attn = make("binary-ste")
    with pytest.raises(ValueError):
        attn(torch.randn(2, 5, 31))
    with pytest.raises(ValueError):
        attn(torch.randn(2, 5, 32), torch.ones(2, 5))
    with pytest.raises(ValueError):
        pack_signs(torch.randn(3, 0))
    with pytest.raises(ValueError):
        binary_dot(pack_signs(torch.randn(1, 2, 64)), pack_signs(torch.randn(1, 2, 128)), 64)
    with pytest.raises(ValueError):
        binary_dot(pack_signs(torch.randn(1, 2, 64)), pack_signs(torch.randn(1, 2, 64)), 65)


def test_masked_keys_with_huge_scores_add_nothing():
    # A padded key may score far above every real key (large learned key weights): its exp(s - max) overflowed
    # the exponent bits of the kernel's exp and, times zero, gave NaN or garbage (found at weights 11.3 and 33.5
    # for this seed; the exponent is now clamped at 0 too).
    torch.manual_seed(5)
    B, H, N, c = 1, 1, 24, 64
    q, k, v = torch.randn(B, H, N, c), torch.randn(B, H, N, c), torch.randn(B, H, N, 4)
    k[:, :, 16:] = q[:, :, :1]  # padded keys agree with query 0 in every bit
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[:, 16:] = False
    for weight in (11.3, 33.5, 1000.0):
        wk = torch.ones(B, H, N)
        wk[:, :, 16:] = weight
        got = binary_attention([(q, None)], [(k, wk)], v, 0.125, mask, tile_size=8)
        reference = emulated_attention([(pm1(q), None)], [(pm1(k), wk)], v, 0.125, mask)
        torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-6)
