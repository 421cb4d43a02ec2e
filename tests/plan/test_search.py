"""The recipe search (issue 48): generated from its knobs, it never searches a key the user set, keeps within its
budget, chooses the same candidate for the same data and seed, gives every arm of a compare the same budget, and
records every candidate's score; trials never read the test split. Where the validation split is too small to
choose, it chooses by inner cross-validation over the training split's patients, within the same budget."""

from __future__ import annotations

import dataclasses
import math
from functools import partial

import pytest
import torch
import yaml
from torch.utils.data import Dataset

from engine_data import SignalBags, bag_bundle, image_bundle, tiny_config
from medattn.data.base import DataBundle, TaskInfo
from medattn.data.tables import RecordDataset
from medattn.experiments.recipe import choose_recipe, fold_bundles, inner_folds, planned_search, recipe_for, with_values
from medattn.experiments.runs import job_state
from medattn.plan import fingerprint
from medattn.plan.search import (
    AUTO_MIN_TRAIN,
    AUTO_MIN_VAL,
    INNER_FOLDS,
    KNOBS,
    MAX_CANDIDATES,
    Candidate,
    SearchPlan,
    candidates,
    describe_search,
    halving_rounds,
    search_plan,
)
from medattn.train import fit
from medattn.train.defaults import training_defaults
from medattn.vocabulary.record import Record

#: The CPU bag transformer with every searchable key unset (BAG_ALL), and with its pooled-feature start set (BAG):
#: most tests here are about the readout search and its schedule for 3 candidates.
BAG_ALL = ("model.name=vitwsi_small", "model.attention=seqnorm", "train.lr=null", "train.batch_size=1",
           "eval.bootstrap=0", "eval.heatmaps=0", "recipe.search=true")
BAG = (*BAG_ALL, "model.kwargs.pooled_features=false")
OWN = training_defaults("vitwsi_small")


@pytest.fixture(scope="module")
def bags():
    return bag_bundle(16)


@pytest.fixture(scope="module")
def big_bags():
    """A validation split of AUTO_MIN_VAL cases: large enough to choose by itself."""
    return bag_bundle(2 * AUTO_MIN_VAL)


class Cases(Dataset):
    """engine_data's SignalBags under ids of their own split, two cases per patient (its splits reuse ids)."""

    def __init__(self, n: int, seed: int, split: str) -> None:
        self.bags, self.split = SignalBags(n, seed), split

    def __len__(self) -> int:
        return len(self.bags)

    def __getitem__(self, index: int) -> dict:
        return {**self.bags[index], "id": f"{self.split}{index}", "patient": f"{self.split}-p{index // 2}"}


@pytest.fixture(scope="module")
def patients():
    """31 training cases of 16 patients (one with one case), a validation split of 10 cases (< AUTO_MIN_VAL)."""
    task = TaskInfo("binary", "bag", 1, (16,), synthetic=True)
    return DataBundle(Cases(31, 0, "train"), Cases(10, 1, "val"), Cases(10, 2, "test"), task)


def ids(dataset) -> list[str]:
    return [dataset[i]["id"] for i in range(len(dataset))]


def get_key(config: dict, key: str):
    """The value of a dotted key."""
    for part in key.split("."):
        config = config[part]
    return config


#: A config each knob alone applies to: the CPU bag transformer chooses its readout (its pooled-feature start set) or
#: its pooled-feature start (its readout set), attention-MIL its learning rate.
APPLIES = {"model.kwargs.readout": BAG,
           "model.kwargs.pooled_features": (*BAG_ALL, "model.kwargs.readout=max", "train.lr=2e-4"),
           "train.lr": (*BAG, "model.name=abmil_small", "model.attention=null")}


def test_every_knob_applies_somewhere_and_none_to_an_image_vit(bags):
    found = fingerprint(bags)
    for knob in KNOBS:
        config = tiny_config(*APPLIES[knob.key])
        found_candidates, keys = candidates(config, found, OWN)
        assert keys == [knob.key]
        assert len(found_candidates) == len(knob.values(config, found, OWN)) >= 2
    both = candidates(tiny_config(*BAG_ALL), found, OWN)[0]
    assert both[0].name == "readout=max"  # the plan's default first: presence for a binary task
    # the pooled-feature start is one more candidate, with the default readout, not a second copy of every readout
    assert [c.name for c in both] == ["readout=max", "readout=attention", "readout=mean",
                                      "readout=max,pooled_features=True"]
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


@pytest.mark.parametrize("search", ["auto", "true"])
@pytest.mark.parametrize("n_val", [0, 8, AUTO_MIN_VAL - 1, AUTO_MIN_VAL, 200])
def test_a_small_validation_split_chooses_by_inner_cross_validation(bags, search, n_val):
    """auto and true alike: a validation split of fewer than AUTO_MIN_VAL cases hands the choice to inner
    cross-validation (said in the plan), a larger one chooses by itself."""
    found = {**fingerprint(bags), "cases": {"train": AUTO_MIN_TRAIN, "val": n_val, "test": 20}}
    plan = search_plan(tiny_config(*BAG, f"recipe.search={search}"), found, 20, OWN)
    assert plan.skip is None
    assert plan.folds == (INNER_FOLDS if n_val < AUTO_MIN_VAL else 0)
    said = describe_search(plan)
    assert (f"inner {INNER_FOLDS}-fold cross-validation" in said) == (n_val < AUTO_MIN_VAL)
    assert f"{n_val} cases" in said


@pytest.mark.parametrize("key", sorted(APPLIES))
@pytest.mark.parametrize("epochs", [1, 2, 3, 5, 8, 13, 20, 37])
@pytest.mark.parametrize("budget", [1.5, 2.0, 3.0, 5.0])
def test_inner_cross_validation_keeps_within_its_budget(bags, key, epochs, budget):
    """K fold trials of e // (K - 1) epochs on (K - 1) / K of the cases each cost at most a plain trial's e epochs:
    the trials spend at most (budget - 1) single runs; the search is skipped exactly where the plain schedule
    affords no epoch per fold trial."""
    config = tiny_config(*APPLIES[key], f"recipe.budget={budget}")
    found = {**fingerprint(bags), "cases": {"train": AUTO_MIN_TRAIN, "val": 10, "test": 10}}
    plan = search_plan(config, found, epochs, OWN)
    plain = SearchPlan(plan.candidates, halving_rounds(len(plan.candidates), epochs, budget), epochs, budget)
    assert plan.folds == INNER_FOLDS and plan.rounds == [e // (INNER_FOLDS - 1) for e in plain.rounds]
    affordable = min(plain.rounds) >= INNER_FOLDS - 1 and plain.trial_epochs <= (budget - 1) * epochs
    assert (plan.skip is None) == affordable
    if plan.skip is None:
        assert plan.trial_epochs <= plain.trial_epochs <= (budget - 1) * epochs
    else:
        assert "less than an epoch per" in plan.skip


class CountingFit:
    """A stand-in for medattn.train.fit: each candidate's validation score is a fixed function of its values, so
    the best is known; records every call's config and data (the test split is never asked for)."""

    def __init__(self) -> None:
        self.calls, self.bundles = [], []

    def __call__(self, config, bundle, run_dir, **kwargs):
        assert kwargs.get("test") is False  # trials never read the test split
        self.calls.append(config)
        self.bundles.append(bundle)
        readout = config["model"]["kwargs"].get("readout", "max")
        score = {"max": 0.6, "attention": 0.7, "mean": 0.65}[readout] + 0.001 * config["train"]["epochs"]
        return {"metric": "auroc", "val_auroc": score + 0.0001 * len(bundle.val)}


def test_a_large_validation_split_chooses_by_itself_within_its_budget_and_records_it(big_bags):
    config = tiny_config(*BAG, "train.epochs=8")
    counting = CountingFit()
    chosen = choose_recipe(config, big_bags, log=lambda m: None, fit=counting)
    record = chosen["recipe"]["record"]
    assert record["searched"] and record["chosen"] == "readout=attention"
    assert record["by"] == f"the validation split ({AUTO_MIN_VAL} cases)"
    assert all(bundle is big_bags for bundle in counting.bundles)  # the whole training split, its own validation
    assert all("folds" not in t for c in record["candidates"] for t in c["trials"])
    assert chosen["model"]["kwargs"]["readout"] == "attention" and chosen["train"]["lr"] is None
    trial_epochs = sum(c["train"]["epochs"] for c in counting.calls)
    assert trial_epochs == record["trial_epochs"] <= (config["recipe"]["budget"] - 1) * 8
    assert all(c["recipe"]["search"] is False for c in counting.calls)
    assert [c["name"] for c in record["candidates"]] == [c.name for c in planned_search(config, big_bags).candidates]
    again = choose_recipe(config, big_bags, log=lambda m: None, fit=CountingFit())
    for one in (again, chosen):
        one["recipe"]["record"].pop("seconds")
    assert again == chosen  # deterministic


@pytest.mark.parametrize("epochs", [6, 8, 13])
def test_inner_cross_validation_folds_the_training_patients_within_the_budget(patients, epochs):
    """A small validation split: every candidate's trial is K fold runs whose validation parts partition the
    training cases by patient (no patient in two folds, every case in one), each trained on the rest; no validation
    or test case in any; the same folds for every candidate; the trained epochs keep within the budget."""
    config = tiny_config(*BAG, f"train.epochs={epochs}")
    counting = CountingFit()
    chosen = choose_recipe(config, patients, log=lambda m: None, fit=counting)
    record, search = chosen["recipe"]["record"], planned_search(config, patients)
    assert record["searched"] and record["chosen"] == "readout=attention"
    assert record["by"].startswith(f"inner {INNER_FOLDS}-fold cross-validation") and "(validation split of 10" in \
        record["by"]
    train, outside = set(ids(patients.train)), set(ids(patients.val)) | set(ids(patients.test))
    trials = [counting.bundles[i:i + INNER_FOLDS] for i in range(0, len(counting.bundles), INNER_FOLDS)]
    assert len(counting.bundles) == INNER_FOLDS * sum(len(c["trials"]) for c in record["candidates"])
    folds = [[ids(part.val) for part in trial] for trial in trials]
    assert all(each == folds[0] for each in folds)  # every candidate and round: the same folds
    held = [case for fold in folds[0] for case in fold]
    assert sorted(held) == sorted(train)  # every training case in exactly one fold
    owner = {patients.train[i]["id"]: patients.train[i]["patient"] for i in range(len(patients.train))}
    fold_of = {}
    for k, fold in enumerate(folds[0]):
        for case in fold:
            assert fold_of.setdefault(owner[case], k) == k  # no patient in two folds
    for part in counting.bundles:
        assert sorted(ids(part.train) + ids(part.val)) == sorted(train) and not set(ids(part.train)) & outside
        assert part.test is patients.test and part.task is patients.task
    scale = len(patients.train)  # training-split epochs actually trained: epochs x the share of the cases
    trained = sum(c["train"]["epochs"] * len(b.train) / scale for c, b in zip(counting.calls, counting.bundles))
    assert trained == pytest.approx(record["trial_epochs"]) and trained <= (config["recipe"]["budget"] - 1) * epochs
    assert record["rounds"] == search.rounds == [e // (INNER_FOLDS - 1) for e in halving_rounds(3, epochs, 3)]
    for candidate in record["candidates"]:
        for trial in candidate["trials"]:
            assert len(trial["folds"]) == INNER_FOLDS
            assert trial["val_score"] == pytest.approx(sum(trial["folds"]) / INNER_FOLDS)
    again = CountingFit()
    repeated = choose_recipe(config, patients, log=lambda m: None, fit=again)
    for one in (repeated, chosen):
        one["recipe"]["record"].pop("seconds")
    assert repeated == chosen  # deterministic: the same folds and the same choice
    assert [ids(b.val) for b in again.bundles] == [ids(b.val) for b in counting.bundles]


def test_a_tables_folds_stay_records_and_are_validated_as_validation_data(patients):
    """A table's fold keeps its records (labels and bag sizes are read from them) and the training loader for its
    training part, the validation loader (no augmentation, whole bags) for its held-out fold."""
    records = [Record(f"c{i}", f"p{i // 3}", f"row {i}", (), torch.tensor([float(i % 2)])) for i in range(12)]
    train_load, val_load = (lambda record: {"input": torch.zeros(3, 16)}), (lambda record: {"input": torch.ones(3, 16)})
    bundle = DataBundle(RecordDataset(records, train_load), RecordDataset([], val_load), RecordDataset([], val_load),
                        patients.task)
    parts = fold_bundles(bundle, inner_folds(bundle, INNER_FOLDS, 0))
    assert sorted(r.id for part in parts for r in part.val.records) == sorted(r.id for r in records)
    for part in parts:
        assert part.train.load is train_load and part.val.load is val_load
        assert not {r.patient for r in part.train.records} & {r.patient for r in part.val.records}


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.key)
def test_inner_cross_validation_never_searches_a_key_the_user_sets(patients, knob):
    """Every fold trial trains the user's value (a set readout leaves the bag transformer's rate to search)."""
    found = fingerprint(patients)
    value = knob.values(tiny_config(*APPLIES[knob.key]), found, OWN)[-1]
    config = with_values(tiny_config(*APPLIES[knob.key], "train.epochs=8"), {knob.key: value})
    counting = CountingFit()
    record = choose_recipe(config, patients, log=lambda m: None, fit=counting)["recipe"]["record"]
    assert all(get_key(call, knob.key) == value for call in counting.calls)
    assert knob.key not in record.get("keys", []) and knob.key not in record.get("values", {})


def test_a_real_search_is_reproducible_and_the_run_records_it(tmp_path, bags):
    """Real trials on tiny bags: the same data and seed choose the same candidate with the same scores; the final
    run's config.yaml, results.json and summary name the choice and every candidate's score."""
    config = tiny_config(*BAG, "train.epochs=8")
    first = choose_recipe(config, bags, log=lambda m: None)
    second = choose_recipe(config, bags, log=lambda m: None)
    assert first["recipe"]["record"]["candidates"] == second["recipe"]["record"]["candidates"]
    assert first["recipe"]["record"]["chosen"] == second["recipe"]["record"]["chosen"]
    trials = [t for c in first["recipe"]["record"]["candidates"] for t in c["trials"]]
    assert all(t["learned"] in (True, False) for t in trials)  # a trial without a test split is judged too
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


def test_the_summary_line_names_what_chose():
    """The run summary and report.html say whether the validation split or inner cross-validation chose."""
    from medattn.train.report import recipe_text

    record = {"searched": True, "chosen": "readout=mean", "budget": 3, "trial_epochs": 40, "single_run_epochs": 20,
              "rounds": [5, 10], "candidates": [{"name": "readout=mean", "trials": [{"val_score": 0.7}]}]}
    assert "by the score on the validation split (" in recipe_text(record)  # a record from before "by"
    inner = {**record, "by": "inner 3-fold cross-validation by patient on the training split"}
    assert "by the score on inner 3-fold cross-validation by patient" in recipe_text(inner)


class JudgedFit(CountingFit):
    """CountingFit whose runs carry the verdict: the readouts in ``unlearned`` did not learn."""

    def __init__(self, unlearned: set[str]) -> None:
        super().__init__()
        self.unlearned = unlearned

    def __call__(self, config, bundle, run_dir, **kwargs):
        results = super().__call__(config, bundle, run_dir, **kwargs)
        readout = config["model"]["kwargs"].get("readout", "max")
        return {**results, "learning": {"learned": readout not in self.unlearned}}


@pytest.mark.parametrize("unlearned, expected", [
    ({"attention"}, "readout=mean"),  # the best score did not learn: the best that learned wins
    ({"attention", "mean", "max"}, "readout=max"),  # nothing learned: the defaults stay
    ({"max"}, "readout=attention"),  # the defaults did not learn, the others did: scores decide among them
    (set(), "readout=attention"),
])
def test_a_trial_that_did_not_learn_never_displaces_the_defaults(big_bags, unlearned, expected):
    """ihc_bags seed 1: attention's flat trial peaked on one epoch's noise and beat the max readout, which had not
    started; the final run did not learn. A trial's score counts only where the trial learned."""
    config = tiny_config(*BAG, "train.epochs=8")
    record = choose_recipe(config, big_bags, log=lambda m: None, fit=JudgedFit(unlearned))["recipe"]["record"]
    assert record["chosen"] == expected
    trials = {c["name"]: c["trials"] for c in record["candidates"]}
    assert all(t["learned"] == (name.split("=")[1] not in unlearned) for name, ts in trials.items() for t in ts)


class RoundJudgedFit(JudgedFit):
    """JudgedFit whose readouts in ``late`` learn only in a trial of at least ``epochs`` epochs (the last round)."""

    def __init__(self, unlearned: set[str], late: set[str], epochs: int) -> None:
        super().__init__(unlearned)
        self.late, self.epochs = late, epochs

    def __call__(self, config, bundle, run_dir, **kwargs):
        results = super().__call__(config, bundle, run_dir, **kwargs)
        readout = config["model"]["kwargs"].get("readout", "max")
        late = readout in self.late and not config["model"]["kwargs"].get("pooled_features")
        return {**results, "learning": {"learned": config["train"]["epochs"] >= self.epochs}} if late else results


@pytest.mark.parametrize("unlearned, late, expected", [
    ({"max", "attention", "mean"}, set(), "readout=max,pooled_features=True"),  # nothing learned: the simpler model
    ({"max", "mean"}, set(), "readout=attention"),  # a candidate that learned beats a simpler one that did not
    ({"max", "mean"}, {"attention"}, "readout=attention"),  # it learned in the last round's longer trial
])
def test_where_no_candidate_learns_the_simpler_model_is_kept(big_bags, unlearned, late, expected):
    """ihc_survival: in 17 of 30 searches no finalist's validation C-index left chance, and the attention readout
    the defaults' order kept scored below the pooled-feature start on those splits. The rounds stay as they were:
    the start (readout max here, so it did not learn either) is out after the first round, and a finalist that
    learns in the last round's longer trial still wins by its score."""
    from medattn.train.report import recipe_text

    config, lines = tiny_config(*BAG_ALL, "train.epochs=8"), []
    fit = RoundJudgedFit(unlearned, late, planned_search(config, big_bags).rounds[-1])
    record = choose_recipe(config, big_bags, log=lines.append, fit=fit)["recipe"]["record"]
    assert record["chosen"] == expected
    trials = {c["name"]: c["trials"] for c in record["candidates"]}
    assert len(trials["readout=max,pooled_features=True"]) == 1  # out after the first round
    learns = "attention" not in unlearned  # in the last round; in the first too unless it learns late
    assert [t["learned"] for t in trials["readout=attention"]] == [learns and "attention" not in late, learns]
    kept = expected.endswith("True")
    assert ("so the simpler model was kept" in lines[-1]) == kept == record["none_learned"]
    assert (", no candidate learned in its trial," in recipe_text(record)) == kept


def test_a_knob_searched_alone_keeps_the_search_within_four_candidates(bags):
    """Regression's 4 readouts leave no room for the pooled-feature start (a fifth candidate made a first round of 2
    epochs); with the readout set, the start is searched against the defaults."""
    regression = fingerprint(bags)
    regression["task_type"] = "regression"
    found_candidates, keys = candidates(tiny_config(*BAG_ALL), regression, OWN)
    assert keys == ["model.kwargs.readout"] and len(found_candidates) == MAX_CANDIDATES
    chosen = tiny_config(*BAG_ALL, "model.kwargs.readout=attention", "train.lr=2e-4")
    assert [c.name for c in candidates(chosen, fingerprint(bags), OWN)[0]] == ["defaults", "pooled_features=True"]


class PooledFit(CountingFit):
    """Validation scores: the max readout ``best``, the pooled-feature start ``pooled`` (learned or not), attention
    and mean far below."""

    def __init__(self, best: float, pooled: float, pooled_learned: bool = True) -> None:
        super().__init__()
        self.best, self.pooled, self.pooled_learned = best, pooled, pooled_learned

    def __call__(self, config, bundle, run_dir, **kwargs):
        super().__call__(config, bundle, run_dir, **kwargs)
        kwargs_ = config["model"]["kwargs"]
        if kwargs_.get("pooled_features"):
            return {"metric": "auroc", "val_auroc": self.pooled, "learning": {"learned": self.pooled_learned}}
        score = self.best if kwargs_.get("readout", "max") == "max" else 0.6
        return {"metric": "auroc", "val_auroc": score, "learning": {"learned": True}}


@pytest.mark.parametrize("margin, pooled_learned, expected", [
    (0.5, True, "readout=max,pooled_features=True"),  # within one standard error: the simpler model
    (1.0, True, "readout=max,pooled_features=True"),
    (1.5, True, "readout=max"),  # beyond it: the best score
    (0.5, False, "readout=max"),  # a start that did not learn is never kept
    (-0.5, True, "readout=max,pooled_features=True"),  # the simpler model is the best anyway
])
def test_the_pooled_start_is_kept_within_one_standard_error_of_the_best(big_bags, margin, pooled_learned, expected):
    """ihc_rare: the max readout validated at 0.893 and the pooled start at 0.867 on 60 cases (one standard error of
    the AUROC: 0.043), and the test split said the reverse (0.784 against 0.851)."""
    from medattn.data.base import dataset_labels
    from medattn.metrics import auroc_standard_error
    from medattn.train.report import recipe_text

    labels = dataset_labels(big_bags.val).reshape(-1)
    error = partial(auroc_standard_error, positives=int(labels.sum()), negatives=int(len(labels) - labels.sum()))
    fitted = PooledFit(0.9, 0.9 - margin * error(0.9), pooled_learned)
    record = choose_recipe(tiny_config(*BAG_ALL, "train.epochs=8"), big_bags, log=lambda m: None,
                           fit=fitted)["recipe"]["record"]
    best = max(0.9, fitted.pooled) if pooled_learned else 0.9  # the error is the best score's
    assert record["chosen"] == expected and record["standard_error"] == pytest.approx(error(best))
    kept = expected.endswith("True") and margin > 0
    assert record["simpler_kept"] == ("readout=max" if kept else None)
    assert ("the simpler model within one standard error" in recipe_text(record)) == kept


def test_the_plan_marks_the_simpler_candidate(big_bags):
    said = describe_search(planned_search(tiny_config(*BAG_ALL, "train.epochs=8"), big_bags)).splitlines()
    simpler = "(the simpler model: kept within one standard error of the best, and where no candidate learns)"
    # max (the defaults), attention, mean, the pooled start
    assert [line.endswith(simpler) for line in said[1:]] == [False, False, False, True]


def test_without_a_closed_form_error_the_best_score_chooses(bags):
    """Survival and regression scores have no closed-form error here: the best validation score chooses alone."""
    from medattn.experiments.recipe import _one_standard_error, score_error
    from medattn.plan.search import Candidate

    survival = dataclasses.replace(bags, task=dataclasses.replace(bags.task, task_type="survival"))
    assert score_error(survival, 0, 0.7) is None and score_error(bags, 0, float("-inf")) is None
    best, simpler = Candidate("readout=max", {}), Candidate("pooled", {}, simpler=True)
    scores = {"readout=max": [{"round": 2, "val_score": 0.9}], "pooled": [{"round": 2, "val_score": 0.89}]}
    assert _one_standard_error([best, simpler], scores, None) == (best, None)
    assert _one_standard_error([best, simpler], scores, 0.02) == (simpler, "readout=max")
