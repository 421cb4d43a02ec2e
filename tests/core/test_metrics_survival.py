"""medattn.metrics_survival against lifelines (C-index, Kaplan-Meier, log-rank), scikit-survival (time-dependent
AUC) and slow explicit forms written here; data with tied times, tied risks and censoring."""

import numpy as np
import pytest

from medattn import metrics_survival as ms
from medattn.metrics import UndefinedMetricError


def survival_data(seed: int, n: int, resolution: float = 1.0):
    """Risks rounded to 0.1 (ties), exponential event times depending on the risk, censored by an independent
    exponential time, rounded to ``resolution`` (ties among events, among censorings and between the two)."""
    rng = np.random.default_rng(seed)
    risk = np.round(rng.normal(size=n), 1)
    event_time = rng.exponential(20 * np.exp(-0.8 * risk))
    censor_time = rng.exponential(30, n)
    time = np.round(np.minimum(event_time, censor_time) / resolution) * resolution
    return risk, time, event_time <= censor_time


def slow_concordance(risk, time, event):
    """Every ordered pair written out: i's event observed before j's time (or at it, j censored)."""
    good = pairs = 0.0
    for i in range(len(time)):
        for j in range(len(time)):
            if event[i] and (time[i] < time[j] or (time[i] == time[j] and not event[j])):
                pairs += 1
                good += 1.0 if risk[i] > risk[j] else 0.5 if risk[i] == risk[j] else 0.0
    return good / pairs


@pytest.mark.parametrize("seed, n, resolution", [(0, 40, 1.0), (1, 200, 5.0), (2, 500, 0.1), (3, 12, 10.0)])
def test_concordance_equals_lifelines(seed, n, resolution):
    lifelines_utils = pytest.importorskip("lifelines.utils")
    risk, time, event = survival_data(seed, n, resolution)
    assert len(np.unique(time[event])) < event.sum() and len(np.unique(risk)) < n  # ties in both
    assert ms.concordance_index(risk, time, event) == pytest.approx(
        lifelines_utils.concordance_index(time, -risk, event), abs=1e-12, rel=0)


def test_concordance_counts_the_pairs_as_stated():
    # events at 1 and 2, censored at 2 and 3; pairs: (t1,t2e) (t1,t2c) (t1,t3c) (t2e,t2c) (t2e,t3c)
    time = [1, 2, 2, 3]
    event = [1, 1, 0, 0]
    assert ms.concordance_index([4, 3, 2, 1], time, event) == 1.0
    assert ms.concordance_index([4, 3, 3, 1], time, event) == 4.5 / 5  # the tied risk counts one half
    assert ms.concordance_index([1, 2, 3, 4], time, event) == 0.0
    risk, time, event = survival_data(4, 60, 5.0)
    assert ms.concordance_index(risk, time, event) == pytest.approx(slow_concordance(risk, time, event), abs=1e-15)


def test_concordance_in_blocks_equals_one_block(monkeypatch):
    risk, time, event = survival_data(5, 3000, 0.5)
    whole = ms.concordance_index(risk, time, event)
    monkeypatch.setattr(ms, "_BLOCK", 5000)  # blocks of a few rows
    assert ms.concordance_index(risk, time, event) == whole


def test_concordance_undefined_without_a_comparable_pair():
    with pytest.raises(UndefinedMetricError, match="no comparable pair among 3 samples"):
        ms.concordance_index([1, 2, 3], [1, 2, 3], [0, 0, 0])  # all censored
    with pytest.raises(UndefinedMetricError):
        ms.concordance_index([1, 2, 3], [5, 5, 5], [1, 1, 1])  # all events at one time
    with pytest.raises(UndefinedMetricError):
        ms.concordance_index([1, 2, 3], [1, 2, 3], [0, 0, 1])  # the one event is the last time
    assert ms.concordance_index([3, 3], [5, 5], [1, 0]) == 0.5  # an event and a censoring at one time: a pair
    with pytest.raises(ValueError, match="0/1"):
        ms.concordance_index([1, 2], [1, 2], [1, 2])


def brute_cluster_ci(risk, time, event, groups, n_boot, ci, seed):
    """The patient bootstrap written out: patients in first-appearance order, drawn with replacement; a resample
    without a comparable pair is drawn again."""
    patients = list(dict.fromkeys(groups))
    rng = np.random.default_rng(seed)
    scores = []
    while len(scores) < n_boot:
        drawn = [patients[k] for k in rng.integers(0, len(patients), len(patients))]
        rows = [i for p in drawn for i in range(len(groups)) if groups[i] == p]
        try:
            scores.append(slow_concordance(risk[rows], time[rows], event[rows]))
        except ZeroDivisionError:
            continue
    return tuple(np.quantile(scores, [(1 - ci) / 2, (1 + ci) / 2]))


def test_concordance_bootstrap_resamples_patients():
    risk, time, event = survival_data(6, 14, 5.0)
    groups = ["b", "b", "a", "c", "c", "c", "d", "e", "e", "f", "g", "g", "h", "i"]
    expected = brute_cluster_ci(risk, time, event, groups, n_boot=100, ci=0.9, seed=3)
    assert ms.concordance_bootstrap_ci(risk, time, event, n_boot=100, ci=0.9, seed=3, groups=groups) == \
        pytest.approx(expected, abs=1e-12)
    # four identical copies of each patient: the interval of one copy each, wider than a per-sample bootstrap
    risk, time, event = survival_data(7, 40, 1.0)
    copies = [np.repeat(a, 4) for a in (risk, time, event)]
    patients = np.repeat(np.arange(40), 4)
    per_patient = ms.concordance_bootstrap_ci(*copies, n_boot=200, seed=0, groups=patients)
    per_sample = ms.concordance_bootstrap_ci(*copies, n_boot=200, seed=0)
    assert per_patient == pytest.approx(ms.concordance_bootstrap_ci(risk, time, event, n_boot=200, seed=0),
                                        abs=1e-12)
    assert per_patient[1] - per_patient[0] > 1.5 * (per_sample[1] - per_sample[0])
    low, high = per_patient
    assert low < ms.concordance_index(risk, time, event) < high


def test_kaplan_meier_equals_lifelines_and_the_product_limit():
    lifelines = pytest.importorskip("lifelines")
    _, time, event = survival_data(8, 300, 2.0)
    times, survival = ms.kaplan_meier(time, event)
    fitter = lifelines.KaplanMeierFitter().fit(time, event)
    assert np.array_equal(times, np.unique(time[event]))
    assert np.abs(survival - fitter.survival_function_at_times(times).to_numpy()).max() < 1e-12
    # by hand: times 1 (event), 2 (event, censored), 3 (event); at risk 4, 3, 1
    times, survival = ms.kaplan_meier([1, 2, 2, 3], [1, 1, 0, 1])
    assert times.tolist() == [1, 2, 3] and survival == pytest.approx([3 / 4, 3 / 4 * 2 / 3, 0.0])
    times, survival = ms.kaplan_meier([1, 2], [0, 0])
    assert times.size == survival.size == 0


@pytest.mark.parametrize("seed, n, resolution", [(9, 60, 1.0), (10, 400, 5.0), (11, 25, 10.0)])
def test_logrank_equals_lifelines(seed, n, resolution):
    statistics = pytest.importorskip("lifelines.statistics")
    risk, time, event = survival_data(seed, n, resolution)
    high = ms.risk_groups(risk)
    statistic, p_value = ms.logrank_test(time, event, high)
    reference = statistics.logrank_test(time[~high], time[high], event[~high], event[high])
    assert statistic == pytest.approx(reference.test_statistic, abs=1e-9, rel=0)
    assert p_value == pytest.approx(reference.p_value, abs=1e-9, rel=0)
    assert ms.logrank_test(time, event, np.where(high, "high", "low")) == pytest.approx((statistic, p_value))


def test_logrank_by_hand_and_undefined():
    # one event time 1: n=4 (group 1: 2), d=1 in group 1: U = 1 - 2/4, V = 2*2*1*3/(16*3)
    statistic, p_value = ms.logrank_test([1, 2, 2, 3], [1, 0, 0, 0], [1, 1, 0, 0])
    assert statistic == pytest.approx(0.25 / 0.25)
    with pytest.raises(UndefinedMetricError, match="0 events"):
        ms.logrank_test([1, 2, 3, 4], [0, 0, 0, 0], [0, 1, 0, 1])
    with pytest.raises(UndefinedMetricError, match="two groups"):
        ms.logrank_test([1, 2, 3], [1, 1, 1], [0, 0, 0])


def test_risk_groups_split_above_the_median():
    assert ms.risk_groups([1.0, 2.0, 2.0, 3.0]).tolist() == [False, False, False, True]  # tie at the median: low
    assert ms.risk_groups([4.0, 1.0, 3.0, 2.0]).tolist() == [True, False, True, False]
    assert ms.risk_groups([1.0, 2.0, 3.0], cutoff=1.0).tolist() == [False, True, True]


def slow_time_auc(risk, time, event, t, train_time, train_event):
    """Uno's estimator written out: G by the reverse product limit over the training times (events leave the risk
    set before the censorings tied with them), every case-control pair weighted by 1 / G(case time)."""
    def censoring_survival(s):
        g = 1.0
        for u in np.unique(train_time):
            if u > s:
                break
            at_risk = np.sum(train_time >= u) - np.sum((train_time == u) & train_event)
            censored = np.sum((train_time == u) & ~train_event)
            g *= 1 - censored / at_risk if censored else 1
        return g

    num = den = 0.0
    for i in range(len(time)):
        if event[i] and time[i] <= t:
            w = 1 / censoring_survival(time[i])
            for j in range(len(time)):
                if time[j] > t:
                    num += w * (1.0 if risk[i] > risk[j] else 0.5 if risk[i] == risk[j] else 0.0)
                    den += w
    return num / den


def test_time_dependent_auc_equals_the_written_out_estimator():
    risk, time, event = survival_data(12, 80, 1.0)
    train_risk, train_time, train_event = survival_data(13, 120, 1.0)
    times = [5.0, 12.0, 25.0]
    same = ms.time_dependent_auc(risk, time, event, times)
    other = ms.time_dependent_auc(risk, time, event, times, train_time, train_event)
    for m, t in enumerate(times):
        assert same[m] == pytest.approx(slow_time_auc(risk, time, event, t, time, event), abs=1e-12)
        assert other[m] == pytest.approx(slow_time_auc(risk, time, event, t, train_time, train_event), abs=1e-12)
    assert not np.allclose(same, other)


@pytest.mark.parametrize("seed, resolution", [(14, 1.0), (15, 0.1), (16, 5.0)])
def test_time_dependent_auc_equals_scikit_survival(seed, resolution):
    sksurv_metrics = pytest.importorskip("sksurv.metrics")
    from sksurv.util import Surv

    risk, time, event = survival_data(seed, 300, resolution)
    _, train_time, train_event = survival_data(seed + 100, 400, resolution)
    test, train = Surv.from_arrays(event, time), Surv.from_arrays(train_event, train_time)
    times = np.quantile(time[event], [0.2, 0.5, 0.8])
    for t_time, t_event, y_train in ((None, None, test), (train_time, train_event, train)):
        expected, _ = sksurv_metrics.cumulative_dynamic_auc(y_train, test, risk, times)
        got = ms.time_dependent_auc(risk, time, event, times, t_time, t_event)
        assert np.abs(got - expected).max() < 1e-9
        per_time = risk[:, None] + np.random.default_rng(seed).normal(size=(len(risk), len(times)))
        expected, _ = sksurv_metrics.cumulative_dynamic_auc(y_train, test, per_time, times)
        assert np.abs(ms.time_dependent_auc(per_time, time, event, times, t_time, t_event) - expected).max() < 1e-9


def test_time_dependent_auc_undefined_without_cases_or_controls():
    risk, time, event = survival_data(17, 50, 1.0)
    with pytest.raises(UndefinedMetricError, match="0 controls"):
        ms.time_dependent_auc(risk, time, event, [time.max()])
    with pytest.raises(UndefinedMetricError, match="0 cases"):
        ms.time_dependent_auc(risk, time, event, [time[event].min() - 0.5])
    with pytest.raises(ValueError, match="both"):
        ms.time_dependent_auc(risk, time, event, [10.0], train_time=time)


def test_kaplan_meier_figure_draws_the_groups_and_the_log_rank_p():
    import io

    import matplotlib.pyplot as plt

    from medattn.survival_plots import kaplan_meier_figure

    risk, time, event = survival_data(18, 120, 1.0)
    high = ms.risk_groups(risk)
    fig = kaplan_meier_figure(time, event, high, "test split, n=120", time_unit="days")
    ax = fig.axes[0]
    assert plt.get_fignums() == [] and ax.get_xlabel() == "time (days)"
    p_value = ms.logrank_test(time, event, high)[1]
    assert ax.get_legend().get_title().get_text() == f"log-rank p = {p_value:.3g}"
    low_curve = ax.get_lines()[0]  # the low-risk steps: from (0, 1) through the product limit to the last time
    times, survival = ms.kaplan_meier(time[~high], event[~high])
    assert np.array_equal(low_curve.get_xdata(), np.r_[0, times, time[~high].max()])
    assert np.array_equal(low_curve.get_ydata(), np.r_[1, survival, survival[-1]])
    numbers = [t.get_text() for t in ax.texts]
    assert "at risk" in numbers and str((~high).sum()) in numbers and str(high.sum()) in numbers
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    assert buffer.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"
    no_events = kaplan_meier_figure(time, np.zeros(120), high, at_risk=False)
    assert no_events.axes[0].get_legend().get_title().get_text() == "log-rank p n/a"


@pytest.mark.parametrize("seed, resolution", [(21, 1.0), (22, 0.1), (23, 0.3)])
def test_time_dependent_auc_is_exact_at_event_times_with_ties(seed, resolution):
    """Issue 49: t equal to an event time (tied events, events tied with censorings) counts that event as a case,
    as scikit-survival's cumulative_dynamic_auc does; times kept in float32 (the label tensors' dtype) are compared
    with t at their own precision, so t = 12.3 meets the event written 12.3 (float32(12.3) > 12.3 in float64 made it
    a control before)."""
    sksurv_metrics = pytest.importorskip("sksurv.metrics")
    from sksurv.util import Surv

    risk, time, event = survival_data(seed, 300, resolution)
    time = np.array([float(f"{t:.6g}") for t in time])  # as a table writes them
    values, counts = np.unique(time[event], return_counts=True)
    times = values[counts > 1][:3]  # event times shared by several events (and some by censorings)
    assert len(times) == 3
    survival = Surv.from_arrays(event, time)
    expected, _ = sksurv_metrics.cumulative_dynamic_auc(survival, survival, risk, times)
    assert np.abs(ms.time_dependent_auc(risk, time, event, times) - expected).max() < 1e-12
    stored = time.astype(np.float32)  # Predictions.labels of a survival run
    assert np.abs(ms.time_dependent_auc(risk, stored, event, times) - expected).max() < 1e-12
    assert np.abs(ms.time_dependent_auc(risk, stored, event, times, stored, event) - expected).max() < 1e-12


def test_survival_score_counts_the_event_at_t_as_a_case():
    """The survival objective's time AUC at eval.times equal to an event time, from float32 labels."""
    sksurv_metrics = pytest.importorskip("sksurv.metrics")
    from sksurv.util import Surv

    from medattn.data.base import TaskInfo
    from medattn.train.predictions import Predictions
    from medattn.train.survival_objective import Survival

    time = np.array([1.1, 2.2, 12.3, 12.3, 12.3, 20.7, 30.1, 40.9])
    event = np.array([1, 0, 1, 1, 0, 1, 0, 1], dtype=bool)
    risk = np.array([3.0, 0.5, -2.0, 0.9, 0.2, 0.8, -1.0, 0.0])
    labels = np.stack([time, event], 1).astype(np.float32)
    pred = Predictions(ids=[str(i) for i in range(8)], patients=[str(i) for i in range(8)],
                       outputs=risk[:, None].astype(np.float32), labels=labels, loss=0.0)
    task = TaskInfo("survival", "image2d", 1, (1, 8, 8))
    scored = Survival(task).score(pred, "test", {"bootstrap": 0, "ci": 0.95, "times": [12.3]}, 0)
    survival = Surv.from_arrays(event, time)
    expected, _ = sksurv_metrics.cumulative_dynamic_auc(survival, survival, risk, [12.3])
    assert scored["time_auc"]["12.3"] == pytest.approx(expected[0], abs=1e-12)
