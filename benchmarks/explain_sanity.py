"""Sanity checks of the explanations on the built-in SYNTHETIC tasks (docs/explain.md has the runs).

wsi RUN...: tile-level AUROC of the tile scores against the planted tumour tiles of the synthetic_wsi test
    bags (positive bags only; pooled over their tiles, and the mean of the per-bag AUROCs), for rollout
    (signed and |r|) and gradient x input. The truth is recovered exactly: a bag is rendered twice from its
    own seed, once with the tumour centre moved far away; the tiles whose features differ are the planted
    ones (the draws do not depend on the centre's value).
cxr RUN: model randomisation (Adebayo et al. 2018): Spearman rank correlation between the maps of the trained
    model and of the same architecture freshly initialised (seed 1), per test image, for both methods.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import scipy.stats
import torch
from sklearn.metrics import roc_auc_score

from medattn.commands.evaluate import load_trained
from medattn.data import build_datasets
from medattn.data import synthetic_wsi as sw
from medattn.explain import explain
from medattn.train import build_model


def planted_tumour(data_cfg: dict, seed: int, split: str, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (features (N, F), tumour mask (N,) bool) of synthetic_wsi bag ``index`` of ``split``."""
    n_range = tuple(int(v) for v in data_cfg.get("num_instances", (200, 1000)))
    fraction = tuple(float(v) for v in data_cfg.get("tumour_fraction", (0.02, 0.1)))
    data_seed = int(data_cfg.get("seed", seed))
    centres, tumour = sw.feature_space(int(data_cfg.get("feature_dim", 64)), float(data_cfg.get("tumour_shift", 3.0)),
                                       data_seed)
    draws = [sw.render_bag(sw.item_generator(sw.NAME, data_seed, split, index), n_range, fraction, centres, t)
             for t in (tumour, tumour + 1e3)]
    return draws[0][0], (draws[0][0] != draws[1][0]).any(dim=1)


def wsi(runs: list[str], bags: int) -> dict:
    results = {}
    for run in runs:
        model, config, task, _ = load_trained(run)
        scores = {"rollout": [], "|rollout|": [], "gradxinput": []}
        truth, per_bag = [], {k: [] for k in scores}
        for index in range(bags):
            features, mask = planted_tumour(config["data"], config["seed"], "test", index)
            if not mask.any():
                continue
            r = explain(model, features[None], "rollout").relevance[0].numpy()
            g = explain(model, features[None], "gradxinput", target=0).relevance[0].numpy()
            for key, value in (("rollout", r), ("|rollout|", np.abs(r)), ("gradxinput", g)):
                scores[key].append(value)
                per_bag[key].append(roc_auc_score(mask.numpy(), value))
            truth.append(mask.numpy())
        y = np.concatenate(truth)
        results[config["model"]["attention"]] = {
            "positive_bags": len(truth), "tiles": int(len(y)), "tumour_tiles": int(y.sum()),
            **{f"pooled_auroc_{k}": round(float(roc_auc_score(y, np.concatenate(v))), 4) for k, v in scores.items()},
            **{f"mean_bag_auroc_{k}": round(float(np.mean(v)), 4) for k, v in per_bag.items()}}
    return results


def cxr(run: str, images: int) -> dict:
    model, config, task, _ = load_trained(run)
    torch.manual_seed(1)
    fresh = build_model(config["model"], task).eval()
    test = build_datasets(config["data"], seed=config["seed"]).test
    out = {}
    for method in ("rollout", "gradxinput"):
        rhos = []
        for index in range(images):
            x = test[index]["input"][None]
            a, b = (explain(m, x, method, target=0 if method == "gradxinput" else None).relevance[0]
                    for m in (model, fresh))
            step = model.patch_size if method == "rollout" else (1, 1)  # one value per token for rollout
            a, b = a[::step[0], ::step[1]], b[::step[0], ::step[1]]
            rhos.append(scipy.stats.spearmanr(a.flatten().numpy(), b.flatten().numpy()).statistic)
        out[method] = {"images": images, "mean_spearman": round(float(np.mean(rhos)), 4),
                       "mean_abs_spearman": round(float(np.mean(np.abs(rhos))), 4),
                       "max_abs_spearman": round(float(np.max(np.abs(rhos))), 4)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", choices=("wsi", "cxr"))
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--n", type=int, default=40, help="test bags / images")
    args = parser.parse_args(argv)
    result = wsi(args.runs, args.n) if args.task == "wsi" else cxr(args.runs[0], args.n)
    print(json.dumps({"SYNTHETIC": True, **result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
