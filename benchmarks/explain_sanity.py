"""Sanity checks of the explanations on the built-in SYNTHETIC tasks (docs/explain.md has the runs).

wsi RUN...: tile-level AUROC of the tile scores against the planted tumour tiles of the synthetic_wsi test
    bags (positive bags only; pooled over their tiles, and the mean of the per-bag AUROCs), for
    gradient-weighted rollout (the default), Chefer et al.'s entry-wise rule computed densely (N x N, the
    reference the linear-time rule approximates below the top block; mean per-bag Spearman between the
    two), rollout (signed and |r|) and gradient x input; as controls, gradient-weighted rollout of the same
    architecture freshly initialised (seed 1) and the tiles' feature norms. Every class-specific map
    explains logit 0. The truth is recovered exactly: a bag is rendered twice from its own seed, once with
    the tumour centre moved far away; the tiles whose features differ are the planted ones (the draws do
    not depend on the centre's value).
figures CXR_RUN MRI_RUN WSI_RUN --out DIR: one SYNTHETIC heatmap each for 2D, 3D (middle axial slice of the
    NIfTI map the command writes) and WSI (a positive test bag), made by `medattn explain` itself.
cxr RUN: model randomisation (Adebayo et al. 2018): Spearman rank correlation between the maps of the trained
    model and of the same architecture freshly initialised (seed 1), per test image, for every method; and
    each map's Spearman correlation with the input's mean intensity per token (per pixel for gradient x
    input), trained and untrained: what a map shares with the untrained one may be the image itself.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import scipy.stats
import torch
from sklearn.metrics import roc_auc_score

from medattn.attention.rows import FactorisedRows
from medattn.data import build_datasets
from medattn.explain import explain, record_attention, rows_for
from medattn.generators import synthetic_wsi as sw
from medattn.runtime.build import build_model
from medattn.runtime.trained import load_checkpoint


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


def dense_chefer(model, features: torch.Tensor, target: int = 0) -> np.ndarray:
    """Chefer et al.'s attention-gradient rule with the entry-wise positive part, from dense (N x N) weights:
    ``r <- r + mean_h (G_h ⊙ A_h)^+ ^T r`` top-down from the class row (the library's tested factor maps,
    values and output gradients; one bag (N, F)) -> (N,) scores."""
    with record_attention(model, probe=True) as calls, torch.enable_grad():
        logits = model(features[None])
        grads = torch.autograd.grad(logits[:, target].sum(), [call.probe for call in calls])
    r = torch.zeros(features.shape[0] + 1, dtype=torch.float64)
    r[0] = 1
    with torch.no_grad():
        for call, grad in zip(reversed(calls), reversed(grads)):
            q, k, v = call.qkv()
            rule = rows_for(call.module)
            if isinstance(rule, FactorisedRows):
                phi_q, phi_k, scale = rule.maps(call.module, q.double(), k.double(), None,
                                                rule.statistics(call.module, q, k, None))
                weights = phi_q @ phi_k.transpose(-2, -1) * scale[..., None]
            else:
                weights = torch.cat([w for _, w in rule.blocks(q, k, None)], dim=2)
            values = rule.values(call.module, v, None)
            product = (call.head_gradient(grad).double() @ values.transpose(-2, -1)) * weights  # G ⊙ A
            r = r + (r[None, None, :, None] * product.clamp_min(0)).sum(2).mean(1)[0]
    return r[1:].float().numpy()


def wsi(runs: list[str], bags: int) -> dict:
    results = {}
    for run in runs:
        trained = load_checkpoint(run)
        model, config, task = trained.model, trained.config, trained.task
        torch.manual_seed(1)
        fresh = build_model(config["model"], task).eval()
        scores = {"gradrollout": [], "chefer_dense": [], "rollout": [], "|rollout|": [], "gradxinput": [],
                  "gradrollout_untrained": [], "feature_norm": []}
        truth, per_bag, agreement = [], {k: [] for k in scores}, []
        for index in range(bags):
            features, mask = planted_tumour(config["data"], config["seed"], "test", index)
            if not mask.any():
                continue
            r = explain(model, features[None], "rollout").relevance[0].numpy()
            maps = {"gradrollout": explain(model, features[None], "gradrollout", target=0).relevance[0].numpy(),
                    "chefer_dense": dense_chefer(model, features), "rollout": r, "|rollout|": np.abs(r),
                    "gradxinput": explain(model, features[None], "gradxinput", target=0).relevance[0].numpy(),
                    "gradrollout_untrained": explain(fresh, features[None], "gradrollout",
                                                     target=0).relevance[0].numpy(),
                    "feature_norm": features.norm(dim=1).numpy()}
            for key, value in maps.items():
                scores[key].append(value)
                per_bag[key].append(roc_auc_score(mask.numpy(), value))
            agreement.append(scipy.stats.spearmanr(maps["gradrollout"], maps["chefer_dense"]).statistic)
            truth.append(mask.numpy())
        y = np.concatenate(truth)
        results[config["model"]["attention"]] = {
            "positive_bags": len(truth), "tiles": int(len(y)), "tumour_tiles": int(y.sum()),
            **{f"pooled_auroc_{k}": round(float(roc_auc_score(y, np.concatenate(v))), 4) for k, v in scores.items()},
            **{f"mean_bag_auroc_{k}": round(float(np.mean(v)), 4) for k, v in per_bag.items()},
            "mean_bag_spearman_gradrollout_vs_chefer_dense": round(float(np.mean(agreement)), 4)}
    return results


def cxr(run: str, images: int) -> dict:
    trained = load_checkpoint(run)
    model, config, task = trained.model, trained.config, trained.task
    torch.manual_seed(1)
    fresh = build_model(config["model"], task).eval()
    test = build_datasets(config["data"], seed=config["seed"]).test
    out = {}
    for method in ("gradrollout", "rollout", "gradxinput"):
        rhos, brightness = [], {"trained": [], "untrained": []}
        for index in range(images):
            x = test[index]["input"][None]
            a, b = (explain(m, x, method, target=None if method == "rollout" else 0).relevance[0]
                    for m in (model, fresh))
            step = (1, 1) if method == "gradxinput" else model.patch_size  # one value per token for rollouts
            a, b = a[::step[0], ::step[1]], b[::step[0], ::step[1]]
            rhos.append(scipy.stats.spearmanr(a.flatten().numpy(), b.flatten().numpy()).statistic)
            mean = torch.nn.functional.avg_pool2d(x[:, :1], step)[0, 0].flatten().numpy()  # the pixel/patch mean
            for name, heat in (("trained", a), ("untrained", b)):
                brightness[name].append(scipy.stats.spearmanr(heat.flatten().numpy(), mean).statistic)
        out[method] = {"images": images, "mean_spearman": round(float(np.mean(rhos)), 4),
                       "mean_abs_spearman": round(float(np.mean(np.abs(rhos))), 4),
                       "max_abs_spearman": round(float(np.max(np.abs(rhos))), 4),
                       **{f"mean_spearman_vs_intensity_{k}": round(float(np.mean(v)), 4)
                          for k, v in brightness.items()}}
    return out


def figures(cxr_run: str, mri_run: str, wsi_run: str, out: str) -> None:
    import subprocess
    import tempfile
    from pathlib import Path

    import h5py
    import nibabel as nib
    from PIL import Image

    from medattn.explain.outputs import _label, overlay

    out_dir, work = Path(out), Path(tempfile.mkdtemp())
    medattn = [sys.executable, "-m", "medattn", "explain"]
    config = load_checkpoint(cxr_run).config
    image = build_datasets(config["data"], seed=config["seed"]).test[0]["input"][0]  # zero-mean, unit-std
    grey = ((image - image.min()) / (image.max() - image.min()) * 255).byte().numpy()
    Image.fromarray(grey).resize((256, 256), Image.BILINEAR).save(work / "cxr.png")
    subprocess.run([*medattn, cxr_run, str(work / "cxr.png"), "--out", str(work / "cxr")], check=True)
    Image.open(work / "cxr" / "cxr.png").save(out_dir / "explain_2d_cxr.png")
    config = load_checkpoint(mri_run).config
    test = build_datasets(config["data"], seed=config["seed"]).test
    index = next(i for i in range(len(test)) if float(test[i]["label"].flatten()[0]) == 1)
    volume = test[index]["input"][0].numpy()
    nib.save(nib.Nifti1Image(volume, np.diag([1.0, 1.0, 1.0, 1.0])), work / "mri.nii.gz")
    subprocess.run([*medattn, mri_run, str(work / "mri.nii.gz"), "--out", str(work / "mri")], check=True)
    heat = nib.load(work / "mri" / "mri.nii.gz").get_fdata()
    z = volume.shape[2] // 2
    plane = (volume[:, :, z] - volume.min()) / (volume.max() - volume.min())
    overlay(np.kron(plane, np.ones((8, 8)))[None], np.kron(heat[:, :, z], np.ones((8, 8))),
            label="SYNTHETIC").save(out_dir / "explain_3d_mri.png")
    config = load_checkpoint(wsi_run).config
    index = next(i for i in range(40) if planted_tumour(config["data"], config["seed"], "test", i)[1].any())
    features, _ = planted_tumour(config["data"], config["seed"], "test", index)
    sample = build_datasets(config["data"], seed=config["seed"]).test[index]
    with h5py.File(work / "bag.h5", "w") as f:
        f["features"], f["coords"] = features.numpy(), sample["coords"].numpy()
    subprocess.run([*medattn, wsi_run, str(work / "bag.h5"), "--out", str(work / "wsi")], check=True)
    _label(Image.open(work / "wsi" / "bag.png").resize((512, 512)), "SYNTHETIC").save(out_dir / "explain_wsi.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", choices=("wsi", "cxr", "figures"))
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--n", type=int, default=40, help="test bags / images")
    parser.add_argument("--out", default="docs/images", help="figures: output folder")
    args = parser.parse_args(argv)
    if args.task == "figures":
        figures(*args.runs, args.out)
        return 0
    result = wsi(args.runs, args.n) if args.task == "wsi" else cxr(args.runs[0], args.n)
    print(json.dumps({"SYNTHETIC": True, **result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
