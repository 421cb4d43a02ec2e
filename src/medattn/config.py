"""Run configuration: defaults -> YAML file -> ``key.sub=value`` overrides -> one resolved dict.

The YAML is read with a ``yaml.SafeLoader`` (plus YAML 1.2's ``1e-3`` floats) and override values
are parsed the same way (``train.lr=3e-4`` is a float, ``model.attention=seqnorm`` a string);
nothing is ever evaluated. Keys outside :data:`DEFAULTS` are refused, except inside the free-form
sections ``data`` (read by :func:`medattn.data.build_datasets`) and ``model.kwargs`` (keyword
arguments for :func:`medattn.models.create_model`). The resolved config is saved with every run and checkpoint.

A config is named either by a path or by the name of a config shipped in ``medattn/configs``
(e.g. ``synthetic_cxr``); :func:`packaged_configs` lists those.
"""

from __future__ import annotations

import copy
import re
from importlib import resources
from pathlib import Path

import yaml

from medattn.errors import UserError

DEFAULTS: dict = {
    "name": "run",
    "seed": 0,
    "out": None,  # run folder; None -> runs/<name>
    "data": {},  # free-form: the data builder's options; "kind" picks the data set
    "model": {
        "name": "vit2d_small",
        "attention": "softmax",
        "kwargs": {},  # free-form: create_model keyword arguments (e.g. attention_kwargs, drop_rate)
    },
    "train": {
        "epochs": 100,
        "batch_size": 32,
        "eval_batch_size": None,  # None -> batch_size
        "lr": 1e-4,
        "min_lr": 1e-6,
        "weight_decay": 0.05,
        "betas": [0.9, 0.999],
        "warmup_epochs": 1.0,  # linear warm-up length, in epochs (fractions allowed)
        "grad_clip": 1.0,  # max global grad norm; 0 or None disables clipping
        "grad_accum": 1,  # micro-batches per optimizer step
        "precision": "fp32",  # fp32 | bf16 (autocast)
        "num_workers": 0,
        "threads": None,  # torch intra-op threads; None -> torch's default (all cores)
        "device": "auto",  # auto | cpu | cuda | cuda:N
        "skip_bad": False,
    },
    "eval": {
        "bootstrap": 1000,  # resamples for the test AUROC's confidence interval
        "ci": 0.95,
    },
}


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also reads ``1e-3`` (no dot) as a float, as YAML 1.2 does."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d[\d_]*\.[\d_]*(?:[eE][-+]?\d+)?|\.\d[\d_]*(?:[eE][-+]?\d+)?|\d[\d_]*[eE][-+]?\d+"
               r"|\.(?:inf|Inf|INF)|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."),
)


def parse_yaml(text: str):
    """``yaml.load`` with the safe loader (no code, no Python objects) and YAML 1.2 floats."""
    return yaml.load(text, Loader=_Loader)


FREE_FORM = {("data",), ("model", "kwargs")}
PRECISIONS = ("fp32", "bf16")


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


def load_config(name_or_path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """Resolve defaults, then the YAML config (path or packaged name), then ``key.sub=value`` overrides."""
    config = copy.deepcopy(DEFAULTS)
    if name_or_path is not None:
        path = config_path(name_or_path)
        try:
            loaded = parse_yaml(path.read_text())
        except yaml.YAMLError as error:
            raise UserError(f"{path}: not valid YAML: {str(error).splitlines()[0]}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise UserError(f"{path}: a config must be a mapping of keys to values")
        _merge(config, loaded, (), str(path))
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise UserError(f"override {item!r} is not of the form key.sub=value")
        try:
            value = parse_yaml(text)
        except yaml.YAMLError:
            raise UserError(f"override {item!r}: value is not valid YAML") from None
        _set(config, key.split("."), value, item)
    validate(config)
    return config


def validate(config: dict) -> None:
    """Check types and ranges of the engine's options; raises UserError naming the key."""
    train = config["train"]
    for key in ("epochs", "batch_size", "grad_accum"):
        if not isinstance(train[key], int) or isinstance(train[key], bool) or train[key] < 1:
            raise UserError(f"train.{key} must be a positive integer, got {train[key]!r}")
    for key in ("lr", "min_lr", "weight_decay", "warmup_epochs"):
        if not isinstance(train[key], (int, float)) or train[key] < 0:
            raise UserError(f"train.{key} must be a non-negative number, got {train[key]!r}")
    if train["precision"] not in PRECISIONS:
        raise UserError(f"train.precision must be one of {PRECISIONS}, got {train['precision']!r}")
    if not isinstance(config["seed"], int):
        raise UserError(f"seed must be an integer, got {config['seed']!r}")
    if not isinstance(config["data"], dict) or "kind" not in config["data"]:
        raise UserError("the config needs a data section with a 'kind' (e.g. data.kind=synthetic_cxr)")
    if not 0 < config["eval"]["ci"] < 1:
        raise UserError(f"eval.ci must be in (0, 1), got {config['eval']['ci']!r}")


def save_config(config: dict, path: Path) -> None:
    """Write the resolved config as YAML."""
    Path(path).write_text(yaml.safe_dump(config, sort_keys=False))


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
