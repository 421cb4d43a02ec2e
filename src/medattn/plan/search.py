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
* **when** (``recipe.search``): ``true``, ``false``, or ``auto`` (the default): on where a knob applies and the splits
  can choose (at least :data:`AUTO_MIN_TRAIN` training and :data:`AUTO_MIN_VAL` validation cases; a validation score
  of fewer cases chooses noise), else off with the reason printed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from medattn.vocabulary import task_types

AUTO_MIN_TRAIN, AUTO_MIN_VAL = 100, 40
ETA = 2  # successive halving keeps 1 / ETA of the candidates each round


def _is_bag_model(config: dict, found: dict) -> bool:
    from medattn.data import input_kinds

    return input_kinds.of(found["input_kind"]).instances


def pooling_readout(config: dict, found: dict) -> bool:
    """Whether the run's model is a bag model whose preset reads the bag by pooling its tiles (``vitwsi_small``) and
    whose config sets no readout: the paper's ``vitwsi`` keeps its class token unless the user asks otherwise."""
    from medattn.catalogue import PRESETS

    preset = PRESETS.get(config["model"]["name"], (None, {}))[1]
    return (_is_bag_model(config, found) and preset.get("readout", "cls") != "cls"
            and "readout" not in (config["model"].get("kwargs") or {}))


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


def _learning_rates(config: dict, found: dict, own: dict) -> list:
    return [own["lr"], own["lr"] * 5]


@dataclass(frozen=True)
class Knob:
    """One searchable key: ``key`` (dotted; ``model.kwargs.X`` for a model argument), ``applies(config, found)``
    (False where the user set it or it means nothing to the model), ``values(config, found, own)`` (the default
    first; ``own``: the model's own training settings, :func:`medattn.train.defaults.training_defaults`) and ``why``
    (what the docs and ``medattn plan --search`` say)."""

    key: str
    applies: Callable[[dict, dict], bool]
    values: Callable[[dict, dict], list]
    why: str


KNOBS = (
    Knob("model.kwargs.readout", pooling_readout, readouts,
         "which question the bag readout answers: presence (max, attention), proportion (mean) or count"),
    Knob("train.lr", _rate_unset, _learning_rates,
         "the model's own learning rate and 5 times it, for bag models without a readout to choose: a rate that "
         "learns on one feature distribution can sit flat on another"),
)


@dataclass(frozen=True)
class Candidate:
    """A configuration the search may train: ``name`` (``readout=mean,lr=0.001``) and its ``overrides``
    (dotted key -> value)."""

    name: str
    overrides: dict


@dataclass
class SearchPlan:
    """What the search will do: ``candidates`` (the defaults first), ``rounds`` (epochs per candidate in each round),
    ``epochs`` (E, the planned single run), ``budget``; ``skip`` the reason it will not run (None: it runs)."""

    candidates: list[Candidate]
    rounds: list[int]
    epochs: int
    budget: float
    skip: str | None = None
    knobs: list[str] = field(default_factory=list)

    @property
    def trial_epochs(self) -> int:
        """Epochs the trials take in all (every round's candidates times their epochs)."""
        alive, total = len(self.candidates), 0
        for epochs in self.rounds:
            total += alive * epochs
            alive = max(1, math.ceil(alive / ETA))
        return total


def _short(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def candidates(config: dict, found: dict, own: dict) -> tuple[list[Candidate], list[str]]:
    """-> (the candidates for the knobs that apply, the dotted keys searched). One candidate (the defaults) when no
    knob applies. ``own``: the model's own training settings."""
    knobs = [knob for knob in KNOBS if knob.applies(config, found)]
    grid = itertools.product(*[knob.values(config, found, own) for knob in knobs])
    out = []
    for values in grid:
        overrides = {knob.key: value for knob, value in zip(knobs, values)}
        name = ",".join(f"{_short(k)}={v:g}" if isinstance(v, float) else f"{_short(k)}={v}"
                        for k, v in overrides.items())
        out.append(Candidate(name or "defaults", overrides))
    return out, [knob.key for knob in knobs]


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
    plan = SearchPlan(found_candidates, halving_rounds(len(found_candidates), planned_epochs, recipe["budget"]),
                      planned_epochs, recipe["budget"], knobs=keys)
    n_train, n_val = found["cases"]["train"], found["cases"]["val"]
    if recipe["search"] is False:
        plan.skip = "recipe.search is false"
    elif len(found_candidates) < 2:
        plan.skip = f"nothing to search for {config['model']['name']} (every searchable key is set or does not apply)"
    elif plan.trial_epochs > (recipe["budget"] - 1) * planned_epochs:
        plan.skip = (f"recipe.budget {recipe['budget']:g} of {planned_epochs}-epoch runs leaves less than an epoch "
                     f"per candidate and round")
    elif recipe["search"] == "auto" and (n_train < AUTO_MIN_TRAIN or n_val < AUTO_MIN_VAL):
        plan.skip = (f"{n_train} training and {n_val} validation cases (auto searches from {AUTO_MIN_TRAIN} and "
                     f"{AUTO_MIN_VAL}: fewer validation cases choose noise); recipe.search=true forces it")
    return plan


def describe_search(plan: SearchPlan) -> str:
    """The search as ``medattn plan --search`` and the start of a run print it."""
    if plan.skip:
        return f"recipe: the defaults, no search ({plan.skip})"
    cost = (plan.trial_epochs + plan.epochs) / plan.epochs
    lines = [f"recipe: search over {', '.join(plan.knobs)}: {len(plan.candidates)} candidates, successive halving "
             f"in {len(plan.rounds)} round(s) of {', '.join(map(str, plan.rounds))} epochs per candidate; "
             f"{plan.trial_epochs} trial epochs + the final {plan.epochs} = {cost:.2f} single runs "
             f"(budget {plan.budget:g})"]
    lines += [f"  {i}. {c.name}" + ("  (the defaults)" if i == 1 else "") for i, c in enumerate(plan.candidates, 1)]
    return "\n".join(lines)
