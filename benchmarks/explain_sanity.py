"""Sanity checks of the explanations on the built-in SYNTHETIC tasks (docs/explain.md has the runs).

wsi RUN...: tile-level AUROC of the tile scores against the planted tumour tiles of the synthetic_wsi test
    bags (positive bags only; pooled over their tiles, and the mean of the per-bag AUROCs), for rollout
    (signed and |r|) and gradient x input. The truth is recovered exactly: a bag is rendered twice from its
    own seed, once with the tumour centre moved far away; the tiles whose features differ are the planted
    ones (the draws do not depend on the centre's value).
figures CXR_RUN MRI_RUN WSI_RUN --out DIR: one SYNTHETIC heatmap each for 2D, 3D (middle axial slice of the
    NIfTI map the command writes) and WSI (a positive test bag), made by `medattn explain` itself.
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
    _, config, _, _ = load_trained(cxr_run)
    image = build_datasets(config["data"], seed=config["seed"]).test[0]["input"][0]  # zero-mean, unit-std
    grey = ((image - image.min()) / (image.max() - image.min()) * 255).byte().numpy()
    Image.fromarray(grey).resize((256, 256), Image.BILINEAR).save(work / "cxr.png")
    subprocess.run([*medattn, cxr_run, str(work / "cxr.png"), "--out", str(work / "cxr")], check=True)
    Image.open(work / "cxr" / "cxr.png").save(out_dir / "explain_2d_cxr.png")
    _, config, _, _ = load_trained(mri_run)
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
    _, config, _, _ = load_trained(wsi_run)
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
