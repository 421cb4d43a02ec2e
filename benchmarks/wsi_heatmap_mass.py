"""SYNTHETIC slides end to end: tiles kept and dropped, extraction throughput, and how much heatmap mass lands
on the planted tumour of held-out slides.

Usage:  OMP_NUM_THREADS=1 python benchmarks/wsi_heatmap_mass.py [--slides 40] [--out reports/wsi-heatmap-mass]
            [--png docs/images/wsi_heatmap_synthetic.png]

Steps, all on SYNTHETIC slides (``medattn.generators.slides.write_synthetic_cohort``: not tissue, every other slide
with a planted tumour region, ground-truth masks kept): tile every slide (tissue mask, grid, white and blur
filter), extract the weight-free descriptor from the kept tiles, train models on the bags with
``medattn.train.fit`` (the packaged ``synthetic_slides`` config: gated attention-MIL, and the
seqnorm WSI ViT), then on each held-out tumour slide score every tile and report

    mass  = sum_k s_k t_k / sum_k s_k      (s_k >= 0 the tile's score, t_k its overlap with the tumour mask)
    chance = mean_k t_k                     (the mass of uniform scores)
    precision@K: share of the K top-scored tiles that are tumour tiles (t_k >= 0.5; K = their number)
    largest share: max_k s_k / sum_k s_k    (how peaked the heatmap is)

Scores come from the last epoch's weights (with a handful of validation slides the validation AUROC
reaches 1.0 within a few epochs and the run's "best" checkpoint, the first epoch to reach it, is barely
trained; both test AUROCs are reported): the attention weights a_k of attention-MIL; for the ViT,
gradient x input summed over features, |sum_f x_kf d logit / d x_kf|. Writes DIR/wsi_heatmap_mass.json
and prints a table; ``--png`` draws one held-out tumour slide's attention-MIL heatmap (percentiles) over its thumbnail.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

from medattn.bench.common import environment, median_time
from medattn.config import load_config
from medattn.data import build_datasets
from medattn.data.readers.bags import read_slide
from medattn.outputs import OutputFolder
from medattn.runtime import checkpoint
from medattn.runtime.build import build_model
from medattn.slides import (
    Extractor,
    ResNet50Features,
    TileSettings,
    build_extractor,
    extract_slides,
    heatmap_mass,
    list_slides,
    load_truth,
    slide_heatmap,
    tile_overlap,
    tile_slide,
    write_synthetic_cohort,
    write_tiles,
)
from medattn.train import fit

MODELS = {"abmil": ("abmil_small", None), "vit-seqnorm": ("vitwsi_small", "seqnorm")}


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slides", type=int, default=40, help="SYNTHETIC slides, every other with a tumour")
    parser.add_argument("--shape", type=int, nargs=2, default=(768, 1024), metavar=("H", "W"),
                        help="level-0 pixels of each slide (1 um per px)")
    parser.add_argument("--patch-um", type=float, default=32.0)
    parser.add_argument("--patch-px", type=int, default=32)
    parser.add_argument("--thumbnail-px", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--models", default="abmil,vit-seqnorm", help=f"comma-separated: {', '.join(MODELS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", type=Path, default=Path("reports/wsi-heatmap-mass"))
    parser.add_argument("--png", type=Path, help="heatmap of one held-out tumour slide (attention-MIL)")
    parser.add_argument("--png-px", type=int, default=448, help="longer side of the heatmap PNG")
    return parser.parse_args()


def tile_all(slides: list[Path], tiles_dir: Path, settings: TileSettings) -> dict:
    """Tile every slide; counts of grid cells read and of kept, white and blurry tiles, and how many
    blurry drops overlap the out-of-focus ground truth."""
    counts = {"candidates": 0, "kept": 0, "white": 0, "blurry": 0, "blurry_on_out_of_focus_truth": 0}
    started = time.perf_counter()
    for path in slides:
        tiles = tile_slide(path, settings)
        write_tiles(tiles, tiles_dir)
        for status, n in tiles.counts().items():
            counts[status] += n
        counts["candidates"] += len(tiles.coords)
        blurry = tiles.coords[tiles.status == "blurry"]
        counts["blurry_on_out_of_focus_truth"] += int((tile_overlap(load_truth(path)["blurry"], blurry,
                                                                    tiles.geometry.size0) > 0).sum())
    seconds = time.perf_counter() - started
    return {**counts, "seconds": seconds, "candidates_per_s": counts["candidates"] / seconds}


def extraction(slides: list[Path], tiles_dir: Path, features_dir: Path, settings: TileSettings) -> dict:
    """Descriptor features from the kept tiles (read from the slide + forward), and each extractor's
    forward alone on a batch of random patches (ResNet-50 with random weights at 256 px, for scale)."""
    descriptor = build_extractor("descriptor")
    started = time.perf_counter()
    results = extract_slides(slides, features_dir, descriptor, settings, tiles_dir=tiles_dir)
    seconds = time.perf_counter() - started
    kept = sum(r.kept for r in results)
    generator = torch.Generator().manual_seed(0)
    batch = torch.randint(0, 256, (256, settings.patch_px, settings.patch_px, 3), dtype=torch.uint8,
                          generator=generator)
    forward_s = median_time(lambda: descriptor(batch), repeats=5)
    resnet = Extractor("resnet50 (random weights)", ResNet50Features().eval(), torch.device("cpu"), imagenet=True)
    big = torch.randint(0, 256, (8, 256, 256, 3), dtype=torch.uint8, generator=generator)
    resnet_s = median_time(lambda: resnet(big), repeats=2)
    return {"extractor": descriptor.name, "tiles": kept, "seconds": seconds, "tiles_per_s": kept / seconds,
            "forward_only_tiles_per_s": {f"descriptor at {settings.patch_px} px": len(batch) / forward_s,
                                         "resnet50 (random weights) at 256 px": len(big) / resnet_s}}


def tile_scores(model: torch.nn.Module, features: torch.Tensor, coords: torch.Tensor, kind: str) -> np.ndarray:
    """(N,) scores >= 0 of one bag: attention weights, or |gradient x input| summed over features."""
    model.eval()
    if kind == "abmil":
        with torch.no_grad():
            return model.attention_weights(features[None])[0].numpy()
    x = features[None].clone().requires_grad_(True)
    model(x, mask=torch.ones(1, len(features), dtype=torch.bool), coords=coords[None])[0, -1].backward()
    return (x.grad * x).sum(-1)[0].abs().detach().numpy()


def train_and_score(kind: str, args: argparse.Namespace, slides_dir: Path, features_dir: Path, size0: int) -> dict:
    name, attention = MODELS[kind]
    config = load_config("synthetic_slides", [
        f"data.feature_dir={features_dir}", f"data.slide_table={slides_dir / 'slide_table.csv'}",
        f"data.clinical_table={slides_dir / 'clinical_table.csv'}", "data.val_fraction=0.2", "data.test_fraction=0.3",
        f"model.name={name}", f"model.attention={attention or 'null'}", f"train.epochs={args.epochs}",
        f"train.lr={args.lr}", f"train.threads={args.threads}", f"seed={args.seed}", "eval.bootstrap=200"])
    bundle = build_datasets(config["data"], seed=config["seed"])
    run_dir = args.out / f"run-{kind}"
    results = fit(config, bundle, run_dir, overwrite=run_dir.exists(), progress=False, log=lambda message: None)
    model = build_model(config["model"], bundle.task)
    checkpoint.load_model(checkpoint.resolve(run_dir / "checkpoints" / "last"), model)
    model.eval()
    per_slide, logits, labels = [], [], []
    for record in bundle.test.records:
        features, coords = read_slide(record.paths[0])
        with torch.no_grad():
            logits.append(model(features[None], coords=coords[None])[0, -1].item())
        labels.append(float(record.label))
        if labels[-1] != 1:
            continue
        slide = slides_dir / f"{record.paths[0].stem}.tif"
        overlap = tile_overlap(load_truth(slide)["tumour"], coords.numpy(), size0)
        scores = tile_scores(model, features, coords, kind)
        inside = overlap >= 0.5
        top = np.argsort(-scores, kind="stable")[:inside.sum()]
        per_slide.append({"slide": slide.name, "tiles": len(scores), "mass": heatmap_mass(scores, overlap),
                          "chance": float(overlap.mean()), "tumour_tiles": int(inside.sum()),
                          "precision_at_k": float(inside[top].mean()), "largest_score_share": float(scores.max()
                                                                                                   / scores.sum()),
                          "scores": scores.tolist()})
    return {"model": name, "attention": attention, "n_train": results["n_train"], "n_val": results["n_val"],
            "n_test": results["test"]["n"], "best_epoch": results["best_epoch"],
            "test_auroc_best_by_val": results["test"]["auroc"], "test_auroc_last": roc_auc_score(labels, logits),
            "train_seconds": results["train_seconds"], "slides": per_slide,
            "mean_mass": float(np.mean([s["mass"] for s in per_slide])),
            "mean_chance": float(np.mean([s["chance"] for s in per_slide])),
            "mean_precision_at_k": float(np.mean([s["precision_at_k"] for s in per_slide])),
            "mean_largest_score_share": float(np.mean([s["largest_score_share"] for s in per_slide]))}


def main() -> None:
    args = arguments()
    torch.set_num_threads(args.threads)
    slides_dir, tiles_dir, features_dir = (args.out / name for name in ("slides", "tiles", "features"))
    settings = TileSettings(patch_um=args.patch_um, patch_px=args.patch_px, thumbnail_px=args.thumbnail_px)
    started = time.perf_counter()
    write_synthetic_cohort(slides_dir, args.slides, args.seed, tuple(args.shape))
    slides = list_slides([slides_dir])
    report = {"SYNTHETIC": True, "environment": environment(), "arguments": {k: str(v) for k, v in vars(args).items()},
              "write_seconds": time.perf_counter() - started,
              "tiling": tile_all(slides, tiles_dir, settings),
              "extraction": extraction(slides, tiles_dir, features_dir, settings), "models": {}}
    size0 = round(args.patch_um)  # the synthetic slides are 1 um per px
    for kind in args.models.split(","):
        report["models"][kind] = train_and_score(kind, args, slides_dir, features_dir, size0)
    if args.png and "abmil" in report["models"]:
        shown = report["models"]["abmil"]["slides"][0]
        _, coords = read_slide(features_dir / f"{Path(shown['slide']).stem}.h5")
        slide_heatmap(slides_dir / shown["slide"], coords.numpy(), np.array(shown["scores"]), size0,
                      OutputFolder.within(args.png.parent), args.png.name, thumbnail_px=args.png_px, percentile=True)
        report["png"] = {"path": str(args.png), "slide": shown["slide"]}
    report["total_seconds"] = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "wsi_heatmap_mass.json").write_text(json.dumps(report, indent=1))
    print_table(report)


def print_table(report: dict) -> None:
    t, e = report["tiling"], report["extraction"]
    env = report["environment"]
    print(f"SYNTHETIC slides: {report['arguments']['slides']} ({report['arguments']['shape']} px at 1 um/px); "
          f"{env['processor']}, torch {env['torch']}, {env['torch_threads']} thread(s)")
    print(f"tiles: {t['candidates']} tissue cells read, {t['kept']} kept, {t['white']} white and {t['blurry']} blurry "
          f"dropped ({t['blurry_on_out_of_focus_truth']} of the blurry on the out-of-focus truth); "
          f"tiling {t['candidates_per_s']:.0f} cells/s")
    print(f"extraction ({e['extractor']}, read from the slide + forward): {e['tiles']} tiles in {e['seconds']:.1f} s = "
          f"{e['tiles_per_s']:.0f} tiles/s; forward only: "
          + ", ".join(f"{k} {v:.1f} tiles/s" for k, v in e["forward_only_tiles_per_s"].items()))
    print("held-out test slides; heatmaps and 'last' from the last epoch's weights, 'best' = the run's checkpoint "
          "chosen by validation AUROC")
    print(f"{'model':<24}{'AUROC last':>11}{'best (epoch)':>14}{'tumour slides':>15}{'mass on tumour':>16}"
          f"{'chance':>8}{'precision@K':>13}{'largest share':>15}")
    for m in report["models"].values():
        label = f"{m['model']}" + (f" ({m['attention']})" if m["attention"] else "")
        best = f"{m['test_auroc_best_by_val']:.3f} ({m['best_epoch']})"
        print(f"{label:<24}{m['test_auroc_last']:>11.3f}{best:>14}{len(m['slides']):>15}{m['mean_mass']:>16.3f}"
              f"{m['mean_chance']:>8.3f}{m['mean_precision_at_k']:>13.3f}{m['mean_largest_score_share']:>15.3f}")
    print(f"total {report['total_seconds']:.0f} s")


if __name__ == "__main__":
    main()
