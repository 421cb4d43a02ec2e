"""The training plan: values for the keys a config leaves null, derived from the data's fingerprint, each with its
reason, so a user with 180 cases and a user with 18,000 get a run of the length their data needs.

Rules (each measured on the realistic benchmark, docs/realistic.md, "The plan"):

* ``train.epochs`` (null): enough epochs for ``TARGET_STEPS`` optimizer steps of the model's family at the
  config's batch size, within [``MIN_EPOCHS``, ``MAX_EPOCHS``]. A ViT trained from scratch on a few hundred images
  needs several times the steps a CNN does: at 30 epochs (360 steps, 180 slices, batch 16) SeqNorm's train loss
  stayed near a constant predictor's. **Survival bags count as steps**: a survival (or competing-risks) bag
  model runs the B bags of a batch one at a time (:func:`medattn.train.survival_bags.forward_each`), so a batch
  costs B single-bag steps and its epochs are planned as at batch 1 (180 training bags: 20 epochs, not the 150 a
  batch of 16 would get). Padded batches of other bag tasks keep the optimizer-step rule. On ``retina_survival``
  SeqNorm's validation C-index came within 0.02 of its 30-epoch best by epoch 3-7 with every loss; attention-MIL's
  Cox loss at its own rate needed 18-26 epochs, at 5 times the rate (a recipe candidate) it learns within 20
  (docs/survival_bags.md). 150 epochs cost 7 times the time of 20.
* survival, every split: a split with fewer than ``MIN_EVENTS`` events or ``MIN_PAIRS`` comparable pairs cannot
  measure a C-index (none without a pair; few pairs make it move in steps of 1 / (2 pairs), so 2 validation patients
  read 1.000 at every epoch): a note (docs/survival.md, "The plan").
* bags, ``data.max_instances``: not planned (null = whole bags) but checked: a limit below the largest training bag
  is reported with the share of a bag it keeps, since a finding in 2% of the tiles can then be missed in an epoch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from medattn.data import input_kinds
from medattn.vocabulary import task_types

from .fingerprint import EVENTS
from .search import pooling_readout, readouts

#: optimizer steps a run should take, by model family
TARGET_STEPS = {"transformer": 1800, "other": 600}
MIN_EPOCHS, MAX_EPOCHS = 20, 300
#: A survival split with fewer events or comparable pairs than these cannot measure a C-index (docs/survival.md).
MIN_EVENTS, MIN_PAIRS = 10, 100
SPLIT_KEYS = {"train": "data.val_fraction", "val": "data.val_fraction", "test": "data.test_fraction"}
SPLIT_NAMES = {"train": "training", "val": "validation", "test": "test"}
FAMILY_TEXT = {"transformer": "a transformer", "other": "a model without attention"}


@dataclass(frozen=True)
class Decision:
    """One planned value: ``key`` (dotted), ``value``, ``reason``; ``applied`` False for a note on a value the
    config set (the plan never overrides the user)."""

    key: str
    value: object
    reason: str
    applied: bool = True


def family(model_cfg: dict) -> str:
    """``transformer`` for a model with attention (ViTs, Swin, bag transformers), else ``other``."""
    from medattn.models import is_transformer

    return "transformer" if is_transformer(model_cfg["name"]) else "other"


def plan(config: dict, found: dict) -> list[Decision]:
    """The decisions for ``config`` on data with fingerprint ``found`` (:func:`~.fingerprint.fingerprint`)."""
    decisions = []
    train, cases = config["train"], found["cases"]["train"]
    bags = input_kinds.of(found["input_kind"]).instances and task_types.of(found["task_type"]).events
    per_step = 1 if bags else train["batch_size"] * train["grad_accum"]
    steps_per_epoch = max(1, math.ceil(cases / per_step))
    kind = family(config["model"])
    if train["epochs"] is None:
        target = TARGET_STEPS[kind]
        epochs = min(MAX_EPOCHS, max(MIN_EPOCHS, math.ceil(target / steps_per_epoch)))
        how = (f"{cases} training bags, each a step whatever the batch (survival runs a batch's bags one at a "
               f"time)" if bags else f"{cases} training cases / batch {per_step}")
        decisions.append(Decision("train.epochs", epochs, f"{target} optimizer steps for {FAMILY_TEXT[kind]}: {how} "
                                  f"= {steps_per_epoch} steps per epoch (bounded to {MIN_EPOCHS}-{MAX_EPOCHS} "
                                  f"epochs)"))
    if pooling_readout(config, found):
        readout = readouts(config, found)[0]
        decisions.append(Decision("model.kwargs.readout", readout, f"a {found['task_type']} task asks "
                                  f"{task_types.of(found['task_type']).question}: the "
                                  f"{readout} readout answers it (docs/decisions.md, 'Bag readout')"))
    decisions += survival_notes(config, found)
    if input_kinds.of(found["input_kind"]).instances:
        largest, limit = found["bag_sizes"]["max"], config["data"].get("max_instances")
        if limit is not None and limit < largest:
            decisions.append(Decision("data.max_instances", limit, f"keeps {limit} of up to {largest} instances per "
                                      f"bag and epoch ({limit / largest:.0%} of the largest): a finding in a few "
                                      f"tiles can be left out of an epoch; null trains on whole bags", False))
        elif limit is None:
            decisions.append(Decision("data.max_instances", None, f"whole bags: the largest training bag holds "
                                      f"{largest} instances", False))
    return decisions


def survival_notes(config: dict, found: dict) -> list[Decision]:
    """A note for each split of a survival task too small to measure a C-index: fewer than :data:`MIN_EVENTS`
    events or :data:`MIN_PAIRS` comparable pairs (the C-index moves in steps of ``1 / (2 pairs)``)."""
    notes = []
    for split, counts in found.get(EVENTS, {}).items():
        if counts["cases"] == 0 or (counts["events"] >= MIN_EVENTS and counts["pairs"] >= MIN_PAIRS):
            continue
        pairs = counts["pairs"]
        effect = ("no C-index can be measured on it" if pairs == 0 else
                  f"its C-index moves in steps of {1 / (2 * pairs):.3g} and can read 1.000 by chance")
        picks = ", and it picks the kept epoch" if split == "val" else ""
        key = SPLIT_KEYS[split]
        notes.append(Decision(key, config["data"].get(key.split(".")[1]), f"WARNING: the {SPLIT_NAMES[split]} split "
                              f"holds {counts['cases']} cases, {_events(counts['events'])}, {pairs} comparable "
                              f"pair{'' if pairs == 1 else 's'} (fewer than {MIN_EVENTS} events or {MIN_PAIRS} "
                              f"pairs): {effect}{picks}; give it more cases", False))
    return notes


def _events(count: int) -> str:
    return f"{count} event" if count == 1 else f"{count} events"


def _by_cause(counts: dict) -> str:
    """`` (cancer 12, other 8)``: the events per cause of a competing-risks split, else nothing."""
    by_cause = counts.get("by_cause")
    return f" ({', '.join(f'{name} {n}' for name, n in by_cause.items())})" if by_cause else ""


def apply(config: dict, decisions: list[Decision]) -> dict:
    """A copy of ``config`` with every applied decision's value set."""
    import copy

    planned = copy.deepcopy(config)
    for decision in decisions:
        if decision.applied:
            set_key(planned, decision.key, decision.value)
    return planned


def set_key(config: dict, key: str, value) -> None:
    """Set the dotted ``key`` (``model.kwargs.readout``) of ``config`` in place, making a section that is absent or
    null (``model.kwargs``)."""
    *sections, leaf = key.split(".")
    node = config
    for section in sections:
        if node.get(section) is None:
            node[section] = {}
        node = node[section]
    node[leaf] = value


def as_records(decisions: list[Decision]) -> list[dict]:
    return [asdict(d) for d in decisions]


def describe(found: dict, decisions: list[Decision]) -> str:
    """The fingerprint and the plan as ``medattn plan`` prints them."""
    lines = ["fingerprint:"]
    lines += [f"  {key}: {value}" for key, value in found.items() if key != EVENTS]
    lines += [f"  survival {split}: {c['cases']} cases, {_events(c['events'])}{_by_cause(c)}, {c['censored']} "
              f"censored, {c['pairs']} comparable pair{'' if c['pairs'] == 1 else 's'}"
              for split, c in found.get(EVENTS, {}).items()]
    lines.append("plan (keys the config leaves null; notes on values it sets):")
    lines += [f"  {d.key} = {d.value}{'' if d.applied else '  [as configured]'}: {d.reason}" for d in decisions]
    if not decisions:
        lines.append("  nothing to plan: the config sets every planned key")
    return "\n".join(lines)
