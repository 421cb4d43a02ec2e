"""medattn.train.survival_loss: the Cox loss against lifelines' fitted partial log-likelihood, scikit-survival's
Breslow likelihood and a double loop written here; the discrete-time loss against a loop; gradients by gradcheck."""

import numpy as np
import pytest
import torch

from medattn.errors import UserError
from medattn.train.survival_loss import cox_partial_likelihood, discrete_time_nll, time_bin_index, time_bins


def tied_data(seed: int, n: int):
    """A covariate, integer times 1..12 (many tied events and censorings), about 70% events."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    time = np.ceil(rng.exponential(4 * np.exp(-0.7 * x))).clip(1, 12)
    return x, time, rng.random(n) < 0.7


def slow_breslow(risk, time, event) -> float:
    """The Breslow partial log-likelihood as a double loop: each event against every sample with time >= its."""
    total = 0.0
    for i in range(len(time)):
        if event[i]:
            total += risk[i] - np.log(sum(np.exp(risk[j]) for j in range(len(time)) if time[j] >= time[i]))
    return total


def cox(risk, time, event) -> torch.Tensor:
    return cox_partial_likelihood(torch.as_tensor(risk, dtype=torch.float64), torch.as_tensor(time),
                                  torch.as_tensor(event))


def test_cox_loss_equals_lifelines_log_likelihood_at_its_fit():
    lifelines = pytest.importorskip("lifelines")
    import pandas as pd

    rng = np.random.default_rng(0)
    x = rng.normal(size=120)
    event = rng.random(120) < 0.7
    time = rng.permutation(120).astype(float) + 1  # distinct event times: Efron (lifelines) is Breslow
    time[~event] = np.round(time[~event] / 10) * 10  # censorings tied with one another and with events
    assert (np.isin(time[~event], time[event])).any() and len(np.unique(time[~event])) < (~event).sum()
    fitter = lifelines.CoxPHFitter().fit(pd.DataFrame({"x": x, "T": time, "E": event.astype(int)}), "T", "E")
    beta = fitter.params_["x"]
    assert abs(beta) > 0.01
    log_likelihood = -cox(beta * x, time, event).item() * event.sum()
    assert log_likelihood == pytest.approx(fitter.log_likelihood_, abs=1e-6, rel=0)


@pytest.mark.parametrize("seed, n", [(1, 30), (2, 200)])
def test_cox_loss_is_breslow_with_tied_event_times(seed, n):
    x, time, event = tied_data(seed, n)
    assert len(np.unique(time[event])) < event.sum() / 2
    for beta in (-1.3, 0.0, 0.8):
        expected = slow_breslow(beta * x, time, event)
        assert -cox(beta * x, time, event).item() * event.sum() == pytest.approx(expected, abs=1e-9, rel=0)


def test_cox_loss_equals_scikit_survival_breslow():
    coxph = pytest.importorskip("sksurv.linear_model.coxph")
    x, time, event = tied_data(3, 150)
    optimizer = coxph.CoxPHOptimizer(x[:, None], event, time, np.zeros(1), "breslow")
    expected = -optimizer.nlog_likelihood(np.array([0.9])) * len(x)  # sksurv divides by the samples
    assert -cox(0.9 * x, time, event).item() * event.sum() == pytest.approx(expected, abs=1e-9, rel=0)


def slow_breslow_stable(risk, time, event) -> float:
    """:func:`slow_breslow` with the largest risk taken out of each sum (for risks in the hundreds)."""
    total = 0.0
    for i in range(len(time)):
        if event[i]:
            at_risk = risk[time >= time[i]]
            total += risk[i] - at_risk.max() - np.log(np.exp(at_risk - at_risk.max()).sum())
    return total


def test_cox_loss_is_stable_and_order_free():
    x, time, event = tied_data(4, 50)
    loss = cox(x, time, event)
    order = np.random.default_rng(0).permutation(50)
    assert cox(x[order], time[order], event[order]).item() == pytest.approx(loss.item(), abs=1e-12)
    assert cox(x + 1000.0, time, event).item() == pytest.approx(loss.item(), abs=1e-9)  # shift invariant
    big = cox(500 * x, time, event)
    assert torch.isfinite(big) and big.item() == pytest.approx(-slow_breslow_stable(500 * x, time, event)
                                                                / event.sum(), rel=1e-12)


def test_cox_loss_edge_cases():
    risk = torch.tensor([0.3, -1.2, 2.0], dtype=torch.float64, requires_grad=True)
    time = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    none = cox_partial_likelihood(risk, time, torch.zeros(3, dtype=torch.bool))  # all censored
    none.backward()
    assert none.item() == 0.0 and risk.grad.abs().sum() == 0
    one = cox_partial_likelihood(risk, time, torch.tensor([0, 1, 0]))  # one event: at time 2, risk set {2, 3}
    assert one.item() == pytest.approx(-(-1.2 - np.log(np.exp(-1.2) + np.exp(2.0))))
    tied = cox_partial_likelihood(risk, torch.full((3,), 5.0), torch.tensor([1, 1, 0]))  # all at one time
    every = np.log(np.exp([0.3, -1.2, 2.0]).sum())
    assert tied.item() == pytest.approx(-((0.3 - every) + (-1.2 - every)) / 2)
    with pytest.raises(ValueError, match="one shape"):
        cox_partial_likelihood(risk, time[:2], torch.ones(3))


def test_cox_loss_gradients_with_ties():
    x, time, event = tied_data(5, 25)
    risk = torch.tensor(x, requires_grad=True)
    assert torch.autograd.gradcheck(lambda r: cox_partial_likelihood(r, torch.tensor(time), torch.tensor(event)),
                                    (risk,))


def slow_discrete(logits, time_bin, event) -> float:
    """The logistic-hazard likelihood as loops: survive each interval before the sample's, then the event."""
    hazard = 1 / (1 + np.exp(-logits))
    total = 0.0
    for b in range(len(time_bin)):
        total += sum(np.log(1 - hazard[b, k]) for k in range(time_bin[b]))
        if event[b]:
            total += np.log(hazard[b, time_bin[b]])
    return -total / len(time_bin)


def test_discrete_time_loss_equals_the_loop_and_its_gradients_check():
    rng = np.random.default_rng(6)
    logits = rng.normal(size=(20, 5)) * 2
    time_bin = rng.integers(0, 5, 20)
    time_bin[:2] = 0  # an event and a censoring in the first interval
    event = rng.random(20) < 0.6
    event[:2] = [True, False]
    loss = discrete_time_nll(torch.tensor(logits), torch.tensor(time_bin), torch.tensor(event))
    assert loss.item() == pytest.approx(slow_discrete(logits, time_bin, event), abs=1e-12)
    assert discrete_time_nll(torch.tensor(logits[1:2]), torch.tensor(time_bin[1:2]),
                             torch.tensor(event[1:2])).item() == 0.0  # censored in interval 0: nothing known
    assert torch.autograd.gradcheck(
        lambda z: discrete_time_nll(z, torch.tensor(time_bin), torch.tensor(event)),
        (torch.tensor(logits, requires_grad=True),))
    with pytest.raises(ValueError, match="0..4"):
        discrete_time_nll(torch.tensor(logits), torch.tensor(time_bin + 1), torch.tensor(event))


def test_time_bins_at_event_quantiles():
    time = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 20.0])
    event = np.array([1, 1, 1, 1, 0, 0, 0, 0, 1])  # event times 1, 2, 3, 4, 20
    edges = time_bins(time, event, 2)
    assert edges.tolist() == [0.0, 3.0, 20.0]  # the median of the event times, then the last time
    assert time_bins(time, event, 4).tolist() == [0.0, 2.0, 3.0, 4.0, 20.0]
    assert time_bin_index([0.0, 2.9, 3.0, 19.0, 20.0, 50.0], edges).tolist() == [0, 0, 1, 1, 1, 1]
    with pytest.raises(UserError, match="fewer bins"):
        time_bins([1.0, 1.0, 1.0, 2.0], [1, 1, 1, 0], 3)
    with pytest.raises(UserError, match="no event"):
        time_bins([1.0, 2.0], [0, 0], 2)
