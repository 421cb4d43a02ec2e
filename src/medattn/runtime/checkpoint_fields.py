"""The fields of ``checkpoint.json`` besides ``config``, ``task``, ``model_defaults`` and ``features`` (checked by
:func:`medattn.runtime.checkpoint.check_meta`): each is checked here, so a hand-edited or damaged file is one
UserError line naming the field, never a traceback where it is used.

* ``epoch``: the epoch the weights are from, an integer >= 0;
* ``val_<metric>``: the validation score of that epoch (``val_auroc``, ``val_dice``, ...), a number or null;
* ``threshold``: the validation thresholds (:mod:`medattn.runtime.threshold`), one number in [0, 1] or null per output;
* ``preprocessing``: how the training data were prepared, a mapping (its fields are checked where it is read,
  :func:`medattn.data.preprocessing.from_checkpoint_meta`);
* ``pretrained``: written by ``medattn pretrain`` (:mod:`medattn.pretrain.loop`): ``objective`` (text),
  ``train_cases`` and ``pool_cases`` (integers >= 0), ``pool`` (a path or null) and ``pool_held_out`` (an integer
  >= 0: pool files left out because the config's validation or test split holds them);
* ``before_training``: what a supervised run did to its model before the first epoch
  (:data:`medattn.train.supervised.BEFORE_TRAINING`: ``--init-from``, the bag models' feature standardisation and
  pooled-feature path), each a mapping or null; a resumed run reads it back for results.json instead of doing it
  again.

Other keys are read by nothing and passed over (a later medattn may add some).
"""

from __future__ import annotations

import re

from medattn.errors import UserError

#: Keys :func:`medattn.runtime.checkpoint.check_meta` checks itself.
CHECKED_ELSEWHERE = ("config", "task", "model_defaults", "features")
VALIDATION_SCORE = re.compile(r"^val_[a-z0-9_]+$")
PRETRAINED_COUNTS = ("train_cases", "pool_cases", "pool_held_out")


def check_fields(meta: dict, source: str) -> None:
    """A one-line UserError naming ``source`` and the first field of ``meta`` (checkpoint.json) that is invalid
    (see the module docstring); ``meta["task"]`` is already checked."""
    for key, value in meta.items():
        if key in CHECKED_ELSEWHERE:
            continue
        if key == "epoch":
            ok = _count(value)
        elif VALIDATION_SCORE.match(key):
            ok = value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))
        elif key == "threshold":
            ok = value is None or isinstance(value, dict)
            if ok and value is not None:
                from .threshold import checked_thresholds

                checked_thresholds(value.get("values"), meta["task"]["num_outputs"], f"{source}: threshold.values")
        elif key == "preprocessing":  # its fields are checked where it is used (load_checkpoint)
            ok = isinstance(value, dict)
        elif key == "pretrained":
            ok = _pretrained(value)
        elif key == "before_training":
            ok = isinstance(value, dict) and all(part is None or isinstance(part, dict) for part in value.values())
        else:  # read by nothing (a later medattn's addition): passed over
            continue
        if not ok:
            raise UserError(f"{source}: {key} is invalid (got {_shown(value)}); {_wanted(key)}: the file was edited or "
                            f"damaged")


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _pretrained(value) -> bool:
    """What ``medattn pretrain`` records: a mapping with its objective, counts and pool (see the module docstring)."""
    if not isinstance(value, dict) or not isinstance(value.get("objective"), str) or not value["objective"].strip():
        return False
    if set(value) - {"objective", "pool", *PRETRAINED_COUNTS}:
        return False
    counts = all(_count(value.get(key, 0)) for key in PRETRAINED_COUNTS)
    return counts and (value.get("pool") is None or isinstance(value["pool"], str))


def _wanted(key: str) -> str:
    """What ``key`` must hold, in words."""
    if key == "pretrained":
        return ("pretrained must be a mapping with objective (text), train_cases, pool_cases and pool_held_out "
                "(integers >= 0) and pool (a path or null)")
    if key == "epoch":
        return "epoch must be an integer >= 0"
    if key == "before_training":
        return "before_training must be a mapping of mappings or nulls"
    if key == "threshold":
        return "threshold must be a mapping with values"
    if key == "preprocessing":
        return "preprocessing must be a mapping"
    return f"{key} must be a number or null"


def _shown(value) -> str:
    """``value`` as the message shows it: its repr, cut to 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
