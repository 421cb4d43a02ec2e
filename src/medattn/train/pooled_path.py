"""Start a bag transformer's pooled-feature path as the independent model on pooled features (issue 48).

A :class:`~medattn.models.wsi.WSITransformer` built with ``pooled_features=True`` adds ``W_s s + b`` to its logits,
where s (2F,) is a bag's mean and maximum standardised tile features, standardised over the training bags. Before
training, :func:`fit_pooled_path` fits ``W_s`` and the head's bias ``b`` on the n training bags by the run's own
training loss L (cross-entropy, Huber on standardised targets, the Cox partial likelihood over all n bags, ...), full
batch, with an L2 penalty on ``W_s``::

    min_{W_s, b}  L({W_s s_i + b}, {y_i}) + ||W_s||^2 / (2 C n)

which is scikit-learn's ``LogisticRegression(C=C)`` (``||w||^2 / 2 + C sum_i loss_i``, divided by C n) when L is the
mean cross-entropy. C is chosen from :data:`PENALTY_GRID` by :data:`FOLDS`-fold cross-validation on the training
bags, as ``LogisticRegressionCV`` and ``RidgeCV`` choose theirs: each bag is predicted by the fit on the other
folds, and the C whose out-of-fold predictions score best by the run's validation metric (AUROC, R^2, C-index: what
chooses the run's checkpoint) is kept; ties keep the stronger penalty. (The held-out folds' loss, tried first, chose
the same C on ``retina_count`` and ``ihc_survival`` and a 1000 times stronger penalty on ``ihc_bags``.) The folds
are a fixed permutation of the bags, so the fit is deterministic. Solved by L-BFGS (strong Wolfe line search). The
head on z starts at zero, so the model's first predictions are the pooled model's, and training moves every weight
from there.

Why a fit and not a learned start: trained at the bag model's rate (2e-4, single-bag steps, 20 epochs), the linear
path alone stayed far from its optimum on the realistic bag family (``ihc_bags``: test AUROC 0.891, fitted 0.933),
and a rate of its own would have to serve classification and survival (best at 1e-2 to 2e-2) and regression (best
at 2e-4 to 1e-3) at once (docs/decisions.md, "Pooled features beside the readout").
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import Dataset

from medattn.metrics import UndefinedMetricError

MAX_ITERATIONS = 500
#: The inverse penalties C tried (scikit-learn's convention: larger C, weaker penalty).
PENALTY_GRID = (0.001, 0.01, 0.1, 1.0, 10.0, 100.0)
FOLDS = 5


def training_summaries(model, dataset: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """-> ((n, 2F) every training bag's mean and maximum standardised features, (n, ...) their labels), the bags read
    as training reads them, under a forked RNG so the training order stays as seeded."""
    parameter, summaries, labels = model.head.weight, [], []
    with torch.random.fork_rng(), torch.no_grad():
        for index in range(len(dataset)):
            sample = dataset[index]
            features = model.feature_norm(sample["input"].to(parameter.device, parameter.dtype)).unsqueeze(0)
            summaries.append(model.features_summary(features)[0].float())
            labels.append(sample["label"])
    return torch.stack(summaries), torch.stack(labels).to(parameter.device)  # the labels as collate batches them


def fit_linear(x: torch.Tensor, labels: torch.Tensor, objective, c: float, outputs: int) -> tuple:
    """(n, P) standardised summaries -> (weight (K, P), bias (K,)) minimising the penalised loss (module docstring)."""
    weight = x.new_zeros(outputs, x.shape[1], requires_grad=True)
    bias = x.new_zeros(outputs, requires_grad=True)
    solver = torch.optim.LBFGS([weight, bias], max_iter=MAX_ITERATIONS, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        solver.zero_grad()
        loss = objective.loss(x @ weight.T + bias, labels) + weight.square().sum() / (2 * c * len(x))
        loss.backward()
        return loss

    solver.step(closure)
    return weight.detach(), bias.detach()


def choose_penalty(x: torch.Tensor, labels: torch.Tensor, objective, task_type: str,
                   outputs: int) -> tuple[float, dict]:
    """-> (C, {C: the out-of-fold validation metric}) by :data:`FOLDS`-fold cross-validation over
    :data:`PENALTY_GRID` (module docstring); a metric the folds leave undefined counts as -inf."""
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    folds = [order[k::FOLDS] for k in range(FOLDS)]
    scores = {}
    for c in PENALTY_GRID:
        predicted = x.new_zeros(len(x), outputs)
        for fold in folds:
            train = torch.ones(len(x), dtype=torch.bool)
            train[fold] = False
            weight, bias = fit_linear(x[train], labels[train], objective, c, outputs)
            predicted[fold] = x[fold] @ weight.T + bias
        found, truth = objective.outputs(predicted, labels)
        try:
            scores[c] = float(objective.metric_of(found.cpu().numpy(), truth.cpu().numpy(), task_type))
        except (ValueError, UndefinedMetricError):
            scores[c] = -math.inf
        scores[c] = scores[c] if math.isfinite(scores[c]) else -math.inf
    return max(PENALTY_GRID, key=lambda c: (scores[c], -c)), scores


def fit_pooled_path(model, dataset: Dataset, objective, task_type: str) -> dict | None:
    """Fit ``model``'s pooled-feature path on the training bags ``dataset`` of a ``task_type`` task by
    ``objective.loss``, its penalty chosen by ``objective.metric_of`` (the module docstring), and set its
    standardiser to the training summaries' statistics. -> what was fitted (for results.json: bags, C, the
    cross-validated metric per C, the training loss of a constant predictor and of the fit), or None for a model
    without the path."""
    if not getattr(model, "pooled_features", False):
        return None
    summaries, labels = training_summaries(model, dataset)
    standardiser = model.features_pool_norm
    mean, var = summaries.mean(0), summaries.var(0)
    standardiser.mean.copy_(mean)  # the running statistics go on from the training bags' own
    standardiser.var.copy_(var)
    standardiser.count.fill_(len(summaries))
    x = (summaries - mean) / torch.sqrt(var + standardiser.eps)
    outputs = model.pooled_head.weight.shape[0]
    c, scores = choose_penalty(x, labels, objective, task_type, outputs)
    weight, bias = fit_linear(x, labels, objective, c, outputs)
    with torch.no_grad():
        start = float(objective.loss(x.new_zeros(len(x), outputs), labels))
        fitted = float(objective.loss(x @ weight.T + bias, labels))
        if not (torch.isfinite(weight).all() and torch.isfinite(bias).all()):
            return {"bags": len(x), "fitted": False, "reason": "the fit did not converge to finite weights"}
        model.pooled_head.weight.copy_(weight)
        model.head.bias.copy_(bias)
    return {"bags": len(x), "fitted": True, "C": c, "cv_metric": {f"{k:g}": v for k, v in scores.items()},
            "constant_loss": start, "fitted_loss": fitted}
