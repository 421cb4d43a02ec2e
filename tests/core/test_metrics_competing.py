"""medattn.metrics_competing against lifelines (AalenJohansenFitter, with and without its jitter; the C-index),
scikit-survival (cumulative_incidence_competing_risks, concordance_index_censored) and a double loop written here
for Wolbers' C-index, on 60 seeded sets with two or three causes, tied times (events of one cause, of several
causes, events with censorings), tied risks and censoring (issue 51)."""

import warnings

import numpy as np
import pytest

from medattn import metrics_competing as mc
from medattn import metrics_survival as ms
from medattn.errors import UserError
from medattn.metrics import UndefinedMetricError

SEEDS = range(60)


def competing_data(seed: int, n: int | None = None, resolution: float | None = None):
    """K = 2 or 3 causes with exponential latent times whose rates depend on a covariate (cause 1 rises with it,
    cause 2 falls), an independent exponential censoring, the first of them observed and rounded up to
    ``resolution`` (>= resolution > 0: ties within and across causes and with censorings). -> (risk of cause 1
    rounded to 0.1 (tied risks), time, cause)."""
    rng = np.random.default_rng(seed)
    n = n or int(rng.integers(30, 250))
    resolution = resolution or (1.0, 0.5, 2.0)[seed % 3]
    causes = 2 + seed % 2
    x = rng.normal(size=n)
    slopes = np.array([0.8, -0.6, 0.3])[:causes]
    latent = rng.exponential(25 * np.exp(-np.outer(x, slopes)))
    censor = rng.exponential(40, n)
    first = latent.min(1)
    time = np.ceil(np.minimum(first, censor) / resolution) * resolution
    cause = np.where(first <= censor, latent.argmin(1) + 1, 0)
    return np.round(x + rng.normal(scale=0.5, size=n), 1), time, cause


class NoJitter:
    """lifelines' AalenJohansenFitter with its jitter turned off: the estimator on the tied times as given."""

    def __new__(cls, **kwargs):
        from lifelines import AalenJohansenFitter

        class Fitter(AalenJohansenFitter):
            _check_for_duplicates = staticmethod(lambda durations, events: False)

        return Fitter(calculate_variance=False, **kwargs)


def test_the_sets_have_every_kind_of_tie():
    risk, time, cause = competing_data(4)
    events = cause > 0
    assert len(np.unique(time[events])) < events.sum()  # tied event times
    shared = [t for t in np.unique(time) if len(set(cause[time == t]) - {0}) > 1]
    assert shared and np.isin(time[cause == 0], time[events]).any()  # two causes at a time; events and censorings
    assert len(np.unique(risk)) < len(risk) and set(np.unique(cause)) == {0, 1, 2}


def test_cumulative_incidence_equals_lifelines_aalen_johansen_on_the_tied_times():
    worst = 0.0
    for seed in SEEDS:
        _, time, cause = competing_data(seed)
        for k in range(1, cause.max() + 1):
            fitted = NoJitter().fit(time, cause, event_of_interest=k).cumulative_density_
            theirs = fitted.iloc[:, 0].to_numpy()
            worst = max(worst, np.abs(mc.cumulative_incidence(time, cause, k, fitted.index.to_numpy()) - theirs).max())
    assert worst < 1e-12


def test_cumulative_incidence_equals_lifelines_with_its_jitter_away_from_the_ties():
    """lifelines' default moves each event by up to 1e-4 at random: the tied events fall in some order, which
    changes nothing after them (each adds S(u-) / n_u); censorings kept half a step off the events, so no event
    moves past a censoring; compared between the times."""
    from lifelines import AalenJohansenFitter

    worst = 0.0
    for seed in range(0, 60, 6):
        _, time, cause = competing_data(seed, resolution=1.0)
        time = np.where(cause == 0, time + 0.5, time)
        between = np.unique(time) + 0.25
        for k in range(1, cause.max() + 1):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fitter = AalenJohansenFitter(calculate_variance=False, seed=seed).fit(time, cause, event_of_interest=k)
            theirs = fitter.predict(between, interpolate=False).to_numpy()
            worst = max(worst, np.abs(mc.cumulative_incidence(time, cause, k, between) - theirs).max())
    assert worst < 1e-12


def test_cumulative_incidence_equals_scikit_survival():
    from sksurv.nonparametric import cumulative_incidence_competing_risks

    worst = 0.0
    for seed in SEEDS:
        _, time, cause = competing_data(seed)
        times, incidence = cumulative_incidence_competing_risks(cause, time)
        for k in range(1, cause.max() + 1):
            worst = max(worst, np.abs(mc.cumulative_incidence(time, cause, k, times) - incidence[k]).max())
    assert worst < 1e-12


def test_incidences_and_survival_add_up_to_one_and_the_steps_by_hand():
    _, time, cause = competing_data(7)
    at = np.unique(time)
    total = sum(mc.cumulative_incidence(time, cause, k, at) for k in range(1, cause.max() + 1))
    times, survival = ms.kaplan_meier(time, cause > 0)
    assert np.abs(total + np.concatenate([[1.0], survival])[np.searchsorted(times, at, side="right")] - 1).max() \
        < 1e-12
    # n = 5; t=1: causes 1 and 2 (n 5): F1 = 1/5; t=2: censored; t=3: cause 1 (n 2, S(3-) = 3/5): F1 += 3/5 / 2
    time, cause = [1, 1, 2, 3, 4], [1, 2, 0, 1, 0]
    times, incidence = mc.aalen_johansen(time, cause, 1)
    assert times.tolist() == [1, 3] and incidence == pytest.approx([0.2, 0.2 + 0.3])
    assert mc.cumulative_incidence(time, cause, 2, [0.5, 1, 10]) == pytest.approx([0, 0.2, 0.2])
    assert mc.cumulative_incidence(time, cause, 3, [5]).tolist() == [0.0]  # a cause without events
    assert mc.aalen_johansen([1.0, 2.0], [0, 0], 1)[0].size == 0
    assert mc.cumulative_incidence([1.0, 2.0], np.array([1.0, 0.0]), 1, 1.5).tolist() == [0.5]  # float causes


def test_cause_specific_c_index_equals_scikit_survival_and_lifelines():
    from lifelines.utils import concordance_index
    from sksurv.metrics import concordance_index_censored

    worst = 0.0
    for seed in SEEDS:
        risk, time, cause = competing_data(seed)
        for k in range(1, cause.max() + 1):
            score = -risk if k == 2 else risk
            ours = mc.cause_specific_c_index(score, time, cause, k)
            worst = max(worst, abs(ours - concordance_index_censored(cause == k, time, score)[0]),
                        abs(ours - concordance_index(time, -score, cause == k)))
    assert worst < 1e-12


def slow_wolbers(risk, time, cause, k) -> float:
    """Every ordered pair written out: i had cause k; j outlived it, or had another cause (at any time), or was
    censored at i's time."""
    good = pairs = 0.0
    for i in range(len(time)):
        for j in range(len(time)):
            if cause[i] != k or i == j:
                continue
            later = time[j] > time[i]
            other = cause[j] not in (0, k)
            censored_then = time[j] == time[i] and cause[j] == 0
            if later or other or censored_then:
                pairs += 1
                good += 1.0 if risk[i] > risk[j] else 0.5 if risk[i] == risk[j] else 0.0
    return good / pairs


def test_competing_c_index_equals_the_double_loop():
    worst = 0.0
    for seed in SEEDS:
        risk, time, cause = competing_data(seed, n=int(np.random.default_rng(seed).integers(20, 90)))
        for k in range(1, cause.max() + 1):
            worst = max(worst, abs(mc.competing_c_index(risk, time, cause, k) - slow_wolbers(risk, time, cause, k)))
    assert worst < 1e-12


def test_competing_c_index_blocks_pairs_and_its_relation_to_harrell(monkeypatch):
    risk, time, cause = competing_data(8, n=600)
    whole = mc.competing_c_index(risk, time, cause, 1)
    monkeypatch.setattr(mc, "_BLOCK", 3000)
    assert mc.competing_c_index(risk, time, cause, 1) == whole
    single = np.where(cause > 0, 1, 0)  # one cause: Wolbers' C is Harrell's
    assert mc.competing_c_index(risk, time, single, 1) == ms.concordance_index(risk, time, single)
    # i: cause 1 at 2; j: cause 2 at 1 (comparable in Wolbers' C only), l: censored at 3 (comparable in both)
    time, cause = [2, 1, 3], [1, 2, 0]
    assert mc.cause_specific_c_index([5, 9, 1], time, cause, 1) == 1.0
    assert mc.competing_c_index([5, 9, 1], time, cause, 1) == 0.5
    assert mc.competing_c_index([5, 5, 1], time, cause, 1) == 0.75  # the tied risk counts one half
    with pytest.raises(UndefinedMetricError, match="no comparable pair among 2 samples"):
        mc.competing_c_index([1, 2], [1, 1], [1, 1], 1)
    with pytest.raises(UndefinedMetricError):
        mc.cause_specific_c_index([1, 2], [1, 2], [2, 0], 1)  # no event of cause 1


@pytest.mark.parametrize("call", [
    lambda t, c, r: mc.cumulative_incidence(t, c, 1, [1.0]),
    lambda t, c, r: mc.aalen_johansen(t, c, 1),
    lambda t, c, r: mc.cause_specific_c_index(r, t, c, 1),
    lambda t, c, r: mc.competing_c_index(r, t, c, 1),
])
def test_bad_inputs_raise_one_line_user_errors(call):
    time, cause, risk = np.array([1.0, 2.0, 3.0]), np.array([1, 2, 0]), np.array([0.1, 0.2, 0.3])
    cases = [((time, [1, -1, 0], risk), "0 \\(censored\\) or a cause 1..K, got -1"),
             ((time, [1, 1.5, 0], risk), "integers .*got 1.5"),
             ((time, ["a", "b", "c"], risk), "integers"),
             ((time, [1, np.nan, 0], risk), "integers"),
             ((time[:2], cause, risk), "one length"),
             ((time, cause[:2], risk), "one length"),
             ((-time, cause, risk), "time must be >= 0"),
             (([1.0, np.inf, 2.0], cause, risk), "time must hold finite"),
             (([[1.0, 2.0, 3.0]], cause, risk), "one length")]
    for (t, c, r), message in cases:
        with pytest.raises(UserError, match=message) as raised:
            call(t, c, r)
        assert "\n" not in str(raised.value)
    for k in (0, -1, 1.0, True):
        with pytest.raises(UserError, match="cause of interest k must be an int >= 1"):
            mc.cumulative_incidence(time, cause, k, [1.0])


def test_risk_must_be_finite():
    with pytest.raises(UserError, match="risk must hold finite"):
        mc.competing_c_index([0.1, np.nan], [1.0, 2.0], [1, 0], 1)
    with pytest.raises(UserError, match="one length"):
        mc.cause_specific_c_index([0.1], [1.0, 2.0], [1, 0], 1)
