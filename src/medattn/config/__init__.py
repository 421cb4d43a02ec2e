"""Run configuration: defaults -> YAML file -> ``key.sub=value`` overrides -> one resolved dict.

The YAML is read with a ``yaml.SafeLoader`` (plus YAML 1.2's ``1e-3`` floats) and override values
are parsed the same way (``train.lr=3e-4`` is a float, ``model.attention=seqnorm`` a string);
nothing is ever evaluated. Every key, with its default, rule and meaning, is listed once in
:data:`medattn.config.keys.KEYS` (:data:`DEFAULTS` and :data:`SCHEMA` are derived from it). Keys outside it are
refused, except inside the free-form sections ``data`` (read by :func:`medattn.data.build_datasets`) and
``model.kwargs`` (keyword arguments for :func:`medattn.models.create_model`). A task section
(:data:`~medattn.config.keys.TASK_SECTIONS`: ``diffusion``) is held only by the configs of its tasks: a supervised
config has no ``diffusion`` keys and refuses one, naming it. The resolved config is saved with every run and
checkpoint.

A config is named either by a path or by the name of a config shipped in ``medattn/configs``
(e.g. ``synthetic_cxr``); :func:`packaged_configs` lists those. Relative paths in a config file (the data's
``csv``, ``data_root``, ``feature_dir``, ``slide_table``, ``clinical_table``, ``slides_dir``, ``path``; diffusion's
checkpoints: :data:`PATH_KEYS`) are relative to the file's folder, wherever the command runs; on the command line
they are relative to the current folder.
"""

from __future__ import annotations

import copy
import re
from importlib import resources
from pathlib import Path

import yaml

from medattn.errors import UserError

from .keys import DEFAULTS, SCHEMA, SECTION_DEFAULTS, TASK_SECTIONS, task_defaults

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
             ("data", "clinical_table"), ("data", "slides_dir"), ("data", "path"), ("pretrain", "pool"),
             ("diffusion", "vqae_checkpoint"), ("diffusion", "perceptual_net")}


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


#: The value of a task section's key that neither the file nor an override set (inside :func:`load_config`).
_UNSET = object()


def load_config(name_or_path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """Resolve defaults, then the YAML config (path or packaged name), then ``key.sub=value`` overrides;
    the result is checked against :data:`SCHEMA` (see :func:`validate`). A task section takes its defaults only
    in a config of its tasks (:func:`_close_task_sections`)."""
    config = copy.deepcopy(DEFAULTS)
    config.update({name: dict.fromkeys(section, _UNSET) for name, section in SECTION_DEFAULTS.items()})
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
    _close_task_sections(config)
    validate(config)
    return config


def _close_task_sections(config: dict) -> None:
    """Each task section of :func:`load_config`'s ``config`` (in place): its defaults under the values set, in a
    config of its tasks; gone from another task's config when nothing set a key there to a value other than its
    default (the ``config.yaml`` of a run written while every config held the section carries the defaults; else
    :func:`validate` refuses the key set)."""
    for name, tasks in TASK_SECTIONS.items():
        section = config[name]
        given = {k: v for k, v in section.items() if v is not _UNSET} if isinstance(section, dict) else section
        if config.get("task") in tasks and isinstance(given, dict):
            config[name] = {**copy.deepcopy(SECTION_DEFAULTS[name]), **given}
            continue
        if isinstance(given, dict):
            given = {k: v for k, v in given.items() if SECTION_DEFAULTS[name].get(k, _UNSET) != v}
        if given == {}:
            del config[name]
        else:
            config[name] = given


def with_defaults(config: dict, source: str = "") -> dict:
    """``config`` completed with today's :data:`DEFAULTS` for keys it lacks (a copy): a checkpoint saved before
    a key existed loads with that key's default, which is what the run that wrote it did. A task section its task
    does not hold is dropped (supervised checkpoints saved while every config held ``diffusion`` carry it unread).
    Unknown keys stay an error naming ``source``."""
    task = config.get("task", DEFAULTS["task"])
    completed = {**copy.deepcopy(DEFAULTS), **task_defaults(task)}
    kept = {key: value for key, value in config.items() if key not in TASK_SECTIONS or task in TASK_SECTIONS[key]}
    _merge(completed, kept, (), source or "config")
    return completed


def validate(config: dict, source: str = "") -> None:
    """Check the resolved config against :data:`SCHEMA` (a task section's keys only in a config of its tasks, which
    must hold them; another task's config must not) and that every value is plain (text, number, true/false, null,
    list, mapping: what YAML and JSON both write back); raises UserError naming the key."""
    prefix = f"{source}: " if source else ""
    missing = object()
    task = config.get("task")
    for key, rule in SCHEMA.items():
        section = key.partition(".")[0]
        if section in TASK_SECTIONS and task not in TASK_SECTIONS[section]:
            continue
        value = _lookup(config, key.split("."), missing)
        if value is missing and key == "data.kind":
            raise UserError(f"{prefix}the config needs a data section with a 'kind' (e.g. data.kind=synthetic_cxr)")
        if value is missing or not rule.test(value):
            got = "nothing" if value is missing else repr(value)
            raise UserError(f"{prefix}{key} must be {rule.wants}, got {got}")
    for section, tasks in TASK_SECTIONS.items():
        if section in config and task not in tasks:
            part = config[section]
            key = f"{section}.{next(iter(part))}" if isinstance(part, dict) and part else section
            raise UserError(f"{prefix}{key}: a key of the {' and '.join(tasks)} tasks only; this config's task is "
                            f"{task!r}")
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


def config_yaml(config: dict, defaults: dict | None = None) -> str:
    """The resolved config as YAML text (its writer saves it through its folder: a run's ``config.yaml``);
    ``defaults`` (``{"data.augment": "strong", ...}``: values defaults chose that the config does not hold) go above it
    as comment lines, for the reader."""
    lines = [f"# default: {key}={value}\n" for key, value in (defaults or {}).items()]
    return "".join(lines) + yaml.safe_dump(config, sort_keys=False)


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
