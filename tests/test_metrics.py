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


def test_roc_png(tmp_path):
    probs = np.random.default_rng(0).dirichlet(np.ones(3), 12)
    path = metrics.plot_roc(probs, np.arange(12) % 3, "multiclass", tmp_path / "roc.png", "t", ["a", "b", "c"])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
