"""Picks the launch config for a call: a tuned entry from tuned_configs/, else the arch default.

Lookup order for (kernel, arch, device, scale mode, KV dtype, head layout, token count):
  1. the file for (arch, normalized device) in $MSA_TUNE_CONFIG_DIR, if set and present, else in
     the repo's tuned_configs/; then, for a device that borrows (tuned_store.BORROWED_TABLES: an
     H100 the H200's), its lender's file, searched the same way, for each table the first file lacks
     or holds unmeasured;
  2. in its table for (kernel, scale mode, KV dtype, head layout): the exact token bucket, else the
     nearest bucket in log2 space (ties go to the smaller bucket). For a borrowing device the bucket is
     picked over its own table's buckets and its lender's together, and taken from its own table when
     that holds it: a partial tune of its own serves the buckets it measured, the lender's exact bucket
     the others (on an H100 the H200's 128-request config ran TP4 decode at 31 us where its own
     partial table's nearest bucket took 37: results/h100/decode-retune-partial);
  3. else the arch default (codegen.configs.default_config).
With per_token=True (prefill's per-token path, for selections that neighbouring tokens do not
share): when the table has per-token sub-entries (tuned by their own studies on unrelated
selections), the exact or nearest bucket among those that have one; in a table without any, the
same bucket's config with block_t 1, its per-token twin, which keeps the key block, warps, stages
and upcast tuned for that size (on the H200 the twin of the tuned 4-token tile was the best
per-token config of the probe grid for fp8 caches, results/h200/prefill-next, but ~20% slower
than the arch default for the bf16 cache: hence the per-token studies).
Files are read once (cached by path and mtime). A broken file, one for another arch or device, or
a stale one (other template inputs or Triton version) gives one warning; broken and mismatched
files are ignored, stale ones still serve (their configs are valid launches, maybe not the best).
Staleness by Triton version is judged only where a GPU compiles the kernels (CUDA/ROCm available
and TRITON_INTERPRET unset): on a CPU the table looked up is another machine's anyway, and the
interpreter's Triton says nothing about what that GPU runs, so the warning would be one nobody
can act on. Staleness by template inputs is judged everywhere (re-tune after a template change).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import pathlib
import warnings

from . import tuned_store, validate
from .configs import LaunchConfig, default_config, per_token_twin
from .modules import load_module
from .variants import has_variant


@dataclasses.dataclass(frozen=True)
class ConfigChoice:
    config: LaunchConfig
    is_tuned: bool
    source: str  # "tuned:exact", "tuned:nearest", "default"
    reason: str  # why this one: the file and bucket used, or why no tuned entry applied
    bucket: int | None = None
    path: str | None = None


_warned: set[tuple[str, str]] = set()


def _warn_once(path, message: str) -> None:
    key = (str(path), message)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"msa-tune: {path}: {message}", RuntimeWarning, stacklevel=4)


def config_dirs() -> list[pathlib.Path]:
    dirs = []
    override = os.environ.get(tuned_store.CONFIG_DIR_ENV)
    if override:
        if not os.path.isdir(override):  # a typo would otherwise fall back to the repository's tables unsaid
            _warn_once(override, f"{tuned_store.CONFIG_DIR_ENV} names no folder; only {tuned_store.REPO_CONFIG_DIR} "
                                 f"is read")
        dirs.append(pathlib.Path(override))
    dirs.append(tuned_store.REPO_CONFIG_DIR)
    return dirs


@functools.lru_cache(maxsize=64)
def _load(path: str, mtime_ns: int) -> dict | None:
    try:
        return tuned_store.read_document(pathlib.Path(path))
    except (OSError, ValueError) as exc:  # json.JSONDecodeError and SchemaError are ValueErrors
        _warn_once(path, f"ignored, broken tuned-config file ({exc})")
        return None


def _file_for(arch: str, device_name: str) -> tuple[pathlib.Path | None, dict | None, str]:
    """(path, document, why not) of the first file for (arch, device) in config_dirs()."""
    name = tuned_store.file_name(arch, device_name)
    for folder in config_dirs():
        path = folder / name
        if path.is_file():
            doc = _load(str(path), path.stat().st_mtime_ns)
            if doc is None:
                return path, None, f"{path} is broken"
            expected = tuned_store.normalize_device_name(device_name)
            if doc["arch"] != arch or doc["device"] != expected:
                _warn_once(path, f"ignored, written for {doc['arch']}/{doc['device']}, not {arch}/{expected}")
                return path, None, f"{path} is for another device"
            return path, doc, ""
    return None, None, f"no tuned-config file {name} in {', '.join(str(d) for d in config_dirs())}"


def _documents_for(arch: str, device_name: str) -> tuple[list[tuple[pathlib.Path, dict, str]], str]:
    """The documents a lookup reads, in order, each with what the choice's reason adds to its path,
    and why there are fewer than two: the device's own file, then its lender's (tuned_store.
    BORROWED_TABLES), which serves each table the own file lacks or holds unmeasured."""
    docs, why_not = [], []
    path, doc, why = _file_for(arch, device_name)
    if doc is not None:
        docs.append((path, doc, ""))
    else:
        why_not.append(why)
    lent = tuned_store.lender(arch, device_name)
    if lent is not None:
        path, doc, why = _file_for(arch, lent)
        own = tuned_store.normalize_device_name(device_name)
        if doc is not None:
            docs.append((path, doc, f" (borrowed by {own}: tuned_store.BORROWED_TABLES)"))
        else:
            why_not.append(f"nor one of its lender {lent} ({why})")
    return docs, "; ".join(why_not)


def lender_file(arch: str, device_name: str) -> pathlib.Path | None:
    """The file of the device's lender (tuned_store.BORROWED_TABLES) that lookups read where the device's
    own file has no measured table, if it has a lender and that file loads: a tune of the device seeds
    the studies of those tables from it."""
    lent = tuned_store.lender(arch, device_name)
    if lent is None:
        return None
    path, doc, _ = _file_for(arch, lent)
    return path if doc is not None else None


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _override_raw():
    """The override folder's variable as the process environment holds it (os.environ's encoded
    dict read directly where it exists: a fifth of a microsecond instead of one)."""
    data = getattr(os.environ, "_data", None)
    if isinstance(data, dict):
        return data.get(_OVERRIDE_KEY)
    return os.environ.get(tuned_store.CONFIG_DIR_ENV)


_OVERRIDE_KEY = os.environ.encodekey(tuned_store.CONFIG_DIR_ENV) if hasattr(os.environ, "encodekey") \
    else tuned_store.CONFIG_DIR_ENV


class TableStamp:
    """The tuned-config files a lookup for (arch, device) looks at, in order, with their mtimes
    (None: absent), and the override folder then set. `unchanged()` re-stats them (one stat a
    folder): a cached answer stays valid exactly as long as it says True."""

    __slots__ = ("override", "files")

    def __init__(self, arch: str, device_name: str):
        self.override = _override_raw()
        names = [tuned_store.file_name(arch, device_name)]  # its own file, then its lender's
        if (lent := tuned_store.lender(arch, device_name)) is not None:
            names.append(tuned_store.file_name(arch, lent))
        self.files = tuple((path, _mtime(path)) for name in names for path in (str(folder / name)
                                                                                for folder in config_dirs()))

    def unchanged(self) -> bool:
        if _override_raw() != self.override:
            return False
        for path, mtime in self.files:
            if _mtime(path) != mtime:
                return False
        return True


def prefill_parts(arch: str, scale_mode: str) -> list[str]:
    """The generated modules a prefill table's configs may launch: the Triton-language tiles, and the
    warp-specialized Gluon tile where it exists (a table's configs choose between them)."""
    return ["prefill", "prefill_ws"] if has_variant(arch, "prefill_ws", scale_mode) else ["prefill"]


def current_inputs_sha256(arch: str, kernel: str, scale_mode: str) -> str:
    """The template-input hash of the generated modules one kernel family launches."""
    parts = prefill_parts(arch, scale_mode) if kernel == "prefill" else ["decode_split", "decode_merge"]
    return "+".join(load_module(arch, part, scale_mode).INPUTS_SHA256[:16] for part in parts)


def _gpu_compiles() -> bool:
    """Whether this process compiles kernels for a GPU (not the CPU interpreter): see the docstring."""
    import torch

    return os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available()


def _check_stale(path, table: dict, arch: str, kernel: str, scale_mode: str) -> None:
    import triton

    prov = table["provenance"]
    if prov["inputs_sha256"] != current_inputs_sha256(arch, kernel, scale_mode):
        _warn_once(path, f"stale: {kernel}/{scale_mode} was tuned for other template inputs; re-run tune.py")
    if prov["triton"] != triton.__version__ and _gpu_compiles():
        _warn_once(path, f"stale: tuned with triton {prov['triton']}, running {triton.__version__}; re-run tune.py")


def buckets_by_distance(buckets, num_tokens: int) -> list[int]:
    """The buckets from closest to num_tokens to farthest, in log2 space; ties go to the smaller."""
    target = math.log2(max(num_tokens, 1))
    return sorted(buckets, key=lambda b: (abs(math.log2(b) - target), b))


def nearest_bucket(buckets, num_tokens: int) -> int:
    """The bucket closest to num_tokens in log2 space; ties go to the smaller bucket."""
    return buckets_by_distance(buckets, num_tokens)[0]


def get_config(kernel: str, arch: str, device_name: str, scale_mode: str, kv_dtype: str,
               num_q_heads: int, num_kv_heads: int, num_tokens: int, topk: int = 16, *,
               per_token: bool = False) -> ConfigChoice:
    """The launch config for one call shape and how it was chosen (see the module docstring).
    Arguments the kernels would refuse raise as the kernels' API does (codegen.validate)."""
    validate.check_lookup(scale_mode, kv_dtype, num_q_heads, num_kv_heads, num_tokens, topk)
    if per_token and kernel != "prefill":
        raise ValueError(f"per_token: only prefill has a per-token path, got kernel={kernel!r}")
    default = default_config(arch, kernel, num_tokens=num_tokens, num_kv_heads=num_kv_heads, topk=topk)
    if per_token and default.block_t != 1:
        default = dataclasses.replace(default, block_t=1)
    docs, why = _documents_for(arch, device_name)
    if not docs:
        return ConfigChoice(default, False, "default", why)
    key = tuned_store.table_key(kernel, scale_mode, kv_dtype, num_q_heads, num_kv_heads)
    held = [(path, note, doc["tables"][key]) for path, doc, note in docs if key in doc["tables"]]
    measured = [entry for entry in held if entry[2]["provenance"]["measured"]]
    if not measured:
        if held:
            path, note, _ = held[0]
            return ConfigChoice(default, False, "default", f"{path}{note} table {key} holds unmeasured defaults",
                                path=str(path))
        where = ", ".join(f"{path}{note}" for path, _, note in docs)
        return ConfigChoice(default, False, "default", f"{where} has no table {key}", path=str(docs[0][0]))
    served = [(path, note, table, *_path_buckets(table, per_token)) for path, note, table in measured]
    served = [entry for entry in served if entry[3]]
    if not served:  # only the other path's studies finished so far
        path, note, _ = measured[0]
        return ConfigChoice(default, False, "default", f"{path}{note} {key} has no bucket for this path",
                            path=str(path))
    # The bucket nearest the call over every file's buckets, from the first file that holds it.
    exact = any(num_tokens in buckets for *_, buckets, _ in served)
    bucket = num_tokens if exact else nearest_bucket({b for *_, buckets, _ in served for b in buckets}, num_tokens)
    path, note, table, buckets, scope = next(entry for entry in served if bucket in entry[3])
    _check_stale(path, table, arch, kernel, scale_mode)
    config = LaunchConfig.from_dict(buckets[bucket]["config"])
    if per_token:
        config = per_token_twin(config, arch)  # already block_t 1 in a per-token sub-entry
    if config.num_splits > topk:  # a bucket tuned for topk 16 used with a smaller topk
        return ConfigChoice(default, False, "default", f"{path}{note} {key} bucket {bucket}: num_splits > topk={topk}",
                            path=str(path))
    source = "tuned:exact" if exact else "tuned:nearest"
    return ConfigChoice(config, True, source, f"{path}{note} {key} bucket {bucket}{scope}", bucket=bucket,
                        path=str(path))


def _path_buckets(table: dict, per_token: bool) -> tuple[dict[int, dict], str]:
    """({tokens: entry} to look the call up in, what the reason adds): the tiled entries; for the
    per-token path its sub-entries when the table has any, else the tiled entries (their twins)."""
    if not per_token:
        return tuned_store.path_entries(table, "tiled"), ""
    own = tuned_store.path_entries(table, tuned_store.PER_TOKEN)
    if own:
        return own, " (its per-token entry)"
    return tuned_store.path_entries(table, "tiled"), " (its per-token twin, block_t 1)"
