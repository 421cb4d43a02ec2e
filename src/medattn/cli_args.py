"""Argument types shared by the command modules (:mod:`medattn.commands`) and the benches.

A command module never imports another command module (``docs/architecture.md``); a helper two commands
need lives here. Imports nothing from medattn, so ``medattn --help`` stays light.
"""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value
