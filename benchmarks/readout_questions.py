"""Why no single bag readout answers every question (issue 48): what each pooling readout makes of a bag as the share of
positive tiles grows, for small and large bags.

A tile's score is one number, N(0, 1) for a negative tile and N(2, 1) for a positive one (a finding that a tile
encoder separates moderately); a bag holds N tiles of which a share s are positive. The readouts of
``medattn.models.wsi`` applied to those scores:

* max: ``max_k x_k``: jumps with the first positive tile, then barely moves: it tells "any positive tile", not how many;
* mean: ``mean_k x_k``: linear in s, whatever N: a fraction;
* attention: ``sum_k softmax(x)_k x_k`` (the score as its own attention logit): between the two, saturating;
* count: ``sum_k sigmoid(x_k - 1) / 100``: linear in s * N: a number of tiles.

For each readout and bag size the figure draws the pooled value against s (mean and 10-90% band over bags) and the
legend gives Pearson r between the pooled value and s over bags whose s is drawn uniformly from [0, 0.3] and whose N
is drawn from [N/2, 2N] (r of 1: the readout alone fits a fraction target linearly). Pure NumPy, seconds; no
training (what each readout learns on the realistic family is in docs/realistic_family.md).

    python benchmarks/readout_questions.py --out docs/images/readout_questions.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

READOUTS = ("max", "attention", "mean", "count")
SIZES = (200, 2000)
SHARES = np.linspace(0, 0.3, 31)


def pooled(scores: np.ndarray, readout: str) -> float:
    """One bag's tile scores (N,) -> the readout's pooled value."""
    if readout == "max":
        return float(scores.max())
    if readout == "mean":
        return float(scores.mean())
    if readout == "attention":
        weights = np.exp(scores - scores.max())
        return float((weights / weights.sum()) @ scores)
    return float((1 / (1 + np.exp(-(scores - 1)))).sum() / 100)


def bag(n: int, share: float, rng: np.random.Generator) -> np.ndarray:
    positive = rng.random(n) < share
    return rng.normal(0, 1, n) + 2.0 * positive


def curves(rng: np.random.Generator, bags: int = 40) -> dict:
    """readout -> size -> (mean, 10th, 90th percentile) of the pooled value per share in :data:`SHARES`."""
    out = {}
    for readout in READOUTS:
        out[readout] = {}
        for n in SIZES:
            values = np.array([[pooled(bag(n, s, rng), readout) for _ in range(bags)] for s in SHARES])
            out[readout][n] = (values.mean(1), np.percentile(values, 10, 1), np.percentile(values, 90, 1))
    return out


def fraction_fit(rng: np.random.Generator, bags: int = 400) -> dict:
    """readout -> size -> Pearson r between the pooled value and the share, s ~ U(0, 0.3), N ~ U(size/2, 2 size)."""
    out = {}
    for readout in READOUTS:
        out[readout] = {}
        for n in SIZES:
            shares = rng.uniform(0, 0.3, bags)
            values = [pooled(bag(int(rng.integers(n // 2, 2 * n)), s, rng), readout) for s in shares]
            out[readout][n] = float(np.corrcoef(values, shares)[0, 1])
    return out


def figure(found: dict, fits: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(READOUTS), figsize=(4 * len(READOUTS), 3.4))
    for ax, readout in zip(axes, READOUTS):
        for n, colour in zip(SIZES, ("tab:blue", "tab:orange")):
            mean, low, high = found[readout][n]
            ax.plot(SHARES * 100, mean, color=colour, label=f"{n} tiles (r with share {fits[readout][n]:.2f})")
            ax.fill_between(SHARES * 100, low, high, color=colour, alpha=0.2)
        ax.set_title(f"{readout} readout")
        ax.set_xlabel("positive tiles in the bag (%)")
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("pooled value")
    fig.suptitle("What each readout tells about a bag (simulated tile scores: negative N(0,1), positive N(2,1))",
                 fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="readout_questions.png", help="the figure (a JSON of the r values beside it)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    found, fits = curves(rng), fraction_fit(rng)
    out = Path(args.out)
    figure(found, fits, out)
    out.with_suffix(".json").write_text(json.dumps({"pearson_r_with_share": fits, "seed": args.seed}, indent=1))
    for readout in READOUTS:
        print(f"{readout:10s} " + "  ".join(f"{n} tiles: r {fits[readout][n]:.3f}" for n in SIZES))


if __name__ == "__main__":
    main()
