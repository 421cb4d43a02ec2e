"""A minimal stand-in for ``torchvision`` so that timm (installed ``--no-deps``) imports beside the CPU torch.

torchvision from PyPI is a CUDA build that does not import here; timm imports a few of its names at module
load (``FrozenBatchNorm2d``, ``InterpolationMode`` members, transforms) without using them for ViTs. While
:func:`importable` is active, every ``torchvision.*`` module exists and every attribute is a distinct
placeholder class that refuses to be called. Afterwards the stand-in leaves ``sys.modules`` again, so
nothing else (MONAI's optional imports) mistakes it for torchvision.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import sys
import types


class _Placeholder(type):
    """Any attribute of a placeholder is another, distinct placeholder (enum members must differ)."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _Placeholder(name, (), {})
        setattr(cls, name, value)
        return value

    def __call__(cls, *args, **kwargs):
        raise RuntimeError(f"torchvision stand-in: {cls.__name__} is not available in these tests")


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _Placeholder(name, (), {})
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__, module.__version__ = [], "0+stand-in"
        return module

    def exec_module(self, module):
        pass


@contextlib.contextmanager
def importable():
    """Inside: ``import torchvision`` gives the stand-in (when the real one is absent or broken)."""
    finder = _Finder()
    saved = {name: module for name, module in sys.modules.items() if name.split(".")[0] == "torchvision"}
    for name in saved:
        del sys.modules[name]
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        sys.modules.update(saved)


def import_timm():
    """timm's ViT module imported with the stand-in (None when timm is not installed)."""
    with importable():
        try:
            return importlib.import_module("timm.models.vision_transformer")
        except ImportError:
            return None
