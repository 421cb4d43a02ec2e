"""Run configuration: defaults -> YAML file -> ``key.sub=value`` overrides -> one resolved dict.

The YAML is read with a ``yaml.SafeLoader`` (plus YAML 1.2's ``1e-3`` floats) and override values
are parsed the same way (``train.lr=3e-4`` is a float, ``model.attention=seqnorm`` a string);
nothing is ever evaluated. Every key, with its default, rule and meaning, is listed once in :data:`KEYS`
(:data:`DEFAULTS` and :data:`SCHEMA` are derived from it). Keys outside it are refused, except inside the free-form
sections ``data`` (read by :func:`medattn.data.build_datasets`) and ``model.kwargs`` (keyword
arguments for :func:`medattn.models.create_model`). The resolved config is saved with every run and checkpoint.

A config is named either by a path or by the name of a config shipped in ``medattn/configs``
(e.g. ``synthetic_cxr``); :func:`packaged_configs` lists those. Relative paths in a config file (the data's
``csv``, ``data_root``, ``feature_dir``, ``slide_table``, ``clinical_table``, ``path``; diffusion's checkpoints:
:data:`PATH_KEYS`) are relative to the file's folder, wherever the command runs; on the command line they are
relative to the current folder.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from medattn.errors import UserError

MAX_CONFIG_BYTES = 1 << 20  # a config file larger than this is refused before it is read
MAX_CONFIG_VALUES = 100_000  # nodes of the document with every alias expanded (a "billion laughs" bound)


class ConfigTooLarge(yaml.YAMLError):
    """A YAML document whose aliases expand beyond :data:`MAX_CONFIG_VALUES` nodes, or refer to themselves."""


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also reads ``1e-3`` (no dot) as a float, as YAML 1.2 does, and refuses
    documents that aliases would expand beyond :data:`MAX_CONFIG_VALUES` nodes (353 bytes of nested
    aliases otherwise stand for gigabytes once the config is saved or flattened)."""

    def compose_document(self):
        node = super().compose_document()
        _expanded_size(node, {}, set())
        return node


def _expanded_size(node: yaml.Node, sizes: dict[int, int], open_nodes: set[int]) -> int:
    """Nodes under ``node`` with aliases expanded (shared nodes counted once per use, memoised by id)."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_nodes:
        raise ConfigTooLarge("an alias refers to a value that contains it (a recursive document)")
    open_nodes.add(id(node))
    if isinstance(node, yaml.MappingNode):
        children = [child for pair in node.value for child in pair]
    else:
        children = node.value if isinstance(node, yaml.SequenceNode) else []
    total = 1 + sum(_expanded_size(child, sizes, open_nodes) for child in children)
    if total > MAX_CONFIG_VALUES:
        raise ConfigTooLarge(f"the document's aliases expand to more than {MAX_CONFIG_VALUES} values")
    open_nodes.discard(id(node))
    sizes[id(node)] = total
    return total


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d[\d_]*\.[\d_]*(?:[eE][-+]?\d+)?|\.\d[\d_]*(?:[eE][-+]?\d+)?|\d[\d_]*[eE][-+]?\d+"
               r"|\.(?:inf|Inf|INF)|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."),
)


def parse_yaml(text: str):
    """``yaml.load`` with the safe loader (no code, no Python objects), YAML 1.2 floats and a bounded
    expanded size; raises ``yaml.YAMLError`` (:class:`ConfigTooLarge` for a document too large or too deep)."""
    try:
        return yaml.load(text, Loader=_Loader)
    except RecursionError:
        raise ConfigTooLarge("the document is nested too deeply") from None


FREE_FORM = {("data",), ("model", "kwargs")}


def packaged_configs() -> list[str]:
    """Names of the configs shipped inside the package, sorted."""
    folder = resources.files("medattn") / "configs"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def config_path(name_or_path: str) -> Path:
    """A config file: the given path if it exists, else the packaged config of that name."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    packaged = resources.files("medattn") / "configs" / f"{name_or_path}.yaml"
    if packaged.is_file():
        return Path(str(packaged))
    raise UserError(f"config file not found: {name_or_path} (packaged configs: {', '.join(packaged_configs())})")


#: Keys whose values are paths to the user's files: relative ones in a config file are relative to the file's
#: folder (command-line overrides stay relative to the current folder).
PATH_KEYS = {("data", "csv"), ("data", "data_root"), ("data", "feature_dir"), ("data", "slide_table"),
             ("data", "clinical_table"), ("data", "path"), ("pretrain", "pool"), ("diffusion", "vqae_checkpoint"),
             ("diffusion", "perceptual_net")}


def is_packaged(path: Path) -> bool:
    """Whether ``path`` is one of the configs shipped with medattn (its paths are placeholders or cwd-relative)."""
    return Path(path).resolve().parent == Path(str(resources.files("medattn") / "configs")).resolve()


def anchor_paths(config: dict, folder: Path) -> None:
    """Make the relative paths of :data:`PATH_KEYS` in a config file's mapping relative to ``folder`` (in place)."""
    for section, key in PATH_KEYS:
        part = config.get(section)
        if isinstance(part, dict) and isinstance(part.get(key), str) and part[key] and \
                not Path(part[key]).expanduser().is_absolute():
            part[key] = str(Path(folder) / part[key])


def read_config_file(path: Path) -> dict:
    """The mapping in a YAML config file; one-line UserErrors for a file too large, unreadable or not a mapping."""
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise UserError(f"{path}: a config file may hold at most {MAX_CONFIG_BYTES} bytes")
        loaded = parse_yaml(path.read_text())
    except ConfigTooLarge as error:
        raise UserError(f"{path}: refused: {error}") from None
    except yaml.YAMLError as error:
        raise UserError(f"{path}: not valid YAML: {str(error).splitlines()[0]}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a text file (UTF-8)") from None
    except OSError as error:
        raise UserError(f"{path}: cannot read ({error.strerror})") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise UserError(f"{path}: a config must be a mapping of keys to values")
    return loaded


def load_config(name_or_path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """Resolve defaults, then the YAML config (path or packaged name), then ``key.sub=value`` overrides;
    the result is checked against :data:`SCHEMA` (see :func:`validate`)."""
    config = copy.deepcopy(DEFAULTS)
    if name_or_path is not None:
        path = config_path(name_or_path)
        loaded = read_config_file(path)
        if not is_packaged(path):  # a user's file: its relative paths are relative to the file
            anchor_paths(loaded, path.absolute().parent)
        _merge(config, loaded, (), str(path))
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise UserError(f"override {item!r} is not of the form key.sub=value")
        try:
            value = parse_yaml(text)
        except ConfigTooLarge as error:
            raise UserError(f"override {item!r}: refused: {error}") from None
        except yaml.YAMLError:
            raise UserError(f"override {item!r}: value is not valid YAML") from None
        _set(config, key.split("."), value, item)
    validate(config)
    return config


def with_defaults(config: dict, source: str = "") -> dict:
    """``config`` completed with today's :data:`DEFAULTS` for keys it lacks (a copy): a checkpoint saved before
    a key existed loads with that key's default, which is what the run that wrote it did. Unknown keys stay
    an error naming ``source``."""
    completed = copy.deepcopy(DEFAULTS)
    _merge(completed, config, (), source or "config")
    return completed


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
    "train.loss": Key(None, _choice(None, "dice_ce", "dice"),
                      "null -> the task's (cross-entropy; segmentation: dice_ce); dice = soft Dice only"),
    "train.patch_size": Key(None, Rule("null, a positive int or a list of 2 or 3 positive ints", lambda v: v is None
                                       or (_is_int(v) and v > 0) or (isinstance(v, list) and len(v) in (2, 3)
                                                                      and all(_is_int(m) and m > 0 for m in v))),
                            "segmentation: train on random patches of this size (medattn.data.patches)"),
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
    "pretrain.pool": Key(None, _text(optional=True),
                         "a CSV of unlabelled files (the data's path column) read like the training split"),
    "eval.bootstrap": Key(1000, _integer(0, 1_000_000), "resamples for the test AUROC's confidence interval"),
    "eval.heatmaps": Key(3, _integer(0, 100), "test cases whose heatmaps report.html shows, the highest-scored "
                                              "first (medattn.explain.cases; 0: none)"),
    "eval.ci": Key(0.95, Rule("a number between 0 and 1 (exclusive)", lambda v: _is_number(v) and 0 < v < 1)),
    "eval.sliding_window": Key(None, Rule("null, true or false", lambda v: v is None or isinstance(v, bool)),
                               "segmentation: null -> on when train.patch_size is set (medattn.runtime.sliding)"),
    "eval.window_overlap": Key(None, Rule("null or a number in [0, 1)",
                                          lambda v: v is None or (_is_number(v) and 0 <= v < 1)),
                               "overlap of neighbouring windows, in [0, 1); null -> 0.5"),
    "task": Key("supervised", _choice("supervised", "diffusion_vqae", "diffusion_transformer"),
                "supervised | diffusion_vqae | diffusion_transformer (docs/diffusion.md)"),
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


#: The defaults, nested as a config is (from :data:`KEYS`).
DEFAULTS: dict = _defaults(KEYS)
#: key -> what it may hold, parents before children (from :data:`KEYS`): what :func:`validate` checks.
SCHEMA: dict[str, Rule] = _sections(KEYS)


def validate(config: dict, source: str = "") -> None:
    """Check the resolved config against :data:`SCHEMA` and that every value is plain (text, number,
    true/false, null, list, mapping: what YAML and JSON both write back); raises UserError naming the key."""
    prefix = f"{source}: " if source else ""
    missing = object()
    for key, rule in SCHEMA.items():
        value = _lookup(config, key.split("."), missing)
        if value is missing and key == "data.kind":
            raise UserError(f"{prefix}the config needs a data section with a 'kind' (e.g. data.kind=synthetic_cxr)")
        if value is missing or not rule.test(value):
            got = "nothing" if value is missing else repr(value)
            raise UserError(f"{prefix}{key} must be {rule.wants}, got {got}")
    _check_plain(config, prefix, ())


def _lookup(config: dict, keys: list[str], missing):
    node = config
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return missing
        node = node[key]
    return node


def _check_plain(value, prefix: str, path: tuple[str, ...]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise UserError(f"{prefix}{'.'.join((*path, str(key)))}: keys must be text, got {key!r}")
            _check_plain(item, prefix, (*path, key))
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_plain(item, prefix, path)
    elif not (value is None or isinstance(value, (str, int, float, bool))):
        raise UserError(f"{prefix}{'.'.join(path)} must be text, a number, true/false, null, a list or a mapping; "
                        f"got a {type(value).__name__} ({value}); quote it to keep it as text")


def save_config(config: dict, path: Path, defaults: dict | None = None) -> None:
    """Write the resolved config as YAML; ``defaults`` (``{"data.augment": "strong", ...}``: values defaults chose
    that the config does not hold) go above it as comment lines, for the reader."""
    from medattn.runtime.outputs import save_text

    lines = [f"# default: {key}={value}\n" for key, value in (defaults or {}).items()]
    save_text(Path(path), "".join(lines) + yaml.safe_dump(config, sort_keys=False))


def flatten(config: dict, prefix: str = "") -> dict:
    """{"train.lr": 1e-4, ...}: the config's leaves by dotted key."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _free(path: tuple[str, ...]) -> bool:
    return any(path[: len(f)] == f for f in FREE_FORM)


def _merge(base: dict, update: dict, path: tuple[str, ...], source: str) -> None:
    for key, value in update.items():
        here = (*path, str(key))
        if not _free(here) and key not in base:
            raise UserError(f"{source}: unknown config key {'.'.join(here)!r}; valid keys: {', '.join(base)}")
        if value is None and isinstance(base.get(key), dict) and not _free(here):
            continue  # an empty section (``train:`` with nothing below) keeps its defaults
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value, here, source)
        else:
            base[key] = copy.deepcopy(value)


def _set(config: dict, keys: list[str], value, item: str) -> None:
    node = config
    for depth, key in enumerate(keys):
        here = tuple(keys[: depth + 1])
        last = depth == len(keys) - 1
        if not _free(here) and key not in node:
            raise UserError(f"override {item!r}: unknown config key {'.'.join(here)!r}; valid keys: {', '.join(node)}")
        if last:
            node[key] = value
        else:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
