"""The one list of config keys (:data:`KEYS`): each key's default, the rule its value must follow and its meaning;
:data:`DEFAULTS` (the nested default config) and :data:`SCHEMA` (what :func:`medattn.config.validate` checks) are
derived from it."""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from medattn.catalogue import DIFFUSION_STAGES, TRAINING_TASKS


@dataclass(frozen=True)
class Rule:
    """What one config key may hold: ``wants`` describes it in the error, ``test`` checks a value."""

    wants: str
    test: Callable[[object], bool]


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integer(low: int, high: int, optional: bool = False) -> Rule:
    return Rule(f"an integer from {low} to {high}" + (" or null" if optional else ""),
                lambda v: (optional and v is None) or (_is_int(v) and low <= v <= high))


def _number(low: float, low_open: bool = False, optional: bool = False) -> Rule:
    bound = f"> {low}" if low_open else f">= {low}"
    return Rule(f"a finite number {bound}" + (" or null" if optional else ""),
                lambda v: (optional and v is None) or (_is_number(v) and (v > low if low_open else v >= low)))


def _text(optional: bool = False) -> Rule:
    return Rule("a non-empty string" + (" or null" if optional else ""),
                lambda v: (optional and v is None) or (isinstance(v, str) and bool(v)))


MAPPING = Rule("a mapping of keys to values", lambda v: isinstance(v, dict))
PRECISIONS = ("fp32", "bf16")
DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d+)?")

REQUIRED = object()  # the default of a key every config must set (data.kind)


@dataclass(frozen=True)
class Key:
    """One config key: its default (:data:`REQUIRED`: none, the config must set it), what it may hold, and what
    it means (the line ``docs/training.md`` and the error messages read)."""

    default: object
    rule: Rule
    help: str = ""


def _choice(*values) -> Rule:
    shown = [("null" if v is None else str(v)) for v in values]
    return Rule(", ".join(shown[:-1]) + f" or {shown[-1]}", lambda v: v in values)


BOOLEAN = Rule("true or false", lambda v: isinstance(v, bool))

#: The values of ``task`` that train a diffusion stage (docs/diffusion.md); the others' configs hold no ``diffusion``.
#: From the one list of training tasks, :data:`medattn.catalogue.TRAINING_TASKS`.
DIFFUSION_TASKS = tuple(DIFFUSION_STAGES)

#: The one list of config keys: default, rule and meaning. A section (``train``) is a mapping of its keys;
#: ``data`` and ``model.kwargs`` are free-form mappings (their keys belong to the data builder and the model).
KEYS: dict[str, Key] = {
    "name": Key("run", _text()),
    "seed": Key(0, _integer(0, 2**32 - 1)),
    "out": Key(None, _text(optional=True), "run folder; null -> runs/<name>"),
    "data": Key({}, MAPPING, "free-form: the data builder's options; kind picks the data set"),
    "data.kind": Key(REQUIRED, Rule("the name of a data kind (e.g. data.kind=synthetic_cxr)",
                                    lambda v: isinstance(v, str) and bool(v))),
    "model.name": Key("vit2d_small", _text()),
    "model.attention": Key("softmax", _text(optional=True)),
    "model.kwargs": Key({}, MAPPING, "free-form: create_model keyword arguments (e.g. attention_kwargs, drop_rate)"),
    "train.epochs": Key(None, _integer(1, 1_000_000, optional=True),
                        "null -> planned from the data: enough epochs for the model's steps (medattn plan CONFIG)"),
    "train.batch_size": Key(32, _integer(1, 1 << 20)),
    "train.eval_batch_size": Key(None, _integer(1, 1 << 20, optional=True), "null -> batch_size"),
    "train.lr": Key(None, _number(0, low_open=True, optional=True),
                    "null -> the model's own (medattn.train.defaults: 1e-4; attention-MIL 2e-4, CPU presets 5e-4)"),
    "train.min_lr": Key(1e-6, _number(0)),
    "train.weight_decay": Key(None, _number(0, optional=True), "null -> the model's own (0.05; attention-MIL 1e-5)"),
    "train.betas": Key([0.9, 0.999], Rule("two numbers in [0, 1), e.g. [0.9, 0.999]",
                                          lambda v: isinstance(v, (list, tuple)) and len(v) == 2
                                          and all(_is_number(b) and 0 <= b < 1 for b in v))),
    "train.warmup_epochs": Key(None, _number(0, optional=True),
                               "linear warm-up length, in epochs (fractions allowed); null -> the model's own"),
    "train.optimizer": Key(None, _choice("adamw", "adam", None),
                           "adamw | adam (weight decay as L2 in the gradient); null -> the model's own"),
    "train.schedule": Key(None, _choice("cosine", "step", "constant", None),
                          "after the warm-up: cosine (to min_lr) | step | constant; null -> the model's own"),
    "train.step_milestones": Key([0.5, 0.75], Rule(
        "a list of increasing numbers in (0, 1] (fractions of the total steps)",
        lambda v: isinstance(v, list) and all(_is_number(m) and 0 < m <= 1 for m in v) and list(v) == sorted(v)),
        "step schedule: fractions of the total steps where lr *= step_gamma"),
    "train.step_gamma": Key(0.1, Rule("a number in (0, 1]", lambda v: _is_number(v) and 0 < v <= 1)),
    "train.grad_clip": Key(None, _number(0, optional=True),
                           "max global grad norm; 0 disables clipping; null -> the model's own (1.0; MIL: 0)"),
    "train.grad_accum": Key(1, _integer(1, 1 << 20), "micro-batches per optimizer step"),
    "train.precision": Key("fp32", Rule(f"one of {', '.join(PRECISIONS)}", lambda v: v in PRECISIONS),
                           "fp32 | bf16 (autocast; fast only with bf16 hardware: AVX-512 BF16, AMX or a GPU)"),
    "train.activation_checkpointing": Key(False, BOOLEAN,
                                          "recompute each transformer block in backward: less memory, ~1/3 slower"),
    "train.compile": Key(False, BOOLEAN,
                         "torch.compile(model, fullgraph=True) for the training step (inductor; CPU: a C++ compiler)"),
    "train.num_workers": Key(0, _integer(0, 1024)),
    "train.tensorboard": Key(False, BOOLEAN, "also write each epoch's metrics.csv row as TensorBoard scalars to "
                                             "RUN/tensorboard (pip install 'medattn[tensorboard]')"),
    "train.threads": Key(None, _integer(1, 4096, optional=True),
                         "torch intra-op threads; null -> medattn.threads.default_threads (free cores)"),
    "train.device": Key("auto", Rule("auto, cpu, mps, cuda or cuda:N",
                                     lambda v: isinstance(v, str) and DEVICE_PATTERN.fullmatch(v) is not None)),
    "train.skip_bad": Key(False, BOOLEAN),
    "train.loss": Key(None, _choice(None, "dice_ce", "dice", "cox", "discrete_time"),
                      "null -> the task's (cross-entropy; segmentation: dice_ce; survival: cox); dice = soft Dice "
                      "only; discrete_time = survival's logistic-hazard likelihood (trains at batch 1)"),
    "train.time_bins": Key(4, _integer(1, 1000), "train.loss=discrete_time: intervals, edges at event-time quantiles"),
    "train.event_balance": Key(False, BOOLEAN, "survival: every batch holds the training split's share of events"),
    "train.patch_size": Key(None, Rule("null, a positive int or a list of 2 or 3 positive ints", lambda v: v is None
                                       or (_is_int(v) and v > 0) or (isinstance(v, list) and len(v) in (2, 3)
                                                                      and all(_is_int(m) and m > 0 for m in v))),
                            "segmentation: train on random patches of this size (medattn.data.kinds.patches)"),
    "train.patch_foreground": Key(None, Rule("null or a number from 0 to 1",
                                             lambda v: v is None or (_is_number(v) and 0 <= v <= 1)),
                                  "share of patches centred on a foreground voxel; null -> 1/3"),
    "train.label_smoothing": Key(0.0, Rule("a number from 0 to below 1", lambda v: _is_number(v) and 0 <= v < 1),
                                 "classification: targets y(1 - e) + e/K (binary: K = 2)"),
    "train.pos_weight": Key(None, Rule("null, a number > 0 or \"balanced\"", lambda v: v is None or v == "balanced"
                                       or (_is_number(v) and v > 0)),
                            "binary/multi-label: positive-class weight, a number or balanced (n_neg / n_pos)"),
    "train.class_balance": Key(False, BOOLEAN,
                               "draw training samples with equal total weight per class (with replacement)"),
    "train.layer_decay": Key(None, Rule("null or a number in (0, 1]",
                                        lambda v: v is None or (_is_number(v) and 0 < v <= 1)),
                             "layer-wise lr decay: block i of L gets lr * decay^(L + 1 - i); null = 1 (off)"),
    "train.ema": Key(None, Rule("null or a number in (0, 1)", lambda v: v is None or (_is_number(v) and 0 < v < 1)),
                     "decay of an exponential moving average of the weights, evaluated and checkpointed"),
    "train.instance_dropout": Key(0.0, Rule("a number from 0 to below 1", lambda v: _is_number(v) and 0 <= v < 1),
                                  "bags: fraction of each training bag's instances dropped per step"),
    "recipe.search": Key("auto", Rule("auto, true or false", lambda v: v == "auto" or isinstance(v, bool)),
                         "train a few candidates for the keys left unset and keep the best on validation: auto (on "
                         "for bag models with >= 100 training and >= 40 validation cases) | true | false "
                         "(medattn.plan.search; medattn plan --search shows them)"),
    "recipe.budget": Key(3.0, Rule("a number from 1 to 20", lambda v: _is_number(v) and 1 <= v <= 20),
                         "the search and the final run cost at most this many single runs"),
    "recipe.record": Key(None, Rule("null or a mapping", lambda v: v is None or isinstance(v, dict)),
                         "written by the search: every candidate's validation score, the choice and the budget"),
    "pretrain.epochs": Key(100, _integer(1, 1_000_000), "medattn pretrain: epochs over training split + pool"),
    "pretrain.batch_size": Key(64, _integer(1, 1 << 20)),
    "pretrain.lr": Key(1e-3, _number(0, low_open=True), "AdamW (betas 0.9, 0.95), warm-up then cosine to 1e-6"),
    "pretrain.weight_decay": Key(0.05, _number(0)),
    "pretrain.warmup_epochs": Key(5.0, _number(0)),
    "pretrain.mask_ratio": Key(0.75, Rule("a number in (0, 1)", lambda v: _is_number(v) and 0 < v < 1),
                               "share of the patches masked per image (MAE)"),
    "pretrain.decoder_dim": Key(64, _integer(1, 1 << 16), "width of MAE's light decoder"),
    "pretrain.decoder_depth": Key(1, _integer(1, 64), "blocks of MAE's light decoder"),
    "pretrain.decoder_heads": Key(4, _integer(1, 1024)),
    "pretrain.norm_pix_loss": Key(True, BOOLEAN, "reconstruct each patch standardised by its own mean and variance"),
    "pretrain.view_share": Key(0.5, Rule("a number in (0, 1)", lambda v: _is_number(v) and 0 < v < 1),
                               "bags: share of a bag's tiles in each of its two views"),
    "pretrain.view_tiles": Key(512, _integer(1, 1 << 24), "bags: the most tiles a view holds"),
    "pretrain.pool": Key(None, _text(optional=True),
                         "a CSV of unlabelled files (the data's path column) read like the training split"),
    "eval.bootstrap": Key(1000, _integer(0, 1_000_000), "resamples for the test AUROC's confidence interval"),
    "eval.heatmaps": Key(3, _integer(0, 100), "test cases whose heatmaps report.html shows, the highest-scored "
                                              "first (medattn.explain.cases; 0: none); segmentation: that many of "
                                              "the best and of the worst by Dice, their label maps"),
    "eval.times": Key(None, Rule("null or a list of positive numbers",
                                 lambda v: v is None or (isinstance(v, list) and 0 < len(v) <= 64
                                                         and all(_is_number(t) and t > 0 for t in v))),
                      "survival: times (the table's unit) of the time-dependent AUC and the Brier score; null -> "
                      "quartiles of event times"),
    "eval.risk_quantile": Key(0.5, Rule("a number between 0 and 1 (exclusive)",
                                        lambda v: _is_number(v) and 0 < v < 1),
                              "survival: the training risks' quantile that cuts the high- and low-risk groups "
                              "(docs/survival.md)"),
    "eval.ci": Key(0.95, Rule("a number between 0 and 1 (exclusive)", lambda v: _is_number(v) and 0 < v < 1)),
    "eval.sliding_window": Key(None, Rule("null, true or false", lambda v: v is None or isinstance(v, bool)),
                               "segmentation: null -> on when train.patch_size is set (medattn.runtime.sliding)"),
    "eval.window_overlap": Key(None, Rule("null or a number in [0, 1)",
                                          lambda v: v is None or (_is_number(v) and 0 <= v < 1)),
                               "overlap of neighbouring windows, in [0, 1); null -> 0.5"),
    "task": Key("supervised", _choice(*TRAINING_TASKS),
                " | ".join(TRAINING_TASKS) + " (docs/diffusion.md)"),
    "diffusion.vqae_checkpoint": Key(None, _text(optional=True),
                                     "stage 2: the stage-1 (diffusion_vqae) run folder or checkpoint"),
    "diffusion.perceptual_net": Key(None, _text(optional=True),
                                    "stage 1: a local torch.export .pt2 network for the perceptual term"),
    "diffusion.perceptual_weight": Key(0.0, _number(0), "stage 1: weight of that term (0 = off)"),
    "diffusion.gradient_weight": Key(0.0, _number(0), "stage 1: weight of the weight-free gradient-difference term"),
    "diffusion.timesteps": Key(256, _integer(1, 1_000_000), "stage 2: absorbing-diffusion steps T of the schedule"),
    "diffusion.sample_steps": Key(200, _integer(1, 1_000_000), "steps revealing the unknown tokens when sampling"),
    "diffusion.temperature": Key(0.8, _number(0, low_open=True), "sampling temperature"),
    "diffusion.mask_fraction": Key(0.5, Rule("a number in (0, 1]", lambda v: _is_number(v) and 0 < v <= 1),
                                   "centre mask: the unknown box's share of each latent axis (test inpainting)"),
}


#: Sections only the configs of some tasks hold: section -> those values of ``task``. Another task's config has
#: none of its keys (:func:`medattn.config.validate` refuses one, naming it); the section's defaults are
#: :func:`task_defaults`', not in :data:`DEFAULTS`.
TASK_SECTIONS: dict[str, tuple[str, ...]] = {"diffusion": DIFFUSION_TASKS}


def _sections(keys: dict[str, Key]) -> dict[str, Rule]:
    """Every key with its parent sections before it (a section must be a mapping)."""
    schema: dict[str, Rule] = {}
    for name, key in keys.items():
        parts = name.split(".")
        for depth in range(1, len(parts)):
            schema.setdefault(".".join(parts[:depth]), MAPPING)
        schema[name] = key.rule
    return schema


def _defaults(keys: dict[str, Key]) -> dict:
    """The nested default config of :data:`KEYS` (keys without a default left out)."""
    config: dict = {}
    for name, key in keys.items():
        *sections, leaf = name.split(".")
        node = config
        for section in sections:
            node = node.setdefault(section, {})
        if key.default is not REQUIRED:
            node[leaf] = copy.deepcopy(key.default)
    return config


_ALL_DEFAULTS: dict = _defaults(KEYS)
#: The defaults, nested as a config is (from :data:`KEYS`), without the :data:`TASK_SECTIONS`.
DEFAULTS: dict = {name: value for name, value in _ALL_DEFAULTS.items() if name not in TASK_SECTIONS}
#: section -> its defaults, for each of the :data:`TASK_SECTIONS` (from :data:`KEYS`).
SECTION_DEFAULTS: dict[str, dict] = {name: _ALL_DEFAULTS[name] for name in TASK_SECTIONS}


def task_defaults(task) -> dict:
    """The defaults of the :data:`TASK_SECTIONS` a config of ``task`` holds (a copy): ``{"diffusion": {...}}`` for a
    diffusion task, ``{}`` for a supervised one."""
    return {name: copy.deepcopy(SECTION_DEFAULTS[name]) for name, tasks in TASK_SECTIONS.items() if task in tasks}


#: key -> what it may hold, parents before children (from :data:`KEYS`): what :func:`medattn.config.validate` checks.
SCHEMA: dict[str, Rule] = _sections(KEYS)
