"""Start a bag transformer's pooled-feature path as the independent model on pooled features, and train the
transformer on what that model misses on bags it has not seen (issue 48).

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
head on z starts at zero, so the model's first predictions are the pooled model's.

The fitted path is then frozen (``W_s`` and its standardiser), and training is **cross-fitted** (:class:`CrossFit`):
each training bag's path term is the prediction of the fold fit that left it out, ``W_k s_i + b_k``, not the full
fit's. The full fit has seen every training bag; where it separates them (``retina_diffuse``, C 100: training loss
0.01 against a constant predictor's 0.69) its residuals, and so the transformer's gradient, vanish, and the model
stays the pooled model (test AUROC 0.937 where the readouts alone reach 1.000). The out-of-fold predictions err on
the training bags as the full fit errs on new ones (stacking, Wolpert 1992), so the transformer learns what the
pooled model misses on bags it has not seen. Validation, test, inference and export use the full fit, whose weights
are the checkpoint's.

Why a fit and not a learned start: trained at the bag model's rate (2e-4, single-bag steps, 20 epochs), the linear
path alone stayed far from its optimum on the realistic bag family (``ihc_bags``: test AUROC 0.891, fitted 0.933),
and a rate of its own would have to serve classification and survival (best at 1e-2 to 2e-2) and regression (best
at 2e-4 to 1e-3) at once (docs/decisions.md, "Pooled features beside the readout").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from medattn.metrics import UndefinedMetricError

MAX_ITERATIONS = 500
#: The inverse penalties C tried (scikit-learn's convention: larger C, weaker penalty).
PENALTY_GRID = (0.001, 0.01, 0.1, 1.0, 10.0, 100.0)
FOLDS = 5


def training_summaries(model, dataset: Dataset) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """-> ((n, 2F) every training bag's mean and maximum standardised features, (n, ...) their labels, their n
    sample ids), the bags read as training reads them, under a forked RNG so the training order stays as seeded."""
    parameter, summaries, labels, ids = model.head.weight, [], [], []
    with torch.random.fork_rng(), torch.no_grad():
        for index in range(len(dataset)):
            sample = dataset[index]
            features = model.feature_norm(sample["input"].to(parameter.device, parameter.dtype)).unsqueeze(0)
            summaries.append(model.features_summary(features)[0].float())
            labels.append(sample["label"])
            ids.append(sample["id"])
    return torch.stack(summaries), torch.stack(labels).to(parameter.device), ids  # the labels as collate batches them


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
                   outputs: int) -> tuple[float, dict, torch.Tensor]:
    """-> (C, {C: the out-of-fold validation metric}, (n, outputs) the out-of-fold predictions at that C) by
    :data:`FOLDS`-fold cross-validation over :data:`PENALTY_GRID` (module docstring); a metric the folds leave
    undefined counts as -inf."""
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    folds = [order[k::FOLDS] for k in range(FOLDS)]
    scores, out_of_fold = {}, {}
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
        out_of_fold[c] = predicted
    chosen = max(PENALTY_GRID, key=lambda c: (scores[c], -c))
    return chosen, scores, out_of_fold[chosen]


def calibrate(out_of_fold: torch.Tensor, labels: torch.Tensor, objective) -> tuple[float, torch.Tensor]:
    """(n, K) out-of-fold predictions -> (scale a in (0, 1), shift d (K,)) minimising ``L(a oof + d, y)``: the stacking
    weight of the pooled model (Wolpert 1992; Platt's scaling of held-out scores). A fold fit at a weak penalty
    separates its training folds and predicts its held-out bags with logits far too confident (``retina_diffuse``, C
    100: out-of-fold AUROC 0.92 at a loss of 0.585 against a constant predictor's 0.693); scaled, the path starts the
    transformer from the pooled model's ranking without saturating its loss. ``a = sigmoid(t)``: the path may shrink,
    never grow."""
    logit_scale = out_of_fold.new_zeros((), requires_grad=True)
    shift = out_of_fold.new_zeros(out_of_fold.shape[1], requires_grad=True)
    solver = torch.optim.LBFGS([logit_scale, shift], max_iter=MAX_ITERATIONS, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        solver.zero_grad()
        loss = objective.loss(torch.sigmoid(logit_scale) * out_of_fold + shift, labels)
        loss.backward()
        return loss

    solver.step(closure)
    return float(torch.sigmoid(logit_scale.detach())), shift.detach()


@dataclass
class CrossFit:
    """The pooled path as training sees it: each training bag's out-of-fold prediction ``W_k s_i + b_k`` (the fit on
    the folds without bag i, at the chosen C) in place of the full fit's ``W_s s_i + b``. Training on the full fit,
    whose fit has seen every training bag, leaves the transformer the residual of a model that has memorised them
    (a separating fit's loss is near zero and so is its gradient); on the out-of-fold predictions it learns what the
    pooled model gets wrong on bags it has not seen, as on new bags. Validation, test and inference use the full fit.
    ``offsets``: sample id -> (K,); ``bias``: the full fit's b (the head's bias at the start)."""

    offsets: dict
    bias: torch.Tensor

    def correct(self, logits: torch.Tensor, model, batch: dict) -> torch.Tensor:
        """(B, K) training logits ``head(z) + W_s s + ...`` of ``batch`` -> ``head(z) + (W_k s + b_k - b)``: the full
        fit's path (frozen, so no gradient is lost) swapped for each bag's out-of-fold prediction."""
        with torch.no_grad():
            path = model.pooled_logits(batch["input"], batch.get("mask")) + self.bias.to(logits.device)
            offsets = torch.stack([self.offsets[key] for key in batch["id"]]).to(logits.device)
        return logits + (offsets - path).to(logits.dtype)


def fit_pooled_path(model, dataset: Dataset, objective, task_type: str, *,
                    resume: bool = False) -> tuple[dict | None, CrossFit | None]:
    """Fit ``model``'s pooled-feature path on the training bags ``dataset`` of a ``task_type`` task by
    ``objective.loss``, its penalty chosen by ``objective.metric_of`` (the module docstring), set its standardiser to
    the training summaries' statistics and freeze both. -> (what was fitted, for results.json: bags, C, the
    cross-validated metric per C, the training loss of a constant predictor, of the fit and of the out-of-fold
    predictions; the :class:`CrossFit` training uses), (None, None) for a model without the path. ``resume``: the
    model's path was fitted and saved by the run it resumes; the same deterministic fit gives the same record and
    offsets and the model is left as loaded."""
    if not getattr(model, "pooled_features", False):
        return None, None
    summaries, labels, ids = training_summaries(model, dataset)
    standardiser = model.features_pool_norm
    if not resume:
        standardiser.mean.copy_(summaries.mean(0))
        standardiser.var.copy_(summaries.var(0))
        standardiser.count.fill_(len(summaries))
    standardiser.frozen = True  # the path is the fit: its statistics stay the training bags'
    model.pooled_head.requires_grad_(False)
    x = (summaries - standardiser.mean) / torch.sqrt(standardiser.var + standardiser.eps)
    outputs = model.pooled_head.weight.shape[0]
    c, scores, out_of_fold = choose_penalty(x, labels, objective, task_type, outputs)
    weight, bias = fit_linear(x, labels, objective, c, outputs)
    if not (torch.isfinite(weight).all() and torch.isfinite(bias).all() and torch.isfinite(out_of_fold).all()):
        return {"bags": len(x), "fitted": False, "reason": "the fit did not converge to finite weights"}, None
    scale, shift = calibrate(out_of_fold, labels, objective)
    weight, bias, out_of_fold = scale * weight, scale * bias + shift, scale * out_of_fold + shift
    with torch.no_grad():
        losses = {name: float(objective.loss(logits, labels)) for name, logits in (
            ("constant_loss", x.new_zeros(len(x), outputs)), ("fitted_loss", x @ weight.T + bias),
            ("out_of_fold_loss", out_of_fold))}
        if not resume:
            model.pooled_head.weight.copy_(weight)
            model.head.bias.copy_(bias)
    return ({"bags": len(x), "fitted": True, "C": c, "cv_metric": {f"{k:g}": v for k, v in scores.items()},
             "scale": scale, "shift": shift.tolist(), **losses},
            CrossFit(dict(zip(ids, out_of_fold.detach())), bias.detach()))
