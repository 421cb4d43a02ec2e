"""medattn.metrics_survival_brier against scikit-survival (Breslow baseline, Brier score, integrated Brier score)
and lifelines (Kaplan-Meier per calibration group, log-rank of the training-cut groups) on 60 seeded sets with tied
times, tied risks and censoring (issue 51); the figures' words."""

import numpy as np
import pytest

from medattn import metrics_survival as ms
from medattn import metrics_survival_brier as mb
from medattn.metrics import UndefinedMetricError

SEEDS = range(60)


def survival_data(seed: int, n: int, resolution: float = 1.0):
    """Risks rounded to 0.1 (ties), exponential event times depending on the risk, censored by an independent
    exponential time, rounded to ``resolution`` (ties among events, among censorings and between the two)."""
    rng = np.random.default_rng(seed)
    risk = np.round(rng.normal(size=n), 1)
    event_time = rng.exponential(20 * np.exp(-0.8 * risk))
    censor_time = rng.exponential(30, n)
    time = np.round(np.minimum(event_time, censor_time) / resolution) * resolution
    return risk, time, event_time <= censor_time


def train_and_test(seed: int):
    """A training set of 80 and a test set of 60 (test times beyond the last training time dropped, which
    scikit-survival refuses), resolution 1, 0.5 or 2 by seed; times inside the test follow-up."""
    resolution = (1.0, 0.5, 2.0)[seed % 3]
    train = survival_data(seed, 80, resolution)
    risk, time, event = survival_data(seed + 1000, 60, resolution)
    keep = time <= train[1].max()
    risk, time, event = risk[keep], time[keep], event[keep]
    times = np.unique(np.percentile(time, [15, 35, 55, 75]))
    times = times[(times >= time.min()) & (times < time.max())]
    return train, (risk, time, event), times


def test_breslow_survival_equals_scikit_survival():
    from sksurv.linear_model.coxph import BreslowEstimator

    worst = 0.0
    for seed in SEEDS:
        (risk, time, event), (test_risk, _, _), times = train_and_test(seed)
        ours = mb.breslow(risk, time, event).survival(test_risk, times)
        reference = BreslowEstimator().fit(risk, event, time)
        theirs = np.array([[f(t) for t in times] for f in reference.get_survival_function(test_risk)])
        worst = max(worst, np.abs(ours - theirs).max())
        hazard = reference.cum_baseline_hazard_
        ours_h = mb.breslow(risk, time, event).hazard(hazard.x) * np.exp(-mb.breslow(risk, time, event).offset)
        worst = max(worst, np.abs(ours_h - hazard.y).max())
    assert worst < 1e-6


def test_brier_and_integrated_brier_equal_scikit_survival():
    from sksurv.metrics import brier_score, integrated_brier_score
    from sksurv.util import Surv

    worst = 0.0
    for seed in SEEDS:
        (risk, time, event), (test_risk, test_time, test_event), times = train_and_test(seed)
        survival = mb.breslow(risk, time, event).survival(test_risk, times)
        censoring = mb.censoring(time, event)
        train, test = Surv.from_arrays(event, time), Surv.from_arrays(test_event, test_time)
        _, expected = brier_score(train, test, survival, times)
        worst = max(worst, np.abs(mb.brier_score(survival, test_time, test_event, times, censoring) - expected).max())
        if len(times) >= 2:
            got = mb.integrated_brier_score(survival, test_time, test_event, times, censoring)
            worst = max(worst, abs(got - integrated_brier_score(train, test, survival, times)))
    assert worst < 1e-6


def test_brier_score_written_out_and_float32_times():
    """Graf's sum written out on one set; float32 follow-up times (a run's label tensors) meet t = 12.3."""
    (risk, time, event), (test_risk, test_time, test_event), _ = train_and_test(3)
    censoring = mb.censoring(time, event)
    t = float(np.median(test_time))
    s = mb.breslow(risk, time, event).survival(test_risk, [t])[:, 0]
    slow = np.mean([(s[i] ** 2 / censoring(test_time[i]) if test_event[i] and test_time[i] <= t else 0.0)
                    + ((1 - s[i]) ** 2 / censoring(t) if test_time[i] > t else 0.0) for i in range(len(s))])
    assert mb.brier_score(s, test_time, test_event, [t], censoring)[0] == pytest.approx(slow, abs=1e-12)
    time32 = np.array([1.0, 12.3, 12.3, 20.0], dtype=np.float32)
    flat = mb.Steps(np.empty(0), np.empty(0), 1.0)
    score = mb.brier_score(np.full(4, 0.5), time32, np.array([1, 1, 0, 1]), [12.3], flat)
    assert score[0] == pytest.approx((0.25 + 0.25 + 0.25) / 4)  # two cases by 12.3, one control; one censored


def test_brier_score_undefined_where_no_one_was_followed():
    time, event = np.array([1.0, 2.0, 3.0]), np.array([1, 0, 0])
    censoring = mb.censoring(time, event)  # G = 0 from t = 3 on
    with pytest.raises(UndefinedMetricError, match="censoring survival is 0"):
        mb.brier_score(np.full(3, 0.5), time, event, [3.0], censoring)
    with pytest.raises(UndefinedMetricError, match="two distinct times"):
        mb.integrated_brier_score(np.full((3, 2), 0.5), time, event, [1.0, 1.0], censoring)


def test_calibration_groups_equal_lifelines_kaplan_meier():
    from lifelines import KaplanMeierFitter

    worst = 0.0
    for seed in SEEDS:
        (risk, time, event), (test_risk, test_time, test_event), times = train_and_test(seed)
        t = float(times[len(times) // 2])
        predicted = mb.breslow(risk, time, event).survival(test_risk, [t])[:, 0]
        found = mb.calibration_at(predicted, test_time, test_event, t, 4)
        order = np.argsort(predicted, kind="stable")
        for group, members in zip(found["groups"], np.array_split(order, 4)):
            assert group["n"] == len(members) and group["predicted"] == pytest.approx(predicted[members].mean())
            if group["observed"] is None:
                assert test_time[members].max() < t
                continue
            fitter = KaplanMeierFitter().fit(test_time[members], test_event[members])
            worst = max(worst, abs(group["observed"] - float(fitter.predict(t))))
        seen = [g for g in found["groups"] if g["observed"] is not None]
        error = sum(g["n"] * abs(g["predicted"] - g["observed"]) for g in seen) / sum(g["n"] for g in seen)
        assert found["error"] == pytest.approx(error)
    assert worst < 1e-6


def test_training_cut_groups_and_their_log_rank_equal_lifelines():
    from lifelines.statistics import logrank_test

    worst = 0.0
    for seed in SEEDS:
        (risk, _, _), (test_risk, test_time, test_event), _ = train_and_test(seed)
        for quantile in (0.5, 0.75):
            cut = mb.training_cut(risk, quantile)
            assert cut == np.quantile(risk, quantile)
            high = ms.risk_groups(test_risk, cut)
            if high.all() or not high.any():
                continue
            expected = logrank_test(test_time[high], test_time[~high], test_event[high], test_event[~high])
            worst = max(worst, abs(ms.logrank_test(test_time, test_event, high)[1] - expected.p_value))
    assert worst < 1e-6
    with pytest.raises(ValueError, match="quantile"):
        mb.training_cut(risk, 1.0)


def test_the_figures_name_the_time_column_and_count_one_event():
    from medattn.survival_plots import calibration_figure, kaplan_meier_figure, time_axis_label

    assert time_axis_label("os_months") == "os_months (months)"
    assert time_axis_label("OS_days") == "OS_days (days)"
    assert time_axis_label("followup") == "followup" and time_axis_label() == "time"
    assert time_axis_label("t", "weeks") == "t (weeks)"
    assert time_axis_label("months") == "months" and time_axis_label("Days") == "Days"  # not "months (months)"
    assert time_axis_label("month", "months") == "month"
    time, event = np.array([1.0, 2.0, 3.0, 4.0]), np.array([1, 0, 1, 1])
    fig = kaplan_meier_figure(time, event, np.array([0, 0, 1, 1]), time_label=time_axis_label("os_months"))
    ax = fig.axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert ax.get_xlabel() == "os_months (months)"
    assert legend == ["low risk (n=2, 1 event)", "high risk (n=2, 2 events)"]
    found = mb.calibration_at(np.array([0.2, 0.4, 0.6, 0.8]), time, event, 2.5, 2)
    ax = calibration_figure(found, "test", "os_months (months)").axes[0]
    assert ax.get_xlabel() == "predicted survival at t = 2.5" and "os_months" in ax.get_legend().get_title().get_text()
