"""medattn.metrics_regression against scikit-learn and scipy, and its patient bootstrap against a written-out one."""

import numpy as np
import pytest
from scipy.stats import pearsonr
from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

from medattn import metrics_regression as mr
from medattn.metrics import UndefinedMetricError


def regression_data(seed: int, n: int, outputs: int | None = None):
    """Targets on different scales and offsets (age in years, a volume in ml, ...) with noisy predictions."""
    rng = np.random.default_rng(seed)
    shape = (n,) if outputs is None else (n, outputs)
    scale = 1.0 if outputs is None else np.array([1.0, 10.0, 250.0][:outputs])
    true = rng.normal(size=shape) * scale + 3 * scale
    return true + rng.normal(size=shape) * scale * 0.5, true


def references(pred, true):
    """(K,) per-output values of each metric from scikit-learn and scipy."""
    pred, true = (pred[:, None], true[:, None]) if pred.ndim == 1 else (pred, true)
    return {"mae": mean_absolute_error(true, pred, multioutput="raw_values"),
            "rmse": np.sqrt(mean_squared_error(true, pred, multioutput="raw_values")),  # sklearn < 1.4 too
            "r2": r2_score(true, pred, multioutput="raw_values"),
            "pearson_r": np.array([pearsonr(pred[:, k], true[:, k]).statistic for k in range(true.shape[1])])}


@pytest.mark.parametrize("seed, n, outputs", [(0, 50, None), (1, 7, None), (2, 200, 3), (3, 30, 2)])
def test_each_metric_equals_scikit_learn_and_scipy(seed, n, outputs):
    pred, true = regression_data(seed, n, outputs)
    expected = references(pred, true)
    functions = {"mae": mr.mae, "rmse": mr.rmse, "r2": mr.r2, "pearson_r": mr.pearson_r}
    for metric, function in functions.items():
        assert function(pred, true) == pytest.approx(expected[metric].mean(), abs=1e-12, rel=0), metric
    result = mr.regression_metrics(pred, true, n_boot=0)
    for metric in mr.METRICS:
        assert result[metric] == (pytest.approx(expected[metric].mean(), abs=1e-12, rel=0), None, None)
        for k in range(expected[metric].size if outputs else 0):
            assert result[f"{metric}/{k}"][0] == pytest.approx(expected[metric][k], abs=1e-12, rel=0)
    assert len(result) == 4 * (1 + (outputs or 0))


def test_undefined_metrics_are_errors_not_numbers():
    true, pred = np.array([2.0, 2.0, 2.0]), np.array([1.0, 2.0, 4.0])
    assert mr.mae(pred, true) == 1.0 and mr.rmse(pred, true) == pytest.approx(np.sqrt(5 / 3), abs=1e-15)
    with pytest.raises(UndefinedMetricError, match="r2 is undefined: constant target for output 0 among 3"):
        mr.r2(pred, true)
    with pytest.raises(UndefinedMetricError, match="constant target or prediction"):
        mr.pearson_r(true, pred)  # a constant prediction
    with pytest.raises(UndefinedMetricError, match="1 sample"):
        mr.r2([1.0], [2.0])
    with pytest.raises(UndefinedMetricError, match="output 1"):
        mr.regression_metrics(np.array([[1.0, 2.0], [2.0, 3.0]]), np.array([[0.0, 5.0], [1.0, 5.0]]), n_boot=0)
    with pytest.raises(ValueError, match="one shape"):
        mr.mae(np.zeros(3), np.zeros((3, 1)))


def brute_cluster_ci(pred, true, groups, statistic, n_boot, ci, seed):
    """The patient bootstrap written out (patients in first-appearance order); resamples with a constant target
    or prediction drawn again."""
    patients = list(dict.fromkeys(groups))
    rng = np.random.default_rng(seed)
    scores = []
    while len(scores) < n_boot:
        drawn = [patients[k] for k in rng.integers(0, len(patients), len(patients))]
        rows = [i for p in drawn for i in range(len(groups)) if groups[i] == p]
        if np.ptp(true[rows]) > 0 and np.ptp(pred[rows]) > 0:
            scores.append(statistic(pred[rows], true[rows]))
    return tuple(np.quantile(scores, [(1 - ci) / 2, (1 + ci) / 2]))


def test_bootstrap_resamples_patients_as_written_out():
    pred, true = regression_data(4, 8)
    true[:6] = 1.0  # patient "d" alone has another target: a resample without d has a constant one
    groups = ["b", "b", "a", "c", "c", "e", "d", "d"]
    result = mr.regression_metrics(pred, true, n_boot=150, ci=0.8, seed=2, groups=groups)
    checks = {"mae": lambda p, t: mean_absolute_error(t, p), "r2": lambda p, t: r2_score(t, p),
              "pearson_r": lambda p, t: pearsonr(p, t).statistic}
    for metric, statistic in checks.items():
        expected = brute_cluster_ci(pred, true, groups, statistic, n_boot=150, ci=0.8, seed=2)
        assert result[metric][1:] == pytest.approx(expected, abs=1e-12), metric


def test_bootstrap_is_seeded_brackets_and_widens_with_patients():
    pred, true = regression_data(5, 40, 2)
    result = mr.regression_metrics(pred, true, n_boot=200, seed=1, names=["age", "volume"])
    assert set(result) == {f"{m}{k}" for m in mr.METRICS for k in ("", "/age", "/volume")}
    for metric, (value, low, high) in result.items():
        assert low < value < high, metric
    assert result == mr.regression_metrics(pred, true, n_boot=200, seed=1, names=["age", "volume"])
    assert result != mr.regression_metrics(pred, true, n_boot=200, seed=2, names=["age", "volume"])
    copies = np.repeat(pred, 4, 0), np.repeat(true, 4, 0)
    per_patient = mr.regression_metrics(*copies, n_boot=200, seed=1, groups=np.repeat(np.arange(40), 4),
                                        names=["age", "volume"])
    per_sample = mr.regression_metrics(*copies, n_boot=200, seed=1)
    for metric in mr.METRICS:
        assert per_patient[metric] == pytest.approx(result[metric], abs=1e-12)  # four copies: the values of one
        assert per_patient[metric][2] - per_patient[metric][1] > 1.5 * (per_sample[metric][2] - per_sample[metric][1])


def test_predicted_vs_true_figure_titles_the_metrics():
    import matplotlib.pyplot as plt

    from medattn.survival_plots import predicted_vs_true_figure

    pred, true = regression_data(6, 30)
    ax = predicted_vs_true_figure(pred, true, "age", "years").axes[0]
    assert plt.get_fignums() == []
    assert ax.get_title().replace("\n", " ") == (f"age: n=30, MAE {mr.mae(pred, true):.3g}, RMSE "
                                                 f"{mr.rmse(pred, true):.3g}, R² {mr.r2(pred, true):.3g}, r "
                                                 f"{mr.pearson_r(pred, true):.3g}")
    assert ax.get_xlabel() == "true age (years)" and ax.get_ylabel() == "predicted age (years)"
    identity = ax.get_lines()[0]
    assert np.array_equal(identity.get_xdata(), identity.get_ydata())
    assert np.array_equal(ax.collections[0].get_offsets(), np.column_stack([true, pred]))
    constant = predicted_vs_true_figure(np.full(4, 2.0), np.arange(4.0)).axes[0]
    assert "r " not in constant.get_title() and "MAE" in constant.get_title()  # r undefined: left out
