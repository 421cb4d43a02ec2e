"""A segmentation run's best and worst test cases, for its report page (``eval.heatmaps`` cases of each).

The cases are ranked by their mean foreground Dice (the test's per-case Dice, NaN classes left out; a case whose every
class is absent from both maps is not ranked). Each is predicted again by the kept model as the test predicted it
(:class:`~medattn.runtime.predictor.Predictor` of the run's config: precision, sliding window) and drawn as two
panels of its prepared input (a volume: the slice along the last axis holding the most foreground of either map),
the true label map and the model's over it, one colour per class (Okabe-Ito, readable with the common
colour-vision deficiencies), with a legend and a title naming the run, the case, its rank and its Dice. The pictures
are ``heatmaps/best_test_case_<k>.png`` and ``heatmaps/worst_test_case_<k>.png`` in the run folder.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..outputs import OutputFolder

#: Okabe-Ito colours of classes 1, 2, ... (background is not drawn).
COLOURS = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#000000")


def ranked_cases(dice: np.ndarray) -> tuple[list[int], np.ndarray]:
    """(the cases that can be ranked, best first, their mean foreground Dice per case (N,)) from the per-class Dice
    ``dice`` (N, K), NaN where a class is in neither map."""
    dice = np.asarray(dice, dtype=np.float64).reshape(len(dice), -1)[:, 1:]
    defined = ~np.isnan(dice)
    mean = np.where(defined.any(1), np.nansum(np.nan_to_num(dice), 1) / np.maximum(defined.sum(1), 1), np.nan)
    order = [int(i) for i in np.argsort(-np.nan_to_num(mean, nan=-1.0), kind="stable") if not np.isnan(mean[i])]
    return order, mean


def segmentation_cases(model: torch.nn.Module, dataset, dice: np.ndarray, ids: list[str], task, out_dir: Path,
                       title: str, count: int, config: dict) -> tuple[list[str], list[str]]:
    """Write the ``count`` best and ``count`` worst test cases of ``dataset`` (``dice``: the test's per-case Dice
    per class (N, K), in dataset order) into ``out_dir`` (module docstring); -> (the pictures, relative to ``out_dir``,
    the best first; warnings)."""
    from medattn.data.base import collate
    from medattn.runtime.predictor import Predictor

    order, mean = ranked_cases(dice)
    if count <= 0 or not order:
        return [], []
    best = order[:count]
    worst = [i for i in order[::-1][:count] if i not in best]
    predictor = Predictor.for_run(model, config, task, next(model.parameters()).device)
    folder = OutputFolder.within(Path(out_dir) / "heatmaps")  # inside the run folder, whose policy train applied
    names = []
    for which, cases in (("best", best), ("worst", worst)):
        for k, index in enumerate(cases, start=1):
            batch = collate([dataset[index]])
            with torch.no_grad():
                predicted = predictor.logits(batch).float().argmax(1)[0].cpu().numpy()
            image = batch["input"][0, 0].float().cpu().numpy()
            truth = batch["label"][0].cpu().numpy()
            heading = (f"{title} | {which} test case {k}: {ids[index]}, mean Dice {mean[index]:.3f} "
                       f"(rank {order.index(index) + 1} of {len(order)})")
            name = f"{which}_test_case_{k}.png"
            _draw(folder, name, image, truth, predicted, list(task.class_names), heading, task.synthetic)
            names.append(f"heatmaps/{name}")
    return names, []


def _plane(image: np.ndarray, truth: np.ndarray, predicted: np.ndarray):
    """The 2D plane of a case: itself, or a volume's slice along the last axis with the most foreground."""
    if truth.ndim == 2:
        return image, truth, predicted, ""
    foreground = ((truth > 0) | (predicted > 0)).reshape(-1, truth.shape[-1]).sum(0)
    s = int(np.argmax(foreground))
    return image[..., s], truth[..., s], predicted[..., s], f" (slice {s + 1} of {truth.shape[-1]})"


def _draw(folder: OutputFolder, name: str, image, truth, predicted, names: list[str], heading: str,
          synthetic: bool) -> None:
    """``name`` in ``folder``: two panels, the true and the predicted label map over the image, one colour per class,
    a legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    image, truth, predicted, where = _plane(image, truth, predicted)
    low, high = np.percentile(image, [1, 99]) if image.size else (0.0, 1.0)
    colours = ListedColormap([COLOURS[(k - 1) % len(COLOURS)] for k in range(1, max(len(names), 2))])
    figure, axes = plt.subplots(1, 2, figsize=(8, 4.4))
    for axis, labels, what in zip(axes, (truth, predicted), ("true labels", "predicted labels")):
        axis.imshow(image, cmap="gray", vmin=low, vmax=high if high > low else low + 1)
        shown = np.ma.masked_where(labels == 0, labels - 1)
        axis.imshow(shown, cmap=colours, vmin=0, vmax=max(len(names) - 2, 1), alpha=0.5, interpolation="nearest")
        axis.set_title(what + where, fontsize=9)
        axis.axis("off")
    handles = [Patch(color=COLOURS[(k - 1) % len(COLOURS)], label=name) for k, name in enumerate(names) if k]
    figure.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6), fontsize=8, frameon=False)
    figure.suptitle(heading + (" | SYNTHETIC data" if synthetic else ""), fontsize=9, wrap=True)
    figure.tight_layout(rect=(0, 0.06, 1, 0.92))
    folder.save_figure(name, figure, dpi=100)
    plt.close(figure)
