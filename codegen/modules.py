"""The generated modules, imported by variant: the one place the runtime API, the config loader
and the static gate get a kernel module from (so none of them imports another for it)."""
from __future__ import annotations

import functools
import importlib

from .variants import Variant


@functools.lru_cache(maxsize=None)
def load_module(arch: str, kernel: str, scale_mode: str, fold_scales: bool = True):
    """The generated module of one variant (imported once)."""
    return importlib.import_module(Variant(arch, kernel, scale_mode, fold_scales).module)
