"""Youden's J thresholds against a brute-force reference; parsing and resolving --threshold."""

import numpy as np
import pytest

from medattn.errors import UserError
from medattn.runtime.threshold import (
    choose_thresholds,
    parse_thresholds,
    resolve_thresholds,
    stored_thresholds,
    youden_threshold,
)


def _brute_force(scores, labels):
    """Every distinct score as the cut (positive when p >= t): the best J, highest cut on ties."""
    best, cut = -2.0, None
    for t in sorted(set(scores.tolist()), reverse=True):
        called = scores >= t
        j = called[labels == 1].mean() - called[labels == 0].mean()
        if j > best + 1e-12:
            best, cut = j, t
    return best, cut


@pytest.mark.parametrize("seed", range(6))
def test_youden_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, 40)
    labels[:2] = [0, 1]
    scores = np.round(rng.random(40) * 0.5 + 0.3 * labels, 2)  # rounded: ties happen
    t = youden_threshold(scores, labels)
    best, cut = _brute_force(scores, labels)
    called = scores >= t
    assert called[labels == 1].mean() - called[labels == 0].mean() == pytest.approx(best)
    lower = scores[scores < cut]
    assert t == pytest.approx((cut + lower.max()) / 2 if len(lower) else cut)  # midpoint of the gap below the cut


def test_separable_and_one_class_and_multiclass():
    assert youden_threshold(np.array([0.1, 0.2, 0.7, 0.9]), np.array([0, 0, 1, 1])) == pytest.approx(0.45)
    assert youden_threshold(np.array([0.1, 0.2]), np.array([1, 1])) is None
    probs, labels = np.array([[0.1, 0.8], [0.9, 0.7], [0.2, 0.1]]), np.array([[0, 1], [1, 1], [0, 0]])
    assert choose_thresholds(probs, labels, "multilabel") == [pytest.approx(0.55), pytest.approx(0.4)]
    assert choose_thresholds(probs, labels, "multiclass") is None


def test_parse_resolve_and_stored():
    assert parse_thresholds("0.3", 2) == [0.3, 0.3] and parse_thresholds("0.3,0.6", 2) == [0.3, 0.6]
    for bad in ("1.5", "a", "0.1,0.2,0.3"):
        with pytest.raises(UserError, match="--threshold must be one number in"):
            parse_thresholds(bad, 2)
    assert resolve_thresholds([0.2, None], None, 2) == ([0.2, 0.5], "validation Youden's J (0.5 for output(s) [1]: "
                                                                    "one class only in validation)")
    assert resolve_thresholds([0.2, 0.3], "0.9", 2)[0] == [0.9, 0.9]
    assert resolve_thresholds(None, None, 1)[1].startswith("default 0.5")
    assert stored_thresholds({"threshold": {"values": [0.25]}}, 1, "c.json") == [0.25]
    with pytest.raises(UserError, match=r"c.json: threshold.values must list 1 number"):
        stored_thresholds({"threshold": {"values": [2.0]}}, 1, "c.json")
