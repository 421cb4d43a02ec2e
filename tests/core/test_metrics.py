import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from medattn import metrics
from medattn.errors import UserError


def test_binary_auroc_matches_the_pair_count():
    probs = np.array([[0.1], [0.4], [0.35], [0.8]])
    labels = np.array([[0], [0], [1], [1]])
    assert metrics.auroc(probs, labels, "binary") == pytest.approx(0.75)  # 3 of 4 pos-neg pairs ordered


def test_multiclass_is_one_vs_rest_macro_and_multilabel_is_macro():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(3), 30)
    labels = np.arange(30) % 3
    per_class = [roc_auc_score(labels == k, probs[:, k]) for k in range(3)]
    assert metrics.auroc(probs, labels, "multiclass") == pytest.approx(np.mean(per_class))
    multi = rng.integers(0, 2, (30, 2))
    per_label = [roc_auc_score(multi[:, k], probs[:, k]) for k in range(2)]
    assert metrics.auroc(probs[:, :2], multi, "multilabel") == pytest.approx(np.mean(per_label))


def test_one_class_is_a_message_not_nan():
    with pytest.raises(UserError, match="undefined on the validation split: all 3 samples are negative for output"):
        metrics.auroc(np.array([[0.1], [0.2], [0.3]]), np.zeros((3, 1)), "binary", "validation")
    with pytest.raises(UserError, match="class.*'c2' absent"):
        metrics.auroc(np.full((4, 3), 1 / 3), np.array([0, 1, 0, 1]), "multiclass", "test", ["c0", "c1", "c2"])


def test_bad_shapes_are_value_errors():
    with pytest.raises(ValueError, match="binary task has one output"):
        metrics.auroc(np.zeros((4, 2)), np.zeros((4, 2)), "binary")
    with pytest.raises(ValueError, match="task_type"):
        metrics.auroc(np.zeros((4, 1)), np.zeros((4, 1)), "regression")


def test_bootstrap_ci_is_seeded_and_brackets_the_estimate():
    rng = np.random.default_rng(1)
    labels = (np.arange(60) % 2)[:, None]
    probs = np.clip(labels * 0.3 + rng.random((60, 1)) * 0.7, 0, 1)
    score = metrics.auroc(probs, labels, "binary")
    low, high = metrics.bootstrap_ci(probs, labels, "binary", n_boot=100, seed=3)
    assert low < score < high
    assert (low, high) == metrics.bootstrap_ci(probs, labels, "binary", n_boot=100, seed=3)
    assert (low, high) != metrics.bootstrap_ci(probs, labels, "binary", n_boot=100, seed=4)
    narrow = metrics.bootstrap_ci(probs, labels, "binary", n_boot=100, ci=0.5, seed=3)
    assert low < narrow[0] < narrow[1] < high


def test_roc_figure(tmp_path):
    """The metric draws the figure and writes nothing: its caller saves it through its folder."""
    import matplotlib.pyplot as plt

    from medattn.outputs import OutputFolder

    probs = np.random.default_rng(0).dirichlet(np.ones(3), 12)
    figure = metrics.roc_figure(probs, np.arange(12) % 3, "multiclass", "t", ["a", "b", "c"])
    assert len(figure.axes[0].get_lines()) == 4 and list(tmp_path.iterdir()) == []  # three classes, the diagonal
    path = OutputFolder(tmp_path).save_figure("roc.png", figure, dpi=100)
    plt.close(figure)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _brute_cluster_ci(probs, labels, groups, n_boot, ci, seed):
    """The cluster bootstrap written out: draw patients (first-appearance order) with replacement, take
    all their samples, redraw resamples with one class, percentile interval."""
    patients = list(dict.fromkeys(groups))
    rng = np.random.default_rng(seed)
    scores = []
    while len(scores) < n_boot:
        drawn = [patients[k] for k in rng.integers(0, len(patients), len(patients))]
        rows = [i for p in drawn for i in range(len(groups)) if groups[i] == p]
        if len(set(labels[rows, 0])) == 2:
            scores.append(roc_auc_score(labels[rows, 0], probs[rows, 0]))
    return tuple(np.quantile(scores, [(1 - ci) / 2, (1 + ci) / 2]))


def test_patient_bootstrap_resamples_patients():
    rng = np.random.default_rng(0)
    labels = (np.arange(30) % 2)[:, None]
    probs = np.clip(labels * 0.3 + rng.random((30, 1)) * 0.7, 0, 1)
    copies = 4  # every patient has four identical images: no more information than one each
    probs4, labels4 = np.repeat(probs, copies, 0), np.repeat(labels, copies, 0)
    patients = [f"p{i // copies}" for i in range(30 * copies)]
    per_sample = metrics.bootstrap_ci(probs4, labels4, "binary", n_boot=300, seed=0)
    per_patient = metrics.bootstrap_ci(probs4, labels4, "binary", n_boot=300, seed=0, groups=patients)
    one_each = metrics.bootstrap_ci(probs, labels, "binary", n_boot=300, seed=0, groups=patients[::copies])
    assert per_patient[1] - per_patient[0] > 1.5 * (per_sample[1] - per_sample[0])
    assert per_patient == pytest.approx(one_each, abs=1e-12)  # four copies of a patient: the AUROC of one
    # one patient per sample is the per-sample bootstrap, draw for draw
    assert metrics.bootstrap_ci(probs, labels, "binary", n_boot=50, seed=2, groups=[f"x{i}" for i in range(30)]) == \
        metrics.bootstrap_ci(probs, labels, "binary", n_boot=50, seed=2)


def test_patient_bootstrap_equals_the_brute_reference():
    probs = np.array([[0.1], [0.7], [0.4], [0.2], [0.9], [0.6], [0.3], [0.8]])
    labels = np.array([[0], [1], [0], [0], [1], [1], [1], [0]])
    groups = ["b", "b", "a", "c", "c", "c", "d", "e"]  # patients of 1 to 3 images, not in sorted order
    expected = _brute_cluster_ci(probs, labels, groups, n_boot=200, ci=0.9, seed=5)
    assert metrics.bootstrap_ci(probs, labels, "binary", n_boot=200, ci=0.9, seed=5, groups=groups) == \
        pytest.approx(expected, abs=1e-12)
    with pytest.raises(ValueError, match="one patient per sample"):
        metrics.bootstrap_ci(probs, labels, "binary", groups=groups[:3])


def test_dice_bootstrap_resamples_patients():
    rng = np.random.default_rng(1)
    dice = np.column_stack([np.ones(20), rng.random(20), rng.random(20)])
    dice4, patients = np.repeat(dice, 4, 0), [f"p{i // 4}" for i in range(80)]
    per_case = metrics.dice_bootstrap_ci(dice4, n_boot=300, seed=0)
    per_patient = metrics.dice_bootstrap_ci(dice4, n_boot=300, seed=0, groups=patients)
    assert per_patient[1] - per_patient[0] > 1.5 * (per_case[1] - per_case[0])
    assert per_patient == pytest.approx(metrics.dice_bootstrap_ci(dice, n_boot=300, seed=0), abs=1e-12)


def test_training_scores_with_patient_clusters(tmp_path):
    from medattn.data.base import TaskInfo
    from medattn.train.objectives import Classification, Predictions, Segmentation

    rng = np.random.default_rng(0)
    labels = np.repeat((np.arange(12) % 2)[:, None], 3, 0)
    probs = np.clip(labels * 0.3 + rng.random((36, 1)) * 0.7, 0, 1)
    patients = [f"p{i // 3}" for i in range(36)]
    pred = Predictions([str(i) for i in range(36)], patients, probs, labels, 0.0)
    eval_cfg = {"bootstrap": 100, "ci": 0.95}
    result = Classification(TaskInfo("binary", "image2d", 1, (1, 8, 8), ["y"])).score(pred, "test", eval_cfg,
                                                                                       seed=1)
    expected = metrics.bootstrap_ci(probs, labels, "binary", 100, 0.95, 1, groups=patients)
    assert (result["ci_low"], result["ci_high"]) == expected
    dice = np.column_stack([np.ones(36), rng.random(36)])
    seg = Predictions([str(i) for i in range(36)], patients, dice, np.ones((36, 2)), 0.0)
    result = Segmentation(TaskInfo("segmentation", "volume3d", 2, (1, 4, 4, 4), ["bg", "fg"])).score(
        seg, "test", eval_cfg, seed=1)
    assert (result["ci_low"], result["ci_high"]) == metrics.dice_bootstrap_ci(dice, 100, 0.95, 1, groups=patients)


def test_training_curves_mark_the_kept_epoch(tmp_path):
    from medattn.outputs import OutputFolder
    from medattn.train.report import plot_curves

    rows = [{"epoch": e, "train_loss": 1 / e, "val_loss": 1 / e + 0.1, "val_auroc": 0.5 + e / 10} for e in (1, 2, 3)]
    loss, score = plot_curves(rows, "val_auroc", OutputFolder.within(tmp_path), "t", best_epoch=2, name="c.png")
    for axis in (loss, score):
        marks = [line for line in axis.get_lines() if list(line.get_xdata()) == [2, 2]]
        assert len(marks) == 1 and marks[0].get_linestyle() == "--"
    assert (tmp_path / "c.png").stat().st_size > 0


@pytest.mark.parametrize("auc, positives, negatives, within", [
    (0.6, 30, 30, 0.1), (0.75, 20, 40, 0.12), (0.89, 30, 30, 0.1),
    (0.97, 30, 30, 0.25),  # the exponential approximation overstates a binormal AUROC's error near 1: conservative
])
def test_the_auroc_standard_error_matches_the_spread_of_simulated_aurocs(auc, positives, negatives, within):
    """Hanley & McNeil's closed form against the standard deviation of 4,000 AUROCs (Mann-Whitney U over ranks) of
    binormal scores whose true AUROC is ``auc`` (positives N(d, 1), negatives N(0, 1), d = sqrt(2) Phi^-1(auc))."""
    from scipy.stats import norm, rankdata

    from medattn.metrics import auroc_standard_error

    rng = np.random.default_rng(0)
    shift = np.sqrt(2) * norm.ppf(auc)
    scores = np.c_[rng.normal(shift, 1, (4000, positives)), rng.normal(0, 1, (4000, negatives))]
    ranks = rankdata(scores, axis=1)[:, :positives].sum(1)
    found = (ranks - positives * (positives + 1) / 2) / (positives * negatives)
    expected = auroc_standard_error(auc, positives, negatives)
    assert expected == pytest.approx(np.std(found), rel=within)
    assert auroc_standard_error(1.0, positives, negatives) == 0.0
    with pytest.raises(ValueError, match="both classes"):
        auroc_standard_error(auc, 0, negatives)
