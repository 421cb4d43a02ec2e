"""AUROC for binary, multi-class and multi-label tasks, its bootstrap confidence interval, ROC plots;
mean Dice for segmentation and its bootstrap confidence interval.

Shapes: ``probs`` is (N, K) with K = the model's outputs (K = 1 for binary: the positive class's
probability). ``labels`` is (N, K) of 0/1 for binary and multi-label tasks, or (N,) class indices for
multi-class tasks. Multi-class AUROC is one-vs-rest, macro-averaged; multi-label AUROC is the macro
average over outputs (scikit-learn's definitions).

Segmentation: ``dice`` is (N, K), one row of per-class Dice per case (class 0 = background), NaN where
a class is absent from both the case's prediction and its label (see
:func:`medattn.models.segmentation.dice_per_class`). A class's Dice is the mean over the cases where it
is defined; the mean Dice is the mean of the foreground classes' Dice (classes 1..K-1).

Confidence intervals are percentile bootstraps. Given ``groups`` (the patient id of each sample) they
resample patients, not samples (a cluster bootstrap): each resample draws as many patients as there
are, with replacement, and takes all samples of every patient drawn. Samples of one patient (the
images of one skin, the left and right breast) are correlated; resampling them one by one treats
them as independent and gives intervals that are too narrow. Without ``groups`` every sample is its
own patient, and then both forms give the same interval for the same seed.

AUROC is undefined when a split lacks a class; :class:`UndefinedMetricError` (a
:class:`~medattn.errors.UserError`) then names the split, the output and the class present, instead of
returning NaN.
"""

from __future__ import annotations

import textwrap

import numpy as np
from sklearn.metrics import roc_auc_score, roc_curve

from medattn.errors import UserError
from medattn.vocabulary import task_types


class UndefinedMetricError(UserError):
    """AUROC cannot be computed (a class is absent from the split)."""


def _missing_class(probs: np.ndarray, labels: np.ndarray, task_type: str, names: list[str]) -> str | None:
    """A sentence naming the output whose labels hold one class only, or None when AUROC is defined."""
    if task_types.of(task_type).class_index:
        present = set(np.unique(labels).tolist())
        absent = [i for i in range(probs.shape[1]) if i not in present]
        if absent:
            return f"class(es) {', '.join(_name(names, i) for i in absent)} absent among {len(labels)} samples"
        return None
    for k in range(labels.shape[1]):
        values = np.unique(labels[:, k])
        if len(values) < 2:
            only = "positive" if values.size and values[0] == 1 else "negative"
            return f"all {len(labels)} samples are {only} for output {_name(names, k)}"
    return None


def _name(names: list[str], index: int) -> str:
    return repr(names[index]) if index < len(names) else str(index)


def _score(probs: np.ndarray, labels: np.ndarray, task_type: str) -> float:
    kind = task_types.of(task_type)
    if kind.class_index:
        return float(roc_auc_score(labels, probs, multi_class="ovr", average="macro", labels=range(probs.shape[1])))
    if kind.fixed_outputs == 1:
        return float(roc_auc_score(labels[:, 0], probs[:, 0]))
    return float(roc_auc_score(labels, probs, average="macro"))


def _check(probs: np.ndarray, labels: np.ndarray, task_type: str) -> tuple[np.ndarray, np.ndarray]:
    probs = np.asarray(probs, dtype=np.float64)
    labels = np.asarray(labels)
    kind = task_types.of(task_type)
    if not kind.classes:
        raise ValueError(f"task_type must be one of {', '.join(task_types.names_where('classes'))}, got "
                         f"{task_type!r}")
    if probs.ndim != 2 or probs.shape[0] != labels.shape[0] or probs.shape[0] == 0:
        raise ValueError(f"probs must be (N, K) with N = len(labels) > 0, got {probs.shape} and {labels.shape}")
    if kind.class_index and labels.ndim != 1:
        raise ValueError(f"multi-class labels must be (N,) class indices, got shape {labels.shape}")
    if not kind.class_index and labels.shape != probs.shape:
        raise ValueError(f"labels must match probs' shape {probs.shape}, got {labels.shape}")
    if kind.fixed_outputs is not None and probs.shape[1] != kind.fixed_outputs:
        raise ValueError(f"{kind.noun} has one output, got {probs.shape[1]}")
    return probs, labels


def auroc(probs, labels, task_type: str, split: str = "", names: list[str] | None = None) -> float:
    """Area under the ROC curve; raises UndefinedMetricError when a class is missing from the split."""
    probs, labels = _check(probs, labels, task_type)
    problem = _missing_class(probs, labels, task_type, names or [])
    if problem:
        where = f" on the {split} split" if split else ""
        raise UndefinedMetricError(f"AUROC is undefined{where}: {problem}; the split needs both classes")
    return _score(probs, labels, task_type)


def auroc_standard_error(auc: float, positives: int, negatives: int) -> float:
    """The standard error of an AUROC of ``auc`` on ``positives`` and ``negatives`` cases (Hanley & McNeil, Radiology
    1982, eq. 2: the exponential approximation)::

        Q1 = A / (2 - A),  Q2 = 2 A^2 / (1 + A)
        SE^2 = (A (1 - A) + (n+ - 1)(Q1 - A^2) + (n- - 1)(Q2 - A^2)) / (n+ n-)

    e.g. 0.044 at A = 0.89 with 30 positive and 30 negative cases, 0.009 at A = 0.995, 0 at A = 1."""
    if positives < 1 or negatives < 1:
        raise ValueError(f"an AUROC needs both classes, got {positives} positive and {negatives} negative cases")
    a = min(max(float(auc), 0.0), 1.0)
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    variance = (a * (1 - a) + (positives - 1) * (q1 - a * a) + (negatives - 1) * (q2 - a * a)) / (positives * negatives)
    return max(variance, 0.0) ** 0.5


def auroc_error_of_labels(auc: float, labels) -> float | None:
    """:func:`auroc_standard_error` of an AUROC ``auc`` on cases with 0/1 ``labels`` (N,) or (N, 1); None where they
    hold one class only (a binary task's :attr:`~medattn.vocabulary.task_type.TaskType.score_error`)."""
    labels = np.asarray(labels).reshape(-1)
    positives = int((labels > 0.5).sum())
    if positives in (0, len(labels)):
        return None
    return auroc_standard_error(auc, positives, len(labels) - positives)


def bootstrap_ci(probs, labels, task_type: str, n_boot: int = 1000, ci: float = 0.95, seed: int = 0,
                 groups=None) -> tuple[float, float]:
    """Percentile bootstrap CI of the AUROC over ``n_boot`` resamples with replacement.

    ``groups`` (N,): the patient of each sample; patients are resampled (all samples of a drawn patient
    enter the resample), else samples. Resamples in which a class is absent are drawn again (they have
    no AUROC); the generator is ``numpy.random.default_rng(seed)``, so the interval is reproducible.
    """
    probs, labels = _check(probs, labels, task_type)
    auroc(probs, labels, task_type)  # defined on the full set, or raise
    return _percentile_bootstrap(
        _units(groups, len(labels)), lambda i: _missing_class(probs[i], labels[i], task_type, []) is None,
        lambda i: _score(probs[i], labels[i], task_type), n_boot, ci, seed, "contain every class")


def _units(groups, n: int) -> int | list[np.ndarray]:
    """What a bootstrap draws: the sample indices of each group (groups in order of first appearance),
    or the number of samples ``n`` without groups."""
    if groups is None:
        return n
    groups = list(groups)
    if len(groups) != n:
        raise ValueError(f"groups must give one patient per sample ({n}), got {len(groups)}")
    members: dict = {}
    for index, group in enumerate(groups):
        members.setdefault(group, []).append(index)
    return [np.array(m) for m in members.values()]


def _percentile_bootstrap(units: int | list[np.ndarray], defined, statistic, n_boot: int, ci: float, seed: int,
                          requirement: str) -> tuple[float, float]:
    """Percentile CI of ``statistic(index)`` over ``n_boot`` resamples ``index`` with replacement.

    ``units``: the number of samples n (a resample is n draws from ``range(n)``) or the clusters (a list
    of G index arrays; a resample is G draws of clusters, concatenated in draw order). Resamples for which
    ``defined(index)`` is False are drawn again, at most 20 * n_boot draws in all; the generator is
    ``numpy.random.default_rng(seed)``, so the interval is reproducible.
    """
    rng = np.random.default_rng(seed)
    clusters = units if isinstance(units, list) else None
    count = len(clusters) if clusters is not None else units
    scores: list[float] = []
    attempts = 0
    while len(scores) < n_boot:
        attempts += 1
        if attempts > 20 * n_boot:
            raise UndefinedMetricError(f"bootstrap: too few resamples {requirement} ({len(scores)} of {n_boot})")
        index = rng.integers(0, count, count)
        if clusters is not None:
            index = np.concatenate([clusters[k] for k in index])
        if defined(index):
            scores.append(statistic(index))
    alpha = (1 - ci) / 2
    low, high = np.quantile(scores, [alpha, 1 - alpha])
    return float(low), float(high)


def roc_figure(probs, labels, task_type: str, title: str = "", names: list[str] | None = None):
    """ROC curve(s) -> a matplotlib Figure (the caller saves it through its :class:`~medattn.outputs.OutputFolder`
    and closes it): one curve for binary, one per class/output (one-vs-rest) otherwise."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    probs, labels = _check(probs, labels, task_type)
    names = names or []
    onehot = np.eye(probs.shape[1])[labels] if task_types.of(task_type).class_index else labels
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    for k in range(probs.shape[1]):
        if len(np.unique(onehot[:, k])) < 2:
            continue
        fpr, tpr, _ = roc_curve(onehot[:, k], probs[:, k])
        score = roc_auc_score(onehot[:, k], probs[:, k])
        label = names[k] if k < len(names) else f"output {k}"
        ax.plot(fpr, tpr, label=f"{label} (AUROC {score:.3f})")
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
    ax.set(xlabel="false positive rate", ylabel="true positive rate", xlim=(0, 1), ylim=(0, 1.01))
    ax.set_title(wrap_title(title, 52), fontsize=9)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fit_title(fig, ax.title)
    return fig


def wrap_title(text: str, width: int) -> str:
    """``text`` on lines of at most ``width`` characters, broken after its commas where it can (an interval
    "0.238 to 1.000" stays on one line), elsewhere between words."""
    lines: list[str] = []
    for part in text.split(", "):
        if lines and len(lines[-1]) + 2 + len(part) <= width:
            lines[-1] += ", " + part
        else:
            if lines:
                lines[-1] += ","
            lines.extend(textwrap.wrap(part, width) or [""])
    return "\n".join(lines)


def fit_title(fig, title) -> None:
    """Shrink the font of ``title`` (a Text of ``fig``, laid out) until its drawn box lies inside the figure: a
    long title (model, split, AUROC with its interval, n, the SYNTHETIC mark) is never clipped at the sides."""
    if title is None or not title.get_text():
        return
    fig.canvas.draw()
    inside = fig.bbox
    for _ in range(8):
        box = title.get_window_extent()
        if box.x0 >= inside.x0 and box.x1 <= inside.x1 and box.y0 >= inside.y0 and box.y1 <= inside.y1:
            return
        scale = min(1.0, inside.width / max(box.width, 1.0)) * 0.95
        title.set_fontsize(max(5.0, title.get_fontsize() * scale))
        fig.tight_layout()
        fig.canvas.draw()


def class_dice(dice) -> np.ndarray:
    """(N, K) per-case Dice -> (K,) per-class Dice: the mean over the cases where the class is defined."""
    dice = np.asarray(dice, dtype=np.float64)
    if dice.ndim != 2 or dice.shape[0] == 0 or dice.shape[1] < 2:
        raise ValueError(f"dice must be (N, K) with N > 0 cases and K >= 2 classes, got {dice.shape}")
    defined = ~np.isnan(dice)
    totals = np.where(defined, dice, 0.0).sum(0)
    counts = defined.sum(0)
    return np.divide(totals, counts, out=np.full(dice.shape[1], np.nan), where=counts > 0)


def mean_dice(dice, split: str = "") -> float:
    """Mean foreground Dice: the mean of :func:`class_dice` over classes 1..K-1 present in the split.

    Raises :class:`UndefinedMetricError` when no foreground class occurs in the split (in any label
    or prediction).
    """
    per_class = class_dice(dice)[1:]
    if np.isnan(per_class).all():
        where = f" on the {split} split" if split else ""
        raise UndefinedMetricError(f"Dice is undefined{where}: no foreground class in any of the "
                                   f"{len(dice)} cases' labels or predictions")
    return float(np.nanmean(per_class))


def dice_bootstrap_ci(dice, n_boot: int = 1000, ci: float = 0.95, seed: int = 0, groups=None) -> tuple[float, float]:
    """Percentile bootstrap CI of :func:`mean_dice` over ``n_boot`` resamples with replacement: of the
    patients given ``groups`` (N,) (all cases of a drawn patient enter the resample), else of the cases.
    Resamples without any foreground are drawn again; ``numpy.random.default_rng(seed)``."""
    dice = np.asarray(dice, dtype=np.float64)
    mean_dice(dice)  # defined on the full set, or raise
    return _percentile_bootstrap(_units(groups, len(dice)), lambda i: not np.isnan(dice[i, 1:]).all(),
                                 lambda i: mean_dice(dice[i]), n_boot, ci, seed, "contain a foreground class")


def paired_bootstrap(difference, groups: list, n_boot: int = 1000, ci: float = 0.95, seed: int = 0) -> dict:
    """Paired percentile bootstrap of a difference between two systems scored on the same test cases.

    ``groups``: one list per stratum (a seed's or a fold's test set) of the patient of each case, in the
    order both systems' outputs are in. ``difference(index)`` gets one index array per stratum and returns
    the statistic on that resample (e.g. the mean over strata of AUROC_A - AUROC_B), or None where it is
    undefined (then the resample is drawn again, at most 20 * n_boot draws). A resample draws, in every
    stratum independently, as many patients as it has, with replacement, and takes all cases of each
    patient drawn for both systems at once: the pairing is kept, so the case-to-case variation the two
    systems share cancels. ``numpy.random.default_rng(seed)``.

    Returns ``difference`` on all cases, the percentile interval at ``ci`` and a two-sided p-value
    ``min(1, 2 min((1 + #{d* <= 0}) / (B + 1), (1 + #{d* >= 0}) / (B + 1)))`` over the B resampled
    differences d* (the smallest 1 - ci whose percentile interval excludes 0, counted so it is never 0).
    """
    units = [_units(g, len(g)) for g in groups]
    observed = difference([np.arange(len(g)) for g in groups])
    if observed is None:
        raise UndefinedMetricError("paired bootstrap: the statistic is undefined on the full test set")
    rng = np.random.default_rng(seed)
    draws: list[float] = []
    attempts = 0
    while len(draws) < n_boot:
        attempts += 1
        if attempts > 20 * n_boot:
            raise UndefinedMetricError(f"paired bootstrap: too few resamples with a defined statistic "
                                       f"({len(draws)} of {n_boot})")
        index = [np.concatenate([u[k] for k in rng.integers(0, len(u), len(u))]) for u in units]
        value = difference(index)
        if value is not None:
            draws.append(value)
    d = np.asarray(draws)
    alpha = (1 - ci) / 2
    low, high = np.quantile(d, [alpha, 1 - alpha])
    p = min(1.0, 2 * min((1 + (d <= 0).sum()) / (n_boot + 1), (1 + (d >= 0).sum()) / (n_boot + 1)))
    return {"difference": float(observed), "ci_low": float(low), "ci_high": float(high), "p_value": float(p),
            "n_boot": n_boot}
