"""The recipe search (``recipe.search``): train the candidates of :func:`medattn.plan.search.search_plan` by
successive halving, keep the one with the best validation score (by inner cross-validation by patient on the
training split where the validation split is too small to choose), and hand back the config that trains it, with
every candidate's score, the choice and the budget in ``recipe.record`` (config.yaml, results.json, the summary and
report.html show it).

Trials are ordinary seeded runs (:func:`medattn.train.fit` with ``test=False``: the test split is never read) in a
temporary folder that is removed afterwards; they start from ``init_from`` as the final run does. A trial that
fails with a UserError (e.g. it diverged) scores nothing and is out of the search. A trial that did not learn
(:mod:`medattn.train.verdict`: its train loss never went below a constant predictor's, or its best validation
score lies within chance) cannot displace the defaults, whatever its score (:func:`_rank`): on ``ihc_bags`` seed 1
the max readout's 6-epoch trial had not started (0.511), attention's flat run peaked at 0.650 on one epoch's noise
and won, and the final run did not learn (test AUROC 0.628; seed 0, where max won, 0.861). With inner cross-validation
(:func:`inner_folds`, :func:`fold_bundles`) a candidate's trial is K runs, one per fold, each trained on the other
folds' cases and scored on the fold's; its score is the mean of the folds' best validation scores (a fold without
a score, e.g. one class only, is left out of the mean), and one failed fold puts the candidate out.

After the last round the best finalist wins, unless a *simpler* finalist (the pooled-feature start,
:attr:`medattn.plan.search.Knob.simpler`) that learned scores within one standard error of it (binary tasks: the
AUROC's, Hanley & McNeil; :func:`_one_standard_error`): a validation split of 60 cases cannot separate such scores,
and the simpler model is the safer bet. For the same reason, where no finalist learned in the last round, the
simpler candidate is kept rather than the defaults (:func:`_simpler_when_none_learned`). On ``ihc_survival`` (a
survival signal below what 60 validation patients can certify) no finalist learned in 17 of 30 searches over 10
re-splits and 3 seeds; the attention readout the defaults' order kept there scored a test C-index of 0.568 on
average, the pooled-feature start 0.591, and the Cox model on pooled features 0.587 on the same splits
(docs/realistic_splits.md, "When no candidate learns").
"""

from __future__ import annotations

import copy
import dataclasses
import math
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import Dataset, Subset

from medattn.data.base import DataBundle
from medattn.data.cohort.splits import assign_splits
from medattn.errors import UserError
from medattn.plan import apply as apply_plan
from medattn.plan import fingerprint, plan
from medattn.plan.rules import set_key
from medattn.plan.search import ETA, Candidate, SearchPlan, describe_search, search_plan
from medattn.vocabulary import task_types


def planned_search(config: dict, bundle: DataBundle) -> SearchPlan:
    """The search ``config`` gets on ``bundle`` (the plan's epochs E as the single run's length)."""
    from medattn.train.defaults import resolve_training, training_defaults

    found = fingerprint(bundle)
    resolved = resolve_training(config)[0]
    epochs = apply_plan(resolved, plan(resolved, found))["train"]["epochs"]
    return search_plan(config, found, epochs, training_defaults(config["model"]["name"]))


def with_values(config: dict, overrides: dict) -> dict:
    """A copy of ``config`` with ``overrides`` (dotted key -> value) set (``model.kwargs`` made where absent)."""
    out = copy.deepcopy(config)
    for key, value in overrides.items():
        set_key(out, key, value)
    return out


def recorded(config: dict, run_dir: Path) -> dict:
    """A resumed run's recipe: the values and the record its saved config.yaml holds (the search is not run
    again, so the resumed run trains what it started)."""
    from medattn.config import read_config_file

    record = (read_config_file(Path(run_dir) / "config.yaml").get("recipe") or {}).get("record")
    if not record:
        return config
    out = with_values(config, record.get("values", {}))
    out["recipe"] = {**out["recipe"], "record": record}
    return out


def recipe_for(config: dict, bundle: DataBundle, run_dir: Path, *, resume: bool,
               init_from: str | Path | None = None, log: Callable[[str], None] = print) -> dict:
    """The config a run trains: a resumed run's recorded recipe (:func:`recorded`), else :func:`choose_recipe`'s."""
    if resume and (Path(run_dir) / "config.yaml").is_file():
        return recorded(config, run_dir)
    return choose_recipe(config, bundle, init_from=init_from, log=log)


def _trial_config(config: dict, overrides: dict, epochs: int) -> dict:
    """The config of one trial: the candidate's values, ``epochs`` epochs, no search, no report extras."""
    trial = with_values(config, overrides)
    trial["train"]["epochs"] = epochs
    trial["recipe"] = {**trial["recipe"], "search": False, "record": None}
    trial["eval"] = {**trial["eval"], "heatmaps": 0}
    return trial


def _patients_and_strata(bundle: DataBundle) -> tuple[list[str], list[str]]:
    """Each training case's patient and stratum (:meth:`~medattn.vocabulary.task_types.TaskType.stratum`): from the
    records where the dataset keeps them, else from each sample (drawn aside: the seeded random stream stays)."""
    kind = task_types.of(bundle.task.task_type)
    records = getattr(bundle.train, "records", None)
    if records is not None:
        return [r.patient for r in records], [kind.stratum(r.label) for r in records]
    with torch.random.fork_rng():
        samples = [bundle.train[i] for i in range(len(bundle.train))]
    return [s.get("patient", s["id"]) for s in samples], [kind.stratum(s["label"]) for s in samples]


def inner_folds(bundle: DataBundle, folds: int, seed: int) -> list[list[int]]:
    """The training split's cases (indices into ``bundle.train``) in ``folds`` folds by patient: no patient in two
    folds, every case in one. Stratified by each patient's stratum as the data splits are
    (:func:`~medattn.data.cohort.splits.assign_splits`: scikit-learn's ``StratifiedGroupKFold`` shuffled with
    ``seed``, so the same data and seed make the same folds), by patient only where a stratum has fewer cases than
    folds; UserError with fewer patients than folds."""
    patients, strata = _patients_and_strata(bundle)

    def fold_names(keys: list[str]) -> list[list[str]]:
        return [assign_splits(patients, keys, {"folds": folds, "fold": k, "val_fraction": 0}, seed)
                for k in range(folds)]

    try:
        names = fold_names(strata)
    except UserError:  # a stratum too rare to reach every fold
        names = fold_names([""] * len(strata))
    return [[i for i, name in enumerate(fold) if name == "test"] for fold in names]


def _take(dataset: Dataset, indices: list[int]) -> Dataset:
    """``dataset``'s cases ``indices``: a table's records keep their loader (and stay records for the code that reads
    them: labels, bag sizes), any other dataset becomes a Subset."""
    from medattn.data.tables import RecordDataset

    if isinstance(dataset, RecordDataset):
        return RecordDataset([dataset.records[i] for i in indices], dataset.load, dataset.transform)
    return Subset(dataset, indices)


def _as_validation(bundle: DataBundle) -> Dataset:
    """The training split read as the validation split reads its cases (no augmentation, whole bags): a table's
    records with the validation loader, a synthetic split with the validation split's ``finish``; another dataset
    as it is."""
    from medattn.data.seeded import SyntheticDataset
    from medattn.train.survival_report import plain_training_set

    if isinstance(bundle.train, SyntheticDataset) and isinstance(bundle.val, SyntheticDataset):
        plain = copy.copy(bundle.train)  # shares the rendered cache
        plain.finish = bundle.val.finish
        return plain
    return plain_training_set(bundle)


def fold_bundles(bundle: DataBundle, folds: list[list[int]]) -> list[DataBundle]:
    """One bundle per fold of :func:`inner_folds`: the other folds' training cases as its training split, the
    fold's as its validation split (read as validation); the task and the rest as ``bundle``'s."""
    held_out = _as_validation(bundle)
    out = []
    for fold in folds:
        inside = set(fold)
        rest = [i for i in range(len(bundle.train)) if i not in inside]
        out.append(dataclasses.replace(bundle, train=_take(bundle.train, rest), val=_take(held_out, fold)))
    return out


def _trial(fit: Callable, trial: dict, parts: list[DataBundle], run_dir: Path, init_from) -> dict:
    """One candidate's trial on ``parts`` (the bundle, or the fold bundles): ``val_score`` (the mean of the parts'
    best validation scores that exist), ``learned`` (the verdict of :mod:`medattn.train.verdict`; with folds, true
    when most folds learned; None where the runs carry no verdict) and, for folds, ``folds`` (each fold's score).
    Raises a trial's UserError."""
    found, verdicts = [], []
    for k, part in enumerate(parts):
        results = fit(trial, part, run_dir / f"part{k}", progress=False, log=lambda message: None,
                      init_from=init_from, test=False)
        found.append(results[f"val_{results['metric']}"])
        verdicts.append((results.get("learning") or {}).get("learned"))
    kept = [score for score in found if score is not None and not math.isnan(score)]
    judged = [v for v in verdicts if v is not None]
    entry = {"val_score": sum(kept) / len(kept) if kept else None,
             "learned": 2 * sum(judged) > len(judged) if judged else None}
    return entry if len(parts) == 1 else {**entry, "folds": found}


def _rank(trials: list[dict], position: int) -> tuple:
    """A candidate's place after a round (lower first): candidates that learned in their latest trial by their
    score; then those that did not learn, in the candidates' order (the defaults first), since a score that did not
    come from learning is noise and must not displace the defaults; then those that failed."""
    latest = trials[-1]
    if latest["val_score"] is None:
        return (2, position)
    if latest.get("learned") is False:
        return (1, position)
    return (0, -latest["val_score"])


def choose_recipe(config: dict, bundle: DataBundle, *, init_from: str | Path | None = None,
                  log: Callable[[str], None] = print, fit: Callable | None = None) -> dict:
    """-> ``config`` with the chosen candidate's values set and ``recipe.record`` filled (the module docstring);
    ``config`` itself when the search does not run (the reason is logged and recorded). ``fit``: the training
    function (default :func:`medattn.train.fit`; tests count its calls)."""
    if fit is None:
        from medattn.train import fit
    search = planned_search(config, bundle)
    log(describe_search(search))
    chosen = copy.deepcopy(config)
    parts = [bundle]
    if search.folds and not search.skip:
        try:
            parts = fold_bundles(bundle, inner_folds(bundle, search.folds, config["seed"]))
        except UserError as error:  # fewer training patients than folds
            search.skip = f"inner {search.folds}-fold cross-validation cannot fold the training split: {error}"
            log(f"recipe: the defaults, no search ({search.skip})")
    if search.skip:
        chosen["recipe"]["record"] = {"searched": False, "reason": search.skip}
        return chosen
    started, alive, scores = time.time(), list(search.candidates), {}
    with tempfile.TemporaryDirectory(prefix="medattn-recipe-") as folder:
        for round_number, epochs in enumerate(search.rounds, 1):
            for index, candidate in enumerate(alive):
                trial = _trial_config(config, candidate.overrides, epochs)
                try:
                    entry = _trial(fit, trial, parts, Path(folder) / f"round{round_number}_{index}", init_from)
                except UserError as error:
                    log(f"recipe: {candidate.name} failed in round {round_number}: {error}")
                    entry = {"val_score": None, "learned": None}
                scores.setdefault(candidate.name, []).append({"round": round_number, "epochs": epochs, **entry})
                score = entry["val_score"]
                log(f"recipe: round {round_number}, {candidate.name}: "
                    f"{'mean of the folds' if search.folds else 'best'} validation score "
                    f"{'none' if score is None else f'{score:.4f}'} in {epochs} epochs"
                    + (" (did not learn)" if entry["learned"] is False else ""))
            position = {c.name: i for i, c in enumerate(search.candidates)}
            finalists = sorted(alive, key=lambda c: _rank(scores[c.name], position[c.name]))  # stable
            alive = finalists[:math.ceil(len(alive) / ETA)]
    error = score_error(bundle, search.folds, _last(scores[finalists[0].name]))
    winner, simpler = _one_standard_error(finalists, scores, error)
    unlearned = scores[winner.name][-1].get("learned") is False
    if unlearned:
        winner = _simpler_when_none_learned(search.candidates, scores, winner)
    chosen = with_values(config, winner.overrides)
    chosen["recipe"] = {**config["recipe"], "record": {
        "searched": True, "chosen": winner.name, "values": winner.overrides, "keys": search.knobs, "by": search.by,
        "budget": search.budget, "single_run_epochs": search.epochs, "trial_epochs": search.trial_epochs,
        "rounds": search.rounds, "seconds": round(time.time() - started, 1), "standard_error": error,
        "simpler_kept": simpler, "none_learned": unlearned,
        "candidates": [{"name": c.name, "values": c.overrides, "trials": scores[c.name]} for c in search.candidates]}}
    log(f"recipe: chose {winner.name} (validation score {_last(scores[winner.name]):.4f} by {search.by}"
        + (f"; no candidate learned in its trial, so {'the simpler model' if winner.simpler else 'the defaults'} "
           "was kept" if unlearned else "")
        + (f"; the simpler model, within one standard error ({error:.4f}) of {simpler}'s "
           f"{_last(scores[simpler]):.4f}" if simpler else "")
        + f"); the search took {time.time() - started:.0f} s")
    return chosen


def score_error(bundle: DataBundle, folds: int, best: float) -> float | None:
    """The standard error of the best validation score ``best`` on the cases that scored it (the validation
    split's, or with inner cross-validation (``folds``) the training split's, each scored once), by the task type
    (:attr:`~medattn.vocabulary.task_type.TaskType.score_error`: the AUROC's for a binary task). None where the
    metric has no closed-form error or the score is undefined: there the best score chooses alone."""
    from medattn.data.base import dataset_labels

    kind = task_types.of(bundle.task.task_type)
    if kind.score_error is None or not math.isfinite(best):
        return None
    return kind.component("score_error")(best, dataset_labels(bundle.train if folds else bundle.val).numpy())


def _one_standard_error(finalists: list, scores: dict, error: float | None) -> tuple:
    """-> (the winner, the name of the best candidate it displaced or None). The last round's best (``finalists``
    ranked by :func:`_rank`) wins, unless it is not itself a simpler candidate (:attr:`Candidate.simpler`: the
    pooled-feature start, the independent model inside the bag model) and a simpler finalist that learned scores
    within ``error`` of it: the one-standard-error rule (Breiman et al., CART 1984; glmnet's lambda.1se). A
    validation split of 60 cases cannot tell apart AUROCs 0.04 apart (``ihc_rare``: max 0.893 against the pooled
    start's 0.867 on validation; 0.784 against 0.851 on test), and where it cannot, the simpler model is the safer
    bet."""
    best = finalists[0]
    top = scores[best.name][-1]
    if error is None or best.simpler or top.get("learned") is False:
        return best, None
    for candidate in finalists[1:]:
        trial = scores[candidate.name][-1]
        if (candidate.simpler and trial.get("learned") is not False and trial["val_score"] is not None
                and top["val_score"] - trial["val_score"] <= error):  # every finalist's latest trial: the last round
            return candidate, best.name
    return best, None


def _simpler_when_none_learned(candidates: list[Candidate], scores: dict, winner: Candidate) -> Candidate:
    """-> the simpler candidate (:attr:`Candidate.simpler`: the pooled-feature start, the independent model inside
    the bag model) that scored in its latest trial, whichever round that was, or ``winner`` where there is none.
    Called where no finalist learned in the last round (:func:`_rank` puts those that learned first): the
    validation split cannot tell the candidates apart, and, as in the one-standard-error rule, the simpler model is
    the safer bet. The rounds themselves are not changed by it, so a candidate that learns in a longer trial of the
    last round still wins by its score (``ihc_survival``, the family split, seed 0: the max readout learned in its
    10-epoch trial after a 5-epoch trial within chance)."""
    return next((c for c in candidates if c.simpler and scores[c.name][-1]["val_score"] is not None), winner)


def _last(trials: list[dict]) -> float:
    """A candidate's latest validation score (-inf when it failed or scored nothing)."""
    score = trials[-1]["val_score"]
    return float("-inf") if score is None else score
