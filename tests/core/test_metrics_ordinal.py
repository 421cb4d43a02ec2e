"""Ordinal metrics (:mod:`medattn.metrics_ordinal`) against scikit-learn: the quadratic weighted kappa, the AUROC of
each cumulative split, the mean absolute error in grades; bad input refused."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import cohen_kappa_score, roc_auc_score

from medattn import metrics_ordinal as mo
from medattn.errors import UserError
from medattn.metrics import UndefinedMetricError


def _probs(rng, n: int, k: int) -> np.ndarray:
    return rng.dirichlet(np.ones(k), n)


def test_kappa_equals_scikit_learns_quadratic_kappa_on_60_seeded_sets():
    for seed in range(60):
        rng = np.random.default_rng(seed)
        k, n = int(rng.integers(2, 7)), int(rng.integers(5, 200))
        true = rng.integers(0, k, n)
        pred = np.clip(true + rng.integers(-2, 3, n), 0, k - 1) if seed % 2 else rng.integers(0, k, n)
        if len(set(true) | set(pred)) < 2:
            continue
        expected = cohen_kappa_score(true, pred, labels=list(range(k)), weights="quadratic")
        assert mo.quadratic_weighted_kappa(true, pred, k) == pytest.approx(expected, abs=1e-12), seed


def test_kappa_of_the_most_probable_grade_and_its_extremes():
    rng = np.random.default_rng(0)
    probs = _probs(rng, 50, 4)
    labels = rng.integers(0, 4, 50)
    assert mo.qwk(probs, labels) == pytest.approx(
        cohen_kappa_score(labels, probs.argmax(1), labels=list(range(4)), weights="quadratic"), abs=1e-12)
    assert mo.quadratic_weighted_kappa([0, 1, 2, 3], [0, 1, 2, 3], 4) == pytest.approx(1.0)
    assert mo.quadratic_weighted_kappa([0, 1, 2, 3], [3, 2, 1, 0], 4) == pytest.approx(-1.0)
    with pytest.raises(UndefinedMetricError, match="one class"):
        mo.quadratic_weighted_kappa([2, 2, 2], [2, 2, 2], 4)


def test_per_threshold_auroc_equals_roc_auc_score_of_each_cumulative_split():
    for seed in range(20):
        rng = np.random.default_rng(seed)
        k = int(rng.integers(2, 6))
        probs, labels = _probs(rng, 80, k), rng.integers(0, k, 80)
        found = mo.threshold_aurocs(probs, labels)
        assert len(found) == k - 1
        for split, value in enumerate(found):
            positive = labels > split
            if 0 < positive.sum() < len(labels):
                assert value == pytest.approx(roc_auc_score(positive, probs[:, split + 1:].sum(1)), abs=1e-12)
            else:
                assert value is None
    assert mo.threshold_aurocs(np.array([[0.5, 0.3, 0.2]] * 3), [0, 0, 1])[1] is None  # nobody above grade 1


def test_mean_absolute_error_in_grades_and_the_expected_grade():
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.2, 0.5, 0.3]])
    labels = np.array([2, 2, 0])
    assert mo.mae(probs, labels) == pytest.approx((2 + 0 + 1) / 3)
    np.testing.assert_allclose(mo.expected(probs), [0.4, 1.5, 1.1])
    np.testing.assert_allclose(mo.cumulative(probs), [[0.3, 0.1], [0.9, 0.6], [0.8, 0.3]])
    found = mo.ordinal_metrics(probs, labels, 0, 0.95, 0)
    assert found["mae"] == (pytest.approx(1.0), None, None)
    assert found["mae_expected"][0] == pytest.approx((1.6 + 0.5 + 1.1) / 3)


def test_bootstrap_intervals_hold_the_value_and_are_reproducible():
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 4, 120)
    probs = np.eye(4)[np.clip(labels + rng.integers(-1, 2, 120), 0, 3)] * 0.7 + 0.075
    first = mo.ordinal_metrics(probs, labels, 200, 0.95, 7, groups=[f"p{i // 2}" for i in range(120)])
    assert first == mo.ordinal_metrics(probs, labels, 200, 0.95, 7, groups=[f"p{i // 2}" for i in range(120)])
    value, low, high = first["qwk"]
    assert low < value < high


def test_the_chance_interval_holds_zero():
    labels = np.random.default_rng(0).integers(0, 5, 60)
    low, high = mo.chance_interval(labels, 5, 0.95)
    assert low < 0 < high < 0.5
    assert mo.chance_interval([1, 1, 1], 3, 0.95) == [0.0, 0.0]


@pytest.mark.parametrize("probs, labels, match", [
    (np.full((3, 3), 1 / 3), [0, 1, 3], "integers 0..2"),
    (np.full((3, 3), 1 / 3), [0, 1, -1], "integers 0..2"),
    (np.full((3, 3), 1 / 3), [0, 1.5, 2], "integers 0..2"),
    (np.full((3, 3), 1 / 3), [0, 1], "one class per row"),
    (np.full((3, 1), 1.0), [0, 0, 0], r"K >= 2"),
    (np.full((3, 3), 0.9), [0, 1, 2], "class probabilities"),
    (np.full((3, 3), np.nan), [0, 1, 2], "class probabilities"),
    (np.full(3, 0.3), [0, 1, 2], "class probabilities"),
])
def test_bad_input_is_a_user_error(probs, labels, match):
    with pytest.raises(UserError, match=match):
        mo.qwk(probs, labels)


def test_bad_grades_are_a_user_error():
    with pytest.raises(UserError, match="two"):
        mo.quadratic_weighted_kappa([0, 1], [0, 1, 2], 3)
    with pytest.raises(UserError, match="integers"):
        mo.quadratic_weighted_kappa([0, 1, 5], [0, 1, 2], 3)
    with pytest.raises(UserError, match="K >= 2"):
        mo.confusion([0], [0], 1)


def test_the_confusion_figure_counts_every_case():
    from matplotlib.figure import Figure

    counts = mo.confusion([0, 0, 1, 2, 2], [0, 1, 1, 2, 1], 3)
    assert counts.tolist() == [[1, 1, 0], [0, 1, 0], [0, 1, 1]]
    figure = mo.confusion_figure([0, 0, 1, 2, 2], [0, 1, 1, 2, 1], ["G1", "G2", "G3"], "test: QWK 0.5, n=5")
    assert isinstance(figure, Figure) and [t.get_text() for t in figure.axes[0].texts] == \
        ["1", "1", "0", "0", "1", "0", "0", "1", "1"]
