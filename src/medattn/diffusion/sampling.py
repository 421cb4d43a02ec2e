"""Reverse absorbing diffusion: reveal masked tokens step by step (inpainting and synthesis).

Start from a token grid whose unknown positions hold the mask index (all positions for unconditional
synthesis, the centre region for inpainting). Each sample's unknown positions are put in a random
order (Bond-Taylor et al. unmask positions chosen uniformly at random) and split into ``steps``
nearly equal consecutive groups; at step ``s`` the model sees the current grid, and the positions of
group ``s`` get indices drawn from ``softmax(logits / temperature)``, independently per sub-codebook.
Revealed and known positions are never changed again. BinaryFormer samples 200 steps at temperature
0.8 (§3.2): with 1,680 tokens that is 8 or 9 new positions per step. Fewer unknown positions than
steps means one position per step and fewer steps.

Everything random comes from one ``torch.Generator`` seeded with ``seed``, so a call is deterministic
for a given model, input, seed and device.
"""

from __future__ import annotations

import torch

from medattn.diffusion.transformer import AbsorbingTransformer


def _generator(seed: int, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


@torch.no_grad()
def sample_tokens(model: AbsorbingTransformer, tokens: torch.Tensor | None = None, known: torch.Tensor | None = None,
                  *, batch: int = 1, steps: int = 200, temperature: float = 0.8, seed: int = 0) -> torch.Tensor:
    """Fill the unknown positions of ``tokens`` (B, N, G) where ``known`` (B, N) is False; -> (B, N, G).

    ``tokens=None``: unconditional synthesis of ``batch`` grids. ``known=None``: nothing is known.
    """
    if steps < 1 or not temperature > 0:
        raise ValueError(f"steps must be >= 1 and temperature > 0, got {steps} and {temperature}")
    device = next(model.parameters()).device
    n, g = model.num_tokens, model.num_codebooks
    if tokens is None:
        tokens = torch.full((batch, n, g), model.mask_index, dtype=torch.long, device=device)
    tokens = tokens.to(device)
    if known is None:
        known = torch.zeros(tokens.shape[:2], dtype=torch.bool, device=device)
    known = known.to(device)
    if known.shape != tokens.shape[:2]:
        raise ValueError(f"known {tuple(known.shape)} does not match tokens {tuple(tokens.shape)}")
    generator = _generator(seed, device)
    x = tokens.masked_fill(~known[..., None], model.mask_index)
    orders = []
    for b in range(x.shape[0]):
        unknown = (~known[b]).nonzero().flatten()
        orders.append(unknown[torch.randperm(len(unknown), generator=generator, device=device)])
    total_steps = min(steps, max((len(o) for o in orders), default=0))
    was_training = model.training
    model.eval()
    for step in range(total_steps):
        groups = [o[len(o) * step // total_steps: len(o) * (step + 1) // total_steps] for o in orders]
        if not any(len(group) for group in groups):
            continue
        probs = torch.softmax(model(x).float() / temperature, dim=-1)  # (B, N, G, K)
        for b, group in enumerate(groups):
            if len(group):
                draw = torch.multinomial(probs[b, group].reshape(-1, probs.shape[-1]), 1, generator=generator)
                x[b, group] = draw.reshape(len(group), g)
    model.train(was_training)
    return x


def random_fill(tokens: torch.Tensor, known: torch.Tensor, codebook_size: int, seed: int = 0) -> torch.Tensor:
    """BinaryFormer's ``random`` baseline: unknown positions get uniform random indices (no denoising)."""
    generator = _generator(seed, tokens.device)
    noise = torch.randint(codebook_size, tokens.shape, generator=generator, device=tokens.device)
    return torch.where(known[..., None], tokens, noise)
