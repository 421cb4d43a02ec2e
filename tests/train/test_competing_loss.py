"""medattn.train.competing_loss: the cause-specific Cox loss against scikit-survival's Breslow likelihood per cause
(60 seeded sets with tied times), a double loop written here, the per-cause Cox fits of lifelines (its minimiser
and log-likelihood) and of scikit-survival (Breslow, tied times); gradients by gradcheck (issue 51)."""

import numpy as np
import pytest
import torch

from medattn.errors import UserError
from medattn.train.competing_loss import cause_specific_cox
from medattn.train.survival_loss import cox_partial_likelihood

SEEDS = range(60)


def competing_data(seed: int, n: int, distinct: bool = False):
    """Two covariates, K = 2 or 3 causes with exponential latent times (rates depending on the covariates),
    independent censoring; integer times 1..15 (events tied within and across causes and with censorings), or with
    ``distinct`` every event at its own time (censorings still tied). -> (x (n, 2), time, cause)."""
    rng = np.random.default_rng(seed)
    causes = 2 + seed % 2
    x = rng.normal(size=(n, 2))
    slopes = np.array([[0.8, -0.3], [-0.5, 0.6], [0.2, 0.4]])[:causes]
    latent = rng.exponential(5 * np.exp(-x @ slopes.T))
    censor = rng.exponential(8, n)
    first = latent.min(1)
    cause = np.where(first <= censor, latent.argmin(1) + 1, 0)
    if distinct:
        time = np.argsort(np.argsort(np.minimum(first, censor))).astype(float) + 1
        time[cause == 0] = np.ceil(time[cause == 0] / 10) * 10
    else:
        time = np.ceil(np.minimum(first, censor)).clip(1, 15)
    return x, time, cause


def loss(logits, time, cause) -> torch.Tensor:
    return cause_specific_cox(torch.as_tensor(logits, dtype=torch.float64), torch.as_tensor(time),
                              torch.as_tensor(cause))


def slow_log_likelihood(logits, time, cause) -> float:
    """Each event against every sample with a time >= its, with the logit of the event's cause."""
    total = 0.0
    for i in range(len(time)):
        if cause[i]:
            k = cause[i] - 1
            total += logits[i, k] - np.log(sum(np.exp(logits[j, k]) for j in range(len(time)) if time[j] >= time[i]))
    return total


def test_loss_equals_scikit_survival_breslow_per_cause_and_the_loop():
    from sksurv.linear_model.coxph import CoxPHOptimizer

    worst = 0.0
    for seed in SEEDS:
        x, time, cause = competing_data(seed, int(np.random.default_rng(seed).integers(30, 200)))
        assert len(np.unique(time[cause > 0])) < (cause > 0).sum()
        beta = np.random.default_rng(seed + 1).normal(size=(2, cause.max()))
        ours = -loss(x @ beta, time, cause).item() * (cause > 0).sum()
        theirs = 0.0
        for k in range(1, cause.max() + 1):
            optimizer = CoxPHOptimizer(x, cause == k, time, np.zeros(2), "breslow")
            theirs += -optimizer.nlog_likelihood(beta[:, k - 1]) * len(x)  # sksurv divides by the samples
        worst = max(worst, abs(ours - theirs))
        if seed < 10:
            worst = max(worst, abs(ours - slow_log_likelihood(x @ beta, time, cause)))
    assert worst < 1e-6


def fit(x, time, cause) -> tuple[np.ndarray, float]:
    """The linear model minimising the loss, by L-BFGS in float64 -> (coefficients (2, K), log-likelihood)."""
    data = (torch.tensor(x), torch.tensor(time), torch.tensor(cause))
    beta = torch.zeros(2, int(cause.max()), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([beta], lr=1, max_iter=500, tolerance_grad=1e-12, tolerance_change=1e-15,
                                  line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        value = cause_specific_cox(data[0] @ beta, data[1], data[2])
        value.backward()
        return value

    optimizer.step(closure)
    return beta.detach().numpy(), -closure().item() * (cause > 0).sum()


def test_minimiser_equals_lifelines_cox_fit_per_cause():
    """Every event at its own time: lifelines' Efron is then Breslow; the other causes' events and the
    censorings are the censored samples of each cause's fit."""
    import pandas as pd
    from lifelines import CoxPHFitter

    worst_beta = worst_ll = 0.0
    for seed in range(4):
        x, time, cause = competing_data(seed, 160, distinct=True)
        ours, log_likelihood = fit(x, time, cause)
        theirs = 0.0
        for k in range(1, cause.max() + 1):
            frame = pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "T": time, "E": (cause == k).astype(int)})
            fitter = CoxPHFitter().fit(frame, "T", "E")
            worst_beta = max(worst_beta, np.abs(ours[:, k - 1] - fitter.params_[["a", "b"]].to_numpy()).max())
            theirs += fitter.log_likelihood_
        worst_ll = max(worst_ll, abs(log_likelihood - theirs))
    assert worst_beta < 1e-4 and worst_ll < 1e-6


def test_minimiser_equals_scikit_survival_breslow_fit_with_ties():
    from sksurv.linear_model import CoxPHSurvivalAnalysis
    from sksurv.util import Surv

    worst = 0.0
    for seed in range(4, 8):
        x, time, cause = competing_data(seed, 160)
        ours, _ = fit(x, time, cause)
        for k in range(1, cause.max() + 1):
            model = CoxPHSurvivalAnalysis(ties="breslow", tol=1e-12, n_iter=200).fit(x, Surv.from_arrays(cause == k,
                                                                                                         time))
            worst = max(worst, np.abs(ours[:, k - 1] - model.coef_).max())
    assert worst < 1e-4


def test_one_cause_is_the_cox_loss_and_edge_cases():
    x, time, cause = competing_data(1, 80)
    logits = torch.tensor(x, dtype=torch.float64)
    single = torch.tensor((cause > 0).astype(int))
    assert cause_specific_cox(logits[:, :1], torch.tensor(time), single).item() == pytest.approx(
        cox_partial_likelihood(logits[:, 0], torch.tensor(time), single.bool()).item(), abs=1e-15)
    # a third head for a cause without events adds nothing; order does not matter
    three = torch.cat([logits, torch.zeros(80, 1, dtype=torch.float64)], 1)
    two = np.where(cause == 3, 0, cause)
    assert loss(three, time, two).item() == pytest.approx(loss(logits, time, two).item(), abs=1e-15)
    order = np.random.default_rng(0).permutation(80)
    assert loss(logits[order], time[order], two[order]).item() == pytest.approx(loss(logits, time, two).item(),
                                                                              abs=1e-12)
    none = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    zero = cause_specific_cox(none, torch.tensor(time), torch.zeros(80, dtype=torch.long))
    zero.backward()
    assert zero.item() == 0.0 and none.grad.abs().sum() == 0


def test_gradients_with_ties():
    x, time, cause = competing_data(3, 30)
    logits = torch.tensor(x @ np.ones((2, cause.max())), requires_grad=True)
    assert torch.autograd.gradcheck(lambda z: cause_specific_cox(z, torch.tensor(time), torch.tensor(cause)),
                                    (logits,))


def test_bad_causes_and_shapes():
    logits, time = torch.zeros(3, 2), torch.tensor([1.0, 2.0, 3.0])
    for cause, message in (([0, 3, 1], "a cause 1..2 .*got 0..3"), ([0, -1, 1], "got -1..1"),
                           ([0.0, 1.5, 1.0], "integers")):
        with pytest.raises(UserError, match=message):
            cause_specific_cox(logits, time, torch.tensor(cause))
    assert cause_specific_cox(logits, time, torch.tensor([0.0, 2.0, 1.0])).item() == pytest.approx(
        np.log(2) / 2)  # float causes that are integers; zero logits: mean of log |R(i)| = log 2 and log 1
    with pytest.raises(ValueError, match="logits must be"):
        cause_specific_cox(logits[:, 0], time, torch.tensor([0, 1, 1]))
    with pytest.raises(ValueError, match="logits must be"):
        cause_specific_cox(logits, time[:2], torch.tensor([0, 1, 1]))
