"""Measuring the absorbing-diffusion transformer's training and sampling step (``benchmarks/diffusion_scaling.py``).

:func:`measure_case` times one phase (``train``: forward, backward of the absorbing loss at a random mask
ratio and an AdamW step; ``sample``: one reveal step of the sampler, eval and no_grad) and reports its
peak memory: CUDA's ``max_memory_allocated``, or on CPU the peak RSS of the process above its size after
the model and inputs were built. On CPU, call it in a fresh process per case
(:func:`medattn.bench.common.run_isolated`): memory a process freed is reused without raising its RSS,
so a second case in the same process under-reports.
"""

from __future__ import annotations

import torch

from medattn.bench.common import median_time, peak_memory_bytes, peak_rss_bytes, reset_peak_memory
from medattn.diffusion.sampling import sample_tokens
from medattn.diffusion.transformer import AbsorbingTransformer, absorbing_loss


def measure_case(attention: str, grid: list[int], phase: str, dim: int = 384, depth: int = 8, heads: int = 8,
                 batch: int = 1, repeats: int = 3, budget_s: float = 30.0, device: str = "cpu",
                 threads: int | None = None) -> dict:
    """-> {"<phase>_step_s": median seconds, "<phase>_peak_mib": peak memory} for one mechanism and grid."""
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    dev = torch.device(device)
    model = AbsorbingTransformer(tuple(grid), 8, 64, dim=dim, depth=depth, num_heads=heads,
                                 attention=attention).to(dev)
    tokens = torch.randint(64, (batch, model.num_tokens, 8), device=dev)
    if phase == "train":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        generator = torch.Generator().manual_seed(0)

        def step():
            optimizer.zero_grad(set_to_none=True)
            absorbing_loss(model, tokens, 256, generator).backward()
            optimizer.step()
    else:
        model.eval()

        def step():
            sample_tokens(model, batch=batch, steps=1, temperature=0.8, seed=0)
    reset_peak_memory(dev.type)
    baseline = 0 if dev.type == "cuda" else peak_rss_bytes()
    seconds = median_time(step, repeats=repeats, warmup=1, budget_s=budget_s)
    return {f"{phase}_step_s": seconds, f"{phase}_peak_mib": peak_memory_bytes(dev.type, baseline) / 2**20}
