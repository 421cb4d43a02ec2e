"""The recipe search's plan: which keys a run may search (:data:`KNOBS`), the candidate configurations for the keys
a config leaves unset, and the successive-halving schedule that fits them into a stated budget. Nothing here trains
(:mod:`medattn.experiments.recipe` runs the trials); ``medattn plan --search`` prints this plan.

A defaults chosen on one data set hold there and not elsewhere (issue 48: max pooling finds needles in
classification bags and cannot fit a fraction; a learning rate that learns in 3 epochs on one feature distribution
sits flat on another). So, as nnU-Net does, a run may train a few stated candidates on the training split, keep the
one that validates best and say which it kept:

* **candidates**: the product of the values of every knob that applies (:class:`Knob`), the defaults' candidate
  first; a knob applies only when the config leaves its key unset: a user's explicit key is never searched over;
* **budget** (``recipe.budget``, default 3): the whole run costs at most ``budget`` single runs of the planned
  length E: the final run (E epochs, the chosen candidate, from scratch) and trials of ``(budget - 1) E`` epochs in
  all. Successive halving (Jamieson & Talwalkar 2016, eta = 2): ``ceil(log2 n)`` rounds share the trial epochs
  equally; each round trains its candidates from scratch for ``round budget / candidates`` epochs and keeps the
  better half by the best validation score; ties keep the earlier candidate (the defaults first). Deterministic:
  the trials are seeded runs, so the same data and seed make the same choice;
* **when** (``recipe.search``): ``true``, ``false``, or ``auto`` (the default): on where a knob applies and the
  training split can choose (at least :data:`AUTO_MIN_TRAIN` cases), else off with the reason printed;
* **by what** (:attr:`SearchPlan.by`): the best validation score where the validation split has at least
  :data:`AUTO_MIN_VAL` cases; on a smaller one (a score of fewer cases chooses noise) by inner cross-validation: the
  training split only, in :data:`INNER_FOLDS` folds by patient (stratified by the task type's stratum), each
  candidate trained on the other folds and scored on each fold; its score in a round is the mean over the folds.
  The validation split still chooses the final run's checkpoint; the test split is never read. The budget holds: a
  fold trial trains on (K - 1) / K of the cases, so a round of e epochs per candidate gives each of its K fold
  trials ``e // (K - 1)`` epochs, ``(K - 1) * (e // (K - 1)) <= e`` training-split epochs in all (no epoch per
  fold trial: the search is skipped).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from medattn.vocabulary import task_types

AUTO_MIN_TRAIN, AUTO_MIN_VAL = 100, 40
ETA = 2  # successive halving keeps 1 / ETA of the candidates each round
#: The most candidates a knob searched alone (:attr:`Knob.alone`) may bring the search to: with 4, successive halving
#: keeps two rounds (5 and 10 epochs per candidate at E = 20, budget 3); with 5 (a regression task's 4 readouts and
#: the pooled-feature start) it took three, the first of 2 epochs, whose validation scores were noise.
MAX_CANDIDATES = 4
#: K of the inner cross-validation that replaces a validation split of fewer than AUTO_MIN_VAL cases: each fold trial
#: trains on 2/3 of the training cases, and every training case is scored once (a fold of 100 cases scores 33).
INNER_FOLDS = 3


def _is_bag_model(config: dict, found: dict) -> bool:
    from medattn.data import input_kinds

    return input_kinds.of(found["input_kind"]).instances


def _pooling_preset_leaves(key: str, config: dict, found: dict) -> bool:
    """Whether the run's model is a bag model whose preset reads the bag by pooling its tiles (``vitwsi_small``) and
    whose config leaves ``model.kwargs.<key>`` unset."""
    from medattn.catalogue import PRESETS

    preset = PRESETS.get(config["model"]["name"], (None, {}))[1]
    return (_is_bag_model(config, found) and preset.get("readout", "cls") != "cls"
            and key not in (config["model"].get("kwargs") or {}))


def pooling_readout(config: dict, found: dict) -> bool:
    """Whether the readout is searched: a pooling bag preset whose config sets no readout (the paper's ``vitwsi``
    keeps its class token unless the user asks otherwise)."""
    return _pooling_preset_leaves("readout", config, found)


def _rate_unset(config: dict, found: dict) -> bool:
    """The learning rate is searched for a bag model without a readout to choose (attention-MIL, TransMIL, the paper's
    ``vitwsi``) whose config leaves ``train.lr`` null: with 3-4 readout candidates, two rates each would halve every
    trial (first rounds of 1-2 epochs, whose validation scores on 60 cases were noise)."""
    return _is_bag_model(config, found) and config["train"].get("lr") is None and not pooling_readout(config, found)


def readouts(config: dict, found: dict, own: dict | None = None) -> list:
    """The readouts a bag transformer tries (:data:`medattn.models.wsi.READOUTS`), the plan's default first, by the
    question the task type asks (:attr:`~medattn.vocabulary.task_types.TaskType.readouts`): max finds a few positive
    tiles (chosen on the IHC bags, issue 40), attention fitted the fraction of positive tiles on held-out bags where
    max reached r 0.22 (issue 48), mean reads diffuse findings and count a number of tiles."""
    return list(task_types.of(found["task_type"]).readouts)


def pooled_features_unset(config: dict, found: dict) -> bool:
    """Whether the bag transformer may start as the pooled model (``model.kwargs.pooled_features``,
    :mod:`medattn.train.pooled_path`): a pooling bag preset whose config leaves the key unset."""
    return _pooling_preset_leaves("pooled_features", config, found)


def _off_then_on(config: dict, found: dict, own: dict) -> list:
    return [False, True]


def _learning_rates(config: dict, found: dict, own: dict) -> list:
    return [own["lr"], own["lr"] * 5]


@dataclass(frozen=True)
class Knob:
    """One searchable key: ``key`` (dotted; ``model.kwargs.X`` for a model argument), ``applies(config, found)``
    (False where the user set it or it means nothing to the model), ``values(config, found, own)`` (the default
    first; ``own``: the model's own training settings, :func:`medattn.train.defaults.training_defaults`) and ``why``
    (what the docs and ``medattn plan --search`` say). ``alone``: each value after the default makes one candidate
    of its own, every other knob at its default, instead of multiplying the grid (a switch worth one trial, not a
    doubling of every candidate), and only while the candidates stay within :data:`MAX_CANDIDATES`. ``simpler``
    (with ``alone``): its candidates are the simpler model, kept where the best validation score beats theirs by no
    more than its standard error (the one-standard-error rule, :func:`medattn.experiments.recipe.choose_recipe`),
    and where no candidate learns."""

    key: str
    applies: Callable[[dict, dict], bool]
    values: Callable[[dict, dict], list]
    why: str
    alone: bool = False
    simpler: bool = False


KNOBS = (
    Knob("model.kwargs.readout", pooling_readout, readouts,
         "which question the bag readout answers: presence (max, attention), proportion (mean) or count"),
    Knob("model.kwargs.pooled_features", pooled_features_unset, _off_then_on,
         "the bag model started as the independent model on pooled features (mean and maximum of each feature, "
         "fitted before training), which a hot spot in a few tiles of hand-made descriptors favours and a diffuse "
         "finding does not; the simpler model, kept within one standard error of the best and where no candidate "
         "learns", alone=True, simpler=True),
    Knob("train.lr", _rate_unset, _learning_rates,
         "the model's own learning rate and 5 times it, for bag models without a readout to choose: a rate that "
         "learns on one feature distribution can sit flat on another"),
)


@dataclass(frozen=True)
class Candidate:
    """A configuration the search may train: ``name`` (``readout=mean,lr=0.001``) and its ``overrides``
    (dotted key -> value); ``simpler``: made by a :attr:`Knob.simpler` knob (kept within one standard error of the
    best validation score, and where no candidate learns)."""

    name: str
    overrides: dict
    simpler: bool = False


@dataclass
class SearchPlan:
    """What the search will do: ``candidates`` (the defaults first), ``rounds`` (epochs per trial in each round: a
    candidate's run, or each of its fold runs), ``epochs`` (E, the planned single run), ``budget``; ``skip`` the
    reason it will not run (None: it runs); ``folds`` K of the inner cross-validation (0: the validation split
    chooses) and ``by`` what chooses, in words."""

    candidates: list[Candidate]
    rounds: list[int]
    epochs: int
    budget: float
    skip: str | None = None
    knobs: list[str] = field(default_factory=list)
    folds: int = 0
    by: str = "the validation split"

    @property
    def trial_epochs(self) -> int:
        """Training-split epochs the trials take in all: every round's candidates times their epochs; a candidate's K
        fold trials each train on (K - 1) / K of the cases, K - 1 epochs' worth per epoch."""
        alive, total, worth = len(self.candidates), 0, max(1, self.folds - 1)
        for epochs in self.rounds:
            total += alive * epochs * worth
            alive = max(1, math.ceil(alive / ETA))
        return total


def _short(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def candidates(config: dict, found: dict, own: dict) -> tuple[list[Candidate], list[str]]:
    """-> (the candidates for the knobs that apply, the dotted keys searched). One candidate (the defaults) when no
    knob applies. ``own``: the model's own training settings."""
    knobs = [knob for knob in KNOBS if knob.applies(config, found)]
    crossed = [knob for knob in knobs if not knob.alone]
    grid = [{knob.key: value for knob, value in zip(crossed, values)}
            for values in itertools.product(*[knob.values(config, found, own) for knob in crossed])]
    for knob in [knob for knob in knobs if knob.alone]:
        extra = [{**grid[0], knob.key: value} for value in knob.values(config, found, own)[1:]]
        if len(grid) + len(extra) > MAX_CANDIDATES:
            knobs.remove(knob)
            continue
        grid += extra
    made = [Candidate(_name(overrides), overrides, any(knob.simpler and knob.key in overrides for knob in knobs))
            for overrides in grid]
    return made, [knob.key for knob in knobs]


def _name(overrides: dict) -> str:
    """``readout=max,lr=0.001`` (``defaults`` for none)."""
    return ",".join(f"{_short(k)}={v:g}" if isinstance(v, float) else f"{_short(k)}={v}"
                    for k, v in overrides.items()) or "defaults"


def halving_rounds(n: int, epochs: int, budget: float) -> list[int]:
    """Epochs per candidate in each successive-halving round for ``n`` candidates, when the trials may take
    ``(budget - 1) * epochs`` epochs in all: ``ceil(log_ETA n)`` rounds with equal shares (at least one epoch)."""
    if n <= 1:
        return []
    rounds = math.ceil(math.log(n, ETA) - 1e-9)
    share, alive, out = (budget - 1) * epochs / rounds, n, []
    for _ in range(rounds):
        out.append(max(1, int(share // alive)))
        alive = max(1, math.ceil(alive / ETA))
    return out


def search_plan(config: dict, found: dict, planned_epochs: int, own: dict) -> SearchPlan:
    """The search a run of ``config`` on data with fingerprint ``found`` gets (``recipe.search``, module docstring).
    ``planned_epochs``: E, the single run's epochs after the plan; ``own``: the model's own training settings."""
    recipe = config["recipe"]
    found_candidates, keys = candidates(config, found, own)
    n_train, n_val = found["cases"]["train"], found["cases"]["val"]
    rounds = halving_rounds(len(found_candidates), planned_epochs, recipe["budget"])
    plan = SearchPlan(found_candidates, rounds, planned_epochs, recipe["budget"], knobs=keys,
                      by=f"the validation split ({n_val} cases)")
    if n_val < AUTO_MIN_VAL:
        plan.folds, plan.rounds = INNER_FOLDS, [epochs // (INNER_FOLDS - 1) for epochs in rounds]
        plan.by = (f"inner {INNER_FOLDS}-fold cross-validation by patient on the training split (validation split "
                   f"of {n_val} cases < {AUTO_MIN_VAL})")
    if recipe["search"] is False:
        plan.skip = "recipe.search is false"
    elif len(found_candidates) < 2:
        plan.skip = f"nothing to search for {config['model']['name']} (every searchable key is set or does not apply)"
    elif 0 in plan.rounds or plan.trial_epochs > (recipe["budget"] - 1) * planned_epochs:
        per = f"fold trial of inner {plan.folds}-fold cross-validation" if plan.folds else "candidate and round"
        plan.skip = (f"recipe.budget {recipe['budget']:g} of {planned_epochs}-epoch runs leaves less than an epoch "
                     f"per {per}")
    elif recipe["search"] == "auto" and n_train < AUTO_MIN_TRAIN:
        plan.skip = (f"{n_train} training and {n_val} validation cases (auto searches from {AUTO_MIN_TRAIN} training "
                     f"cases); recipe.search=true forces it")
    return plan


def describe_search(plan: SearchPlan) -> str:
    """The search as ``medattn plan --search`` and the start of a run print it."""
    if plan.skip:
        return f"recipe: the defaults, no search ({plan.skip})"
    cost = (plan.trial_epochs + plan.epochs) / plan.epochs
    per, whole = ((f"fold trial ({plan.folds} per candidate, each epoch on {plan.folds - 1}/{plan.folds} of the "
                   f"training cases)", " (of the whole training split)") if plan.folds else ("candidate", ""))
    lines = [f"recipe: search over {', '.join(plan.knobs)}: {len(plan.candidates)} candidates, successive halving "
             f"in {len(plan.rounds)} round(s) of {', '.join(map(str, plan.rounds))} epochs per {per}, chosen by "
             f"{plan.by}; {plan.trial_epochs} trial epochs{whole} + the final {plan.epochs} = {cost:.2f} single "
             f"runs (budget {plan.budget:g})"]
    lines += [f"  {i}. {c.name}" + ("  (the defaults)" if i == 1 else "")
              + ("  (the simpler model: kept within one standard error of the best, and where no candidate learns)"
                 if c.simpler else "")
              for i, c in enumerate(plan.candidates, 1)]
    return "\n".join(lines)
