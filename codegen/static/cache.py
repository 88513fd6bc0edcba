"""The cache of compiled figures: one JSON file per (launch, compile inputs) key, written
atomically, so parallel workers and later runs reuse each other's compiles."""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import tempfile

import triton

from .compile import CompileInputs, compile_figures
from .launch import CACHE_ENV


def cache_dir() -> pathlib.Path:
    """Where compiled figures are kept: $MSA_TUNE_CACHE_DIR, else ~/.cache/msa-tune/static."""
    configured = os.environ.get(CACHE_ENV)
    return pathlib.Path(configured) if configured else pathlib.Path.home() / ".cache" / "msa-tune" / "static"


def _cache_path(inputs: CompileInputs) -> pathlib.Path:
    return cache_dir() / f"{inputs.launch.variant}-{inputs.key[:32]}.json"


def _cache_load(inputs: CompileInputs) -> dict | None:
    path = _cache_path(inputs)
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != inputs.key or not isinstance(entry.get("figures"), dict):
        return None
    return entry["figures"]


def _cache_store(inputs: CompileInputs, figures: dict) -> None:
    """Atomic write (temp file + rename): parallel workers never see half a file."""
    if "error" in figures:
        return  # failures are not cached: the cause may be the environment, not the kernel
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    entry = {"key": inputs.key, "launch": inputs.launch.id, "triton": triton.__version__, "figures": figures}
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f, indent=1, sort_keys=True)
        os.replace(tmp, _cache_path(inputs))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def cached_figures(inputs: CompileInputs, *, use_cache: bool = True) -> tuple[dict, bool]:
    """(figures, came_from_cache) for `inputs`: from the cache, else compiled now and stored."""
    if use_cache:
        figures = _cache_load(inputs)
        if figures is not None:
            return figures, True
    figures = compile_figures(inputs)
    if use_cache:
        _cache_store(inputs, figures)
    return figures, False
