"""The recipe search (``recipe.search``): train the candidates of :func:`medattn.plan.search.search_plan` by
successive halving, keep the one with the best validation score, and hand back the config that trains it, with
every candidate's score, the choice and the budget in ``recipe.record`` (config.yaml, results.json, the summary and
report.html show it).

Trials are ordinary seeded runs (:func:`medattn.train.fit` with ``test=False``: the test split is never read) in a
temporary folder that is removed afterwards; they start from ``init_from`` as the final run does. A trial that
fails with a UserError (e.g. it diverged) scores nothing and is out of the search.
"""

from __future__ import annotations

import copy
import math
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from medattn.data.base import DataBundle
from medattn.errors import UserError
from medattn.plan import apply as apply_plan
from medattn.plan import fingerprint, plan
from medattn.plan.rules import set_key
from medattn.plan.search import ETA, SearchPlan, describe_search, search_plan


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
    if search.skip:
        chosen["recipe"]["record"] = {"searched": False, "reason": search.skip}
        return chosen
    started, alive, scores = time.time(), list(search.candidates), {}
    with tempfile.TemporaryDirectory(prefix="medattn-recipe-") as folder:
        for round_number, epochs in enumerate(search.rounds, 1):
            for index, candidate in enumerate(alive):
                trial = _trial_config(config, candidate.overrides, epochs)
                try:
                    results = fit(trial, bundle, Path(folder) / f"round{round_number}_{index}", progress=False,
                                  log=lambda message: None, init_from=init_from, test=False)
                    score = results[f"val_{results['metric']}"]
                except UserError as error:
                    log(f"recipe: {candidate.name} failed in round {round_number}: {error}")
                    score = None
                scores.setdefault(candidate.name, []).append({"round": round_number, "epochs": epochs,
                                                              "val_score": score})
                log(f"recipe: round {round_number}, {candidate.name}: best validation score "
                    f"{'none' if score is None else f'{score:.4f}'} in {epochs} epochs")
            ranked = sorted(alive, key=lambda c: -_last(scores[c.name]))  # stable: ties keep the earlier
            alive = ranked[:math.ceil(len(alive) / ETA)]
    winner = alive[0]
    chosen = with_values(config, winner.overrides)
    chosen["recipe"] = {**config["recipe"], "record": {
        "searched": True, "chosen": winner.name, "values": winner.overrides, "keys": search.knobs,
        "budget": search.budget, "single_run_epochs": search.epochs, "trial_epochs": search.trial_epochs,
        "rounds": search.rounds, "seconds": round(time.time() - started, 1),
        "candidates": [{"name": c.name, "values": c.overrides, "trials": scores[c.name]} for c in search.candidates]}}
    log(f"recipe: chose {winner.name} (best validation score {_last(scores[winner.name]):.4f}); the search took "
        f"{time.time() - started:.0f} s")
    return chosen


def _last(trials: list[dict]) -> float:
    """A candidate's latest validation score (-inf when it failed or scored nothing)."""
    score = trials[-1]["val_score"]
    return float("-inf") if score is None else score
