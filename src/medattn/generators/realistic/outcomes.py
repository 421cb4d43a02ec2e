"""SYNTHETIC outcomes of the burden tasks: each patient's share of hot-spot tiles (``ihc_survival``,
``ihc_regression``, planted in the bag by :func:`.ihc.ihc_bag`) or number of lesion tiles (``retina_count``,
``retina_survival``, :func:`.retina.retina_bag`) drives a survival time, a biomarker level or is the target itself.

* **burden** ``s``: 0 (no hot spot) in a share ``ZERO_BURDEN`` of the patients, else U(0, ``S_MAX``), ``S_MAX``
  the upper end of :data:`.ihc.TUMOUR_SHARE`;
* **survival** (:func:`survival`): Weibull proportional hazards, h(t | s) = h0(t) exp(``BETA`` s / ``S_MAX``) with
  h0 of shape ``WEIBULL_SHAPE`` and scale ``WEIBULL_SCALE`` months, drawn as T = scale (E exp(-BETA s / S_MAX))^(1 /
  shape), E ~ Exp(1); censored at the earlier of the administrative end of follow-up (U ``FOLLOW_UP`` months:
  patients enrolled over six years and followed until two years after the last) and a loss to follow-up
  (exponential, mean ``LOSS_MEAN`` months), which leaves about a third of the patients censored. ``BETA`` was
  chosen so that the true burden alone reaches a C-index of about 0.77 (200 cohorts of 300 patients, the
  task's random streams of seeds 0-199: 0.767, SD 0.018; censored 34%, SD 3%);
* **counts** (:func:`counts`): 0 lesion tiles in a share ``ZERO_BURDEN`` of the patients, else 1..``MAX_COUNT``;
  the count task's target is the count itself, the count-driven survival (:func:`count_survival`) reads the count
  as the burden ``s = S_MAX c / MAX_COUNT``, so the same hazard model and the same true-burden C-index hold;
* **regression** (:func:`biomarker`): ``dab_score`` = 5 + 100 s + N(0, ``SCORE_NOISE``), clipped at 0 (an H-score
  like level with a background; the true burden explains 83% of its variance, SD 2% over those cohorts).

Times are months; the tables hold them to two decimals.
"""

from __future__ import annotations

import numpy as np

from medattn.vocabulary import task_types
from medattn.vocabulary.task_types import Regression, Survival

from .ihc import TUMOUR_SHARE

ZERO_BURDEN = 0.25
S_MAX = TUMOUR_SHARE[1]
BETA = 3.5  # hazard ratio exp(3.5) = 33 between the highest burden and none
WEIBULL_SHAPE = 1.5
WEIBULL_SCALE = 80.0  # months: a median survival of 63 months without a hot spot
FOLLOW_UP = (24.0, 96.0)
LOSS_MEAN = 150.0
SCORE_NOISE = 1.5
TIME_COLUMN, EVENT_COLUMN, SCORE_COLUMN = "os_months", "os_event", "dab_score"
COUNT_COLUMN = "lesion_tiles"
MAX_COUNT = 60


def burdens(n: int, rng: np.random.Generator) -> np.ndarray:
    """(n,) shares of hot-spot tiles: 0 in about ``ZERO_BURDEN`` of the patients, else U(0, ``S_MAX``)."""
    return np.where(rng.random(n) < ZERO_BURDEN, 0.0, rng.uniform(0, S_MAX, n))


def counts(n: int, rng: np.random.Generator) -> np.ndarray:
    """(n,) numbers of lesion tiles (the count task's target): 0 in about ``ZERO_BURDEN`` of the patients, else
    uniform on 1..``MAX_COUNT``, drawn whatever the bag's size (so the bag size does not tell the count)."""
    return np.where(rng.random(n) < ZERO_BURDEN, 0, rng.integers(1, MAX_COUNT + 1, n))


def survival(burden: np.ndarray, rng: np.random.Generator) -> dict[str, list]:
    """The survival columns of patients with burdens ``burden``: follow-up in months (the event's time or the
    censoring time, two decimals) and the event flag (1 event, 0 censored)."""
    n = len(burden)
    event_time = WEIBULL_SCALE * (rng.exponential(1.0, n) * np.exp(-BETA * burden / S_MAX)) ** (1 / WEIBULL_SHAPE)
    censor_time = np.minimum(rng.uniform(*FOLLOW_UP, n), rng.exponential(LOSS_MEAN, n))
    time = np.round(np.minimum(event_time, censor_time), 2)
    return {TIME_COLUMN: time.tolist(), EVENT_COLUMN: (event_time <= censor_time).astype(int).tolist()}


def biomarker(burden: np.ndarray, rng: np.random.Generator) -> dict[str, list]:
    """The regression column of patients with burdens ``burden``: their ``dab_score`` (two decimals)."""
    score = np.clip(5 + 100 * burden + rng.normal(0, SCORE_NOISE, len(burden)), 0, None)
    return {SCORE_COLUMN: np.round(score, 2).tolist()}


def count_survival(count: np.ndarray, rng: np.random.Generator) -> dict[str, list]:
    """The survival columns of patients with ``count`` lesion tiles: :func:`survival` of the burden
    ``S_MAX count / MAX_COUNT``."""
    return survival(S_MAX * np.asarray(count, np.float64) / MAX_COUNT, rng)


def count_target(count: np.ndarray, rng: np.random.Generator) -> dict[str, list]:
    """The count task's column: each patient's number of lesion tiles itself (``rng`` unused)."""
    return {COUNT_COLUMN: [int(c) for c in count]}


#: task type (its class, :mod:`medattn.vocabulary.task_types`) -> the columns of its outcome, from the burdens (shares)
#: and the task's random stream.
OUTCOMES = {Survival: survival, Regression: biomarker}
#: the same from the numbers of lesion tiles (the ``count`` bag tasks).
COUNT_OUTCOMES = {Survival: count_survival, Regression: count_target}


def score(task_type: str, values: np.ndarray, columns: dict[str, list]) -> float | None:
    """How well one number per patient (``values``, either direction) tells the outcome: survival, the C-index
    folded at 0.5 (max(C, 1 - C)); regression, |Pearson r| with the score. None where it is undefined (a few
    patients: no comparable pair, a constant)."""
    from medattn.metrics import UndefinedMetricError
    from medattn.metrics_regression import pearson_r
    from medattn.metrics_survival import concordance_index

    try:
        if task_types.of(task_type).events:
            c = concordance_index(values, columns[TIME_COLUMN], np.asarray(columns[EVENT_COLUMN], bool))
            return float(max(c, 1 - c))
        return float(abs(pearson_r(values, columns[SCORE_COLUMN if SCORE_COLUMN in columns else COUNT_COLUMN])))
    except UndefinedMetricError:
        return None
