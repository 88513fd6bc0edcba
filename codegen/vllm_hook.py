"""Replaces functions in every module of one package that holds them, now and on later imports.

Used by codegen.vllm_plugin (and nothing else in codegen). vLLM loads general plugins before it
imports a model, and importing `vllm.models.minimax_m3` would import the whole model (its vision
processor, transformers, ...) in every vLLM process, whatever model it serves. So modules already
imported are patched at once, and the rest right after each one runs, before any `from X import f`
elsewhere can read the original: a finder on sys.meta_path hands the real loader a wrapper that
patches the module once its body has run.
"""
from __future__ import annotations

import importlib.abc
import sys
from typing import Callable

# name in the module, the function found there -> its replacement, or None to leave it.
Replace = Callable[[str, object], object]


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then patches the module; the module keeps the real loader."""

    def __init__(self, inner, patch: Callable[[object], None]):
        self._inner = inner
        self._patch = patch

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        # Put the real loader back first: inspect, linecache and importlib.resources see no wrapper.
        module.__loader__ = self._inner
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._inner
        self._inner.exec_module(module)
        self._patch(module)

    def __getattr__(self, name):  # get_source, get_resource_reader, ... of the real loader
        return getattr(self._inner, name)


class PackagePatcher(importlib.abc.MetaPathFinder):
    """Replaces the attributes `names` (and any other attribute holding a replaced original) in
    every module of `package`. `replace(name, value)` decides each replacement; it is asked once
    per original and its answer is reused for every holder."""

    def __init__(self, package: str, names, replace: Replace):
        self.package = package
        self.names = tuple(names)
        self._replace = replace
        self._by_original: dict[int, tuple[object, object]] = {}  # id(original) -> (original, replacement)
        self._replacements: set[int] = set()

    # -- the finder ----------------------------------------------------------------------------
    def _ours(self, fullname: str) -> bool:
        return fullname == self.package or fullname.startswith(self.package + ".")

    def find_spec(self, fullname, path=None, target=None):
        if not self._ours(fullname):
            return None
        for finder in sys.meta_path:  # the spec the import would have had without us
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PatchingLoader(spec.loader, self.patch_module)
        return spec

    def install(self) -> None:
        """Patches the package's modules imported so far, then every one imported later."""
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)
        for name, module in list(sys.modules.items()):
            if module is not None and self._ours(name):
                self.patch_module(module)

    def uninstall(self) -> None:
        """Stops patching later imports (what was patched stays patched)."""
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    # -- the patching --------------------------------------------------------------------------
    def _replacement(self, name: str, value):
        if id(value) in self._replacements:
            return None  # already ours
        known = self._by_original.get(id(value))
        if known is not None and known[0] is value:
            return known[1]
        if name not in self.names:
            return None  # another attribute that holds no original seen so far
        new = self._replace(name, value)
        self._by_original[id(value)] = (value, new)
        if new is not None:
            self._replacements.add(id(new))
        return new

    def patch_module(self, module) -> None:
        namespace = getattr(module, "__dict__", None)
        if namespace is None:
            return
        for name in self.names:  # the known names first, so aliases below find their originals
            if callable(namespace.get(name)):
                new = self._replacement(name, namespace[name])
                if new is not None:
                    setattr(module, name, new)
        for name, value in list(namespace.items()):  # aliases: `from ... import f as g`
            if name not in self.names and id(value) in self._by_original:
                new = self._replacement(name, value)
                if new is not None:
                    setattr(module, name, new)

    def holders(self) -> list[tuple[str, str, object]]:
        """(module, attribute, value) for every loaded module of the package holding a known
        original or its replacement: what a test checks."""
        found = []
        for mod_name, module in sorted((n, m) for n, m in sys.modules.items() if m is not None and self._ours(n)):
            for attr, value in vars(module).items():
                if id(value) in self._replacements or id(value) in self._by_original:
                    found.append((mod_name, attr, value))
        return found
