"""Reading a data config: unknown keys, sizes and splits are checked here with one-line errors."""

from __future__ import annotations

import math

from ..errors import UserError

SPLITS = ("train", "val", "test")


def check_keys(cfg: dict, allowed: set[str] | frozenset[str], kind: str) -> None:
    """Reject keys a builder does not read (typos would otherwise be silently ignored)."""
    unknown = sorted(set(cfg) - set(allowed) - {"kind"})
    if unknown:
        raise UserError(f"data kind {kind!r} does not take {', '.join(unknown)}; "
                        f"valid keys: {', '.join(sorted(allowed))}")


def require(cfg: dict, key: str, kind: str):
    """The value of a required key, or a one-line error."""
    if cfg.get(key) in (None, ""):
        raise UserError(f"data kind {kind!r} needs the key {key!r}")
    return cfg[key]


def split_sizes(value, default: dict[str, int]) -> dict[str, int]:
    """``num_samples`` as a dict {train, val, test}, a list of three ints, or one int (train; val and test get half)."""
    if value is None:
        return dict(default)
    if isinstance(value, int) and not isinstance(value, bool):
        sizes = {"train": value, "val": max(1, value // 2), "test": max(1, value // 2)}
    elif isinstance(value, (list, tuple)) and len(value) == 3:
        sizes = dict(zip(SPLITS, value))
    elif isinstance(value, dict) and set(value) <= set(SPLITS):
        sizes = {**default, **value}
    else:
        raise UserError(f"num_samples must be an int, [train, val, test] or {{train:, val:, test:}}, got {value!r}")
    for split, n in sizes.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise UserError(f"num_samples[{split}] must be a positive int, got {n!r}")
    return sizes


def integer(cfg: dict, key: str, default: int, low: int, high: int, kind: str) -> int:
    """``cfg[key]`` (``default`` when absent) as an int in [low, high]; a one-line UserError otherwise."""
    value = cfg.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise UserError(f"{kind}.{key} must be an integer from {low} to {high}, got {value!r}")
    return value


def number(cfg: dict, key: str, default: float, low: float, high: float, kind: str, low_open: bool = False) -> float:
    """``cfg[key]`` (``default`` when absent) as a finite number in [low, high] ((low, high] with ``low_open``)."""
    value = cfg.get(key, default)
    fits = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and (
        low < value <= high if low_open else low <= value <= high)
    if not fits:
        raise UserError(f"{kind}.{key} must be a number {'>' if low_open else '>='} {low} and <= {high}, "
                        f"got {value!r}")
    return float(value)


def flag(cfg: dict, key: str, default: bool, kind: str) -> bool:
    """``cfg[key]`` (``default`` when absent) as true or false."""
    value = cfg.get(key, default)
    if not isinstance(value, bool):
        raise UserError(f"{kind}.{key} must be true or false, got {value!r}")
    return value


def int_tuple(value, length: int, name: str) -> tuple[int, ...]:
    """An int or ``length`` ints, all positive."""
    if isinstance(value, bool) or not isinstance(value, (int, list, tuple)):
        raise UserError(f"{name} must be a positive int or {length} positive ints, got {value!r}")
    values = (value,) * length if isinstance(value, int) and not isinstance(value, bool) else tuple(value)
    if len(values) != length or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        raise UserError(f"{name} must be a positive int or {length} positive ints, got {value!r}")
    return values


def float_tuple(value, length: int, name: str) -> tuple[float, ...]:
    """A number or ``length`` numbers, all positive."""
    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    if not (number(value) or isinstance(value, (list, tuple))):
        raise UserError(f"{name} must be a positive number or {length} positive numbers, got {value!r}")
    values = (value,) * length if number(value) else tuple(value)
    if len(values) != length or not all(number(v) and v > 0 for v in values):
        raise UserError(f"{name} must be a positive number or {length} positive numbers, got {value!r}")
    return tuple(float(v) for v in values)
