"""The recipe search (issue 48): generated from its knobs, it never searches a key the user set, keeps within its
budget, chooses the same candidate for the same data and seed, gives every arm of a compare the same budget, and
records every candidate's score; trials never read the test split."""

from __future__ import annotations

import math

import pytest
import yaml

from engine_data import bag_bundle, image_bundle, tiny_config
from medattn.experiments.recipe import choose_recipe, planned_search, recipe_for, with_values
from medattn.experiments.runs import job_state
from medattn.plan import fingerprint
from medattn.plan.search import KNOBS, Candidate, SearchPlan, candidates, describe_search, halving_rounds, search_plan
from medattn.train import fit
from medattn.train.defaults import training_defaults

BAG = ("model.name=vitwsi_small", "model.attention=seqnorm", "train.lr=null", "train.batch_size=1",
       "eval.bootstrap=0", "eval.heatmaps=0", "recipe.search=true")
OWN = training_defaults("vitwsi_small")


@pytest.fixture(scope="module")
def bags():
    return bag_bundle(16)


#: A config each knob applies to: the CPU bag transformer chooses its readout, attention-MIL its learning rate.
APPLIES = {"model.kwargs.readout": BAG, "train.lr": (*BAG, "model.name=abmil_small", "model.attention=null")}


def test_every_knob_applies_somewhere_and_none_to_an_image_vit(bags):
    found = fingerprint(bags)
    for knob in KNOBS:
        config = tiny_config(*APPLIES[knob.key])
        found_candidates, keys = candidates(config, found, OWN)
        assert keys == [knob.key]
        assert len(found_candidates) == len(knob.values(config, found, OWN)) >= 2
    first = candidates(tiny_config(*BAG), found, OWN)[0][0]
    assert first.name == "readout=max"  # the plan's default first: presence for a binary task
    assert candidates(tiny_config("train.lr=null"), fingerprint(image_bundle(12)), OWN)[1] == []


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.key)
def test_a_key_the_user_sets_is_never_searched(bags, knob):
    found = fingerprint(bags)
    default = knob.values(tiny_config(*APPLIES[knob.key]), found, OWN)[-1]  # a value the defaults would not choose
    config = with_values(tiny_config(*APPLIES[knob.key]), {knob.key: default})
    found_candidates, keys = candidates(config, found, OWN)
    assert knob.key not in keys
    assert all(knob.key not in c.overrides for c in found_candidates)


def test_the_paper_preset_keeps_its_class_token(bags):
    keys = candidates(tiny_config(*BAG, "model.name=vitwsi_tiny"), fingerprint(bags), OWN)[1]
    assert keys == ["train.lr"]


@pytest.mark.parametrize("n", range(1, 9))
@pytest.mark.parametrize("epochs", [3, 20, 37])
@pytest.mark.parametrize("budget", [1.5, 2.0, 3.0, 5.0])
def test_the_halving_schedule_keeps_within_its_budget(n, epochs, budget):
    """Every round halves the candidates to one; where the budget affords an epoch per candidate and round the
    trials spend at most (budget - 1) single runs, and otherwise the search is skipped (never over budget)."""
    rounds = halving_rounds(n, epochs, budget)
    alive, spent = n, 0
    for per_candidate in rounds:
        spent += alive * per_candidate
        alive = math.ceil(alive / 2)
    assert alive == 1 and len(rounds) == math.ceil(math.log2(n))
    plan = SearchPlan([Candidate(str(i), {}) for i in range(n)], rounds, epochs, budget)
    assert plan.trial_epochs == spent
    if (budget - 1) * epochs / max(1, len(rounds)) >= n:
        assert spent <= (budget - 1) * epochs


def test_auto_skips_small_splits_and_says_why(bags):
    config = tiny_config(*BAG, "recipe.search=auto")
    plan = search_plan(config, fingerprint(bags), 10, OWN)
    assert plan.skip and "16 training and 8 validation cases" in plan.skip
    assert "no search" in describe_search(plan)
    assert "false" in search_plan(tiny_config(*BAG, "recipe.search=false"), fingerprint(bags), 10, OWN).skip


class CountingFit:
    """A stand-in for medattn.train.fit: each candidate's validation score is a fixed function of its values, so
    the best is known; records every call's config (the test split is never asked for)."""

    def __init__(self) -> None:
        self.calls = []

    def __call__(self, config, bundle, run_dir, **kwargs):
        assert kwargs.get("test") is False  # trials never read the test split
        self.calls.append(config)
        readout = config["model"]["kwargs"].get("readout")
        score = {"max": 0.6, "attention": 0.7, "mean": 0.65}[readout] + 0.001 * config["train"]["epochs"]
        return {"metric": "auroc", "val_auroc": score}


def test_the_search_keeps_the_best_candidate_within_its_budget_and_records_it(bags):
    config = tiny_config(*BAG, "train.epochs=8")
    counting = CountingFit()
    chosen = choose_recipe(config, bags, log=lambda m: None, fit=counting)
    record = chosen["recipe"]["record"]
    assert record["searched"] and record["chosen"] == "readout=attention"
    assert chosen["model"]["kwargs"]["readout"] == "attention" and chosen["train"]["lr"] is None
    trial_epochs = sum(c["train"]["epochs"] for c in counting.calls)
    assert trial_epochs == record["trial_epochs"] <= (config["recipe"]["budget"] - 1) * 8
    assert all(c["recipe"]["search"] is False for c in counting.calls)
    assert [c["name"] for c in record["candidates"]] == [c.name for c in planned_search(config, bags).candidates]
    again = choose_recipe(config, bags, log=lambda m: None, fit=CountingFit())
    for one in (again, chosen):
        one["recipe"]["record"].pop("seconds")
    assert again == chosen  # deterministic


def test_a_real_search_is_reproducible_and_the_run_records_it(tmp_path, bags):
    """Real trials on tiny bags: the same data and seed choose the same candidate with the same scores; the final
    run's config.yaml, results.json and summary name the choice and every candidate's score."""
    config = tiny_config(*BAG, "train.epochs=8")
    first = choose_recipe(config, bags, log=lambda m: None)
    second = choose_recipe(config, bags, log=lambda m: None)
    assert first["recipe"]["record"]["candidates"] == second["recipe"]["record"]["candidates"]
    assert first["recipe"]["record"]["chosen"] == second["recipe"]["record"]["chosen"]
    lines = []
    results = fit(first, bags, tmp_path / "run", progress=False, log=lines.append)
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["recipe"]["record"]["chosen"] == first["recipe"]["record"]["chosen"]
    assert results["recipe"]["chosen"] == first["recipe"]["record"]["chosen"]
    assert any(line.startswith("recipe         chose ") for line in "\n".join(lines).splitlines())
    assert "recipe" in (tmp_path / "run" / "report.html").read_text()
    resumed = recipe_for(config, bags, tmp_path / "run", resume=True)  # a resumed run trains what it started
    assert resumed["recipe"]["record"] == saved["recipe"]["record"]
    # compare run again over the same folder (more seeds, another arm) finds this run done, whatever was chosen
    assert job_state(tmp_path / "run", config) == "done"


def test_compare_gives_every_arm_the_same_budget(bags):
    from medattn.experiments.compare import arms_of

    config = tiny_config(*BAG, "train.epochs=12")
    arms = arms_of(config, ["seqnorm", "softmax"], ["abmil_small"])
    plans = {name: planned_search(arm, bags) for name, arm in arms.items()}
    assert {p.budget for p in plans.values()} == {config["recipe"]["budget"]}
    for name, plan in plans.items():
        assert plan.trial_epochs + plan.epochs <= plan.budget * plan.epochs, name
        assert plan.trial_epochs >= (plan.budget - 1) * plan.epochs - len(plan.candidates), name  # budget used
