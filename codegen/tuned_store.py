"""tuned_configs/*.json: naming, schema validation and atomic writes.

One file per (arch, normalized device name): ``tuned_configs/<arch>__<DEVICE>.json``. Inside, one
table per (kernel, scale mode, KV dtype, head layout) maps a token-count bucket to a launch config,
with the provenance of the run that measured it; a prefill bucket may also hold a "per_token"
sub-entry, the config tuned for prefill's per-token path (block_t 1, unrelated selections). The schema is documented in
docs/tuned-configs.md and checked by `validate_document` on every load and before every write.
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import tempfile

from .configs import LaunchConfig, validate_config
from .shapes import DTYPES, KV_DTYPES
from .variants import ARCHS, FP8_DTYPES, SCALE_MODES, TUNABLE_KERNELS

SCHEMA = "msa-tune/tuned-configs"
SCHEMA_VERSION = 1
REPO_CONFIG_DIR = pathlib.Path(__file__).resolve().parent.parent / "tuned_configs"
CONFIG_DIR_ENV = "MSA_TUNE_CONFIG_DIR"

_PROVENANCE_KEYS = ("measured", "gpu_name", "arch", "triton", "torch", "cuda", "hip", "inputs_sha256", "date",
                    "command")
# A table's buckets are merged only across runs that agree on these (the workload too: a bucket timed at
# another context or pattern is another measurement, and the merged table's provenance would claim it).
_SOURCE_KEYS = ("measured", "gpu_name", "triton", "inputs_sha256", "workload")
_BUCKET_KEYS = ("config", "is_default", "default_us", "tuned_us", "trials", "failures")
PER_TOKEN = "per_token"  # a bucket entry's sub-entry for prefill's per-token path


class SchemaError(ValueError):
    """A tuned-config document that does not follow the schema."""


def normalize_device_name(name: str) -> str:
    """One key per GPU model, whatever the board variant: all H200 variants -> NVIDIA_H200.

    Rule: NVIDIA names keep the vendor and the model token (letter + digits, e.g. H200, H100, A100,
    B200): 'NVIDIA H200 NVL', 'NVIDIA H200 141GB HBM3e' -> 'NVIDIA_H200'; 'NVIDIA H100 80GB HBM3'
    -> 'NVIDIA_H100'. AMD Instinct names keep the MI model ('AMD Instinct MI300X VF' ->
    'AMD_MI300X'). Anything else: runs of characters outside [A-Za-z0-9] become '_'.
    """
    text = name.strip()
    nvidia = re.search(r"\b([A-Z]{1,2}\d{2,4})\b", text)
    if re.match(r"(?i)^nvidia\b", text) and nvidia:
        return f"NVIDIA_{nvidia.group(1)}"
    amd = re.search(r"\b(MI\d{3}[A-Z]?)\b", text)
    if amd and re.search(r"(?i)\b(amd|instinct)\b", text):
        return f"AMD_{amd.group(1)}"
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_") or "UNKNOWN"


def file_name(arch: str, device: str) -> str:
    return f"{arch}__{normalize_device_name(device)}.json"


# A GPU with no table of its own looks up the table of the GPU it maps to here: same arch and SM count,
# and that table measured on this GPU against the arch defaults. H100 (132 SMs, 3.35 TB/s) -> H200 (132
# SMs, 4.8 TB/s): on an H100 the H200's table ran the quick bench's 18 rows 1.10-4.72x faster than the
# arch defaults and passed the GPU check (results/h100/check-and-v-early, 2026-12-07). A GPU of the same
# arch but another shape (e.g. an H20, 78 SMs) is left out until measured. A table tuned on the GPU
# itself always comes first.
BORROWED_TABLES = {("sm90", "NVIDIA_H100"): "NVIDIA_H200"}


def lender(arch: str, device: str) -> str | None:
    """The normalized device whose table `device` looks up when it has none of its own, or None."""
    return BORROWED_TABLES.get((arch, normalize_device_name(device)))


def kv_dtype_name(dtype) -> str:
    """A KV cache's torch dtype as the tables name it: any fp8 type (e4m3fn, e4m3fnuz) is "fp8"."""
    if dtype in FP8_DTYPES:
        return "fp8"
    for name in KV_DTYPES:
        if DTYPES.get(name) == dtype:
            return name
    raise TypeError(f"kv_cache: expected an fp8, bf16 or fp16 dtype, got {dtype}")


def table_key(kernel: str, scale_mode: str, kv_dtype: str, num_q_heads: int, num_kv_heads: int) -> str:
    return f"{kernel}/{scale_mode}/{kv_dtype}/{num_q_heads}x{num_kv_heads}"


def parse_table_key(key: str) -> tuple[str, str, str, int, int]:
    match = re.fullmatch(r"([a-z_]+)/([a-z_]+)/([a-z0-9]+)/(\d+)x(\d+)", key)
    if not match:
        raise SchemaError(f"table key {key!r}: expected kernel/scale_mode/kv_dtype/<q heads>x<kv heads>")
    kernel, mode, kv_dtype, hq, hkv = match.groups()
    if kernel not in TUNABLE_KERNELS or mode not in SCALE_MODES or kv_dtype not in KV_DTYPES:
        raise SchemaError(f"table key {key!r}: unknown kernel, scale mode or kv dtype")
    return kernel, mode, kv_dtype, int(hq), int(hkv)


def _require(obj, key, kind, where):
    if key not in obj:
        raise SchemaError(f"{where}: missing key {key!r}")
    if kind is not None and not isinstance(obj[key], kind):
        raise SchemaError(f"{where}.{key}: expected {getattr(kind, '__name__', kind)}, got {type(obj[key]).__name__}")
    return obj[key]


def validate_document(doc) -> dict:
    """Checks a parsed document against the schema; returns it, or raises SchemaError naming the spot."""
    if not isinstance(doc, dict):
        raise SchemaError("document: expected a JSON object")
    if doc.get("schema") != SCHEMA or doc.get("schema_version") != SCHEMA_VERSION:
        raise SchemaError(f"document: expected schema {SCHEMA!r} version {SCHEMA_VERSION}, "
                          f"got {doc.get('schema')!r} version {doc.get('schema_version')!r}")
    arch = _require(doc, "arch", str, "document")
    if arch not in ARCHS:
        raise SchemaError(f"document.arch: expected one of {sorted(ARCHS)}, got {arch!r}")
    device = _require(doc, "device", str, "document")
    if device != normalize_device_name(device):
        raise SchemaError(f"document.device: {device!r} is not a normalized device name")
    tables = _require(doc, "tables", dict, "document")
    for key, table in tables.items():
        where = f"tables[{key!r}]"
        kernel, *_ = parse_table_key(key)
        prov = _require(table, "provenance", dict, where)
        for pkey in _PROVENANCE_KEYS:
            _require(prov, pkey, None, f"{where}.provenance")
        if not isinstance(prov["measured"], bool):
            raise SchemaError(f"{where}.provenance.measured: expected a bool")
        if prov["arch"] != arch:
            raise SchemaError(f"{where}.provenance.arch: {prov['arch']!r} in a file for {arch!r}")
        buckets = _require(table, "buckets", dict, where)
        if not buckets:
            raise SchemaError(f"{where}.buckets: expected at least one bucket")
        for bucket, entry in buckets.items():
            bwhere = f"{where}.buckets[{bucket!r}]"
            if not bucket.isdigit() or int(bucket) < 1:
                raise SchemaError(f"{bwhere}: bucket keys are token counts >= 1")
            _validate_bucket(entry, bwhere, arch, kernel)
    return doc


def _validate_bucket(entry, where: str, arch: str, kernel: str) -> None:
    """A bucket entry: the tiled entry's keys, a per_token sub-entry, or both (either study of a
    bucket may finish first when several workers share a run)."""
    if not isinstance(entry, dict):
        raise SchemaError(f"{where}: expected a JSON object")
    if PER_TOKEN not in entry or "config" in entry:
        _validate_entry(entry, where, arch, kernel)
    if PER_TOKEN in entry:
        if kernel != "prefill":
            raise SchemaError(f"{where}.{PER_TOKEN}: only prefill has a per-token path")
        sub = _require(entry, PER_TOKEN, dict, where)
        config = _validate_entry(sub, f"{where}.{PER_TOKEN}", arch, kernel)
        if config.block_t != 1:
            raise SchemaError(f"{where}.{PER_TOKEN}.config.block_t: the per-token path runs block_t 1, "
                              f"got {config.block_t}")


def _validate_entry(entry: dict, where: str, arch: str, kernel: str) -> LaunchConfig:
    """One path's entry: its required keys and a valid launch config (returned)."""
    for key in _BUCKET_KEYS:
        _require(entry, key, None, where)
    try:
        config = LaunchConfig.from_dict(entry["config"], what=f"{where}.config")
        validate_config(config, arch=arch, kernel=kernel)
    except (TypeError, ValueError) as exc:
        raise SchemaError(str(exc)) from None
    return config


def path_entries(table: dict, path: str) -> dict[int, dict]:
    """{tokens: entry} of one launch path in a (validated) table: "tiled", the bucket entries that
    hold a config; "per_token", their per_token sub-entries."""
    if path == PER_TOKEN:
        return {int(b): e[PER_TOKEN] for b, e in table["buckets"].items() if PER_TOKEN in e}
    return {int(b): e for b, e in table["buckets"].items() if "config" in e}


def path_entry(path: str, entry: dict) -> dict:
    """What one launch path's result writes into its bucket entry (the inverse of path_entries):
    the entry itself for "tiled", a per_token sub-entry for "per_token" (merge_bucket keeps the
    other part)."""
    return {PER_TOKEN: entry} if path == PER_TOKEN else entry


def merge_bucket(old: dict | None, new: dict) -> dict:
    """A bucket entry after a write of `new`: the tiled part and the per_token sub-entry are each
    replaced only by a write that carries them, so each path's study publishes without undoing
    the other's."""
    if "config" not in new:  # a per-token result alone
        return dict(old or {}, **new)
    merged = dict(new)
    if old and PER_TOKEN in old and PER_TOKEN not in new:
        merged[PER_TOKEN] = old[PER_TOKEN]
    return merged


def new_document(arch: str, device: str) -> dict:
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "arch": arch,
            "device": normalize_device_name(device), "tables": {}}


def read_document(path: pathlib.Path) -> dict:
    with open(path) as f:
        return validate_document(json.load(f))


def write_document(path: pathlib.Path, doc: dict) -> None:
    """Validates, then writes atomically: a temporary file in the same folder, fsync, rename."""
    validate_document(doc)
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp creates 0600; the file is meant to be shared and committed
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def locked(path: pathlib.Path):
    """An exclusive advisory lock for writing `path`, so concurrent tuners merge instead of
    clobbering. It locks the folder itself (flock on its descriptor), so no lock file is left
    beside the configs; writers of other files in the folder wait too, for a write's few ms."""
    import fcntl

    folder = pathlib.Path(path).parent
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def same_source(old: dict, new: dict, *, but=()) -> bool:
    """Whether two provenances agree on every _SOURCE_KEYS entry (but those named in `but`): a table's
    buckets measured under `old` and `new` are comparable, and merge."""
    return all(old.get(k) == new.get(k) for k in _SOURCE_KEYS if k not in but)


def update_table(path: pathlib.Path, arch: str, device: str, key: str, provenance: dict, buckets: dict,
                 unchanged_paths=None) -> dict:
    """Merges `buckets` ({tokens: entry}, merge_bucket's rules) into table `key` of the file at
    `path` (created if absent), under a lock. A table from another source starts afresh. When only its
    template inputs differ (a measured table, same GPU and Triton), the launch paths
    `unchanged_paths(old inputs_sha256, new inputs_sha256)` names keep their entries (their kernels'
    inputs did not change), each marked with the inputs it was measured under."""
    with locked(path):
        doc = read_document(path) if pathlib.Path(path).exists() else new_document(arch, device)
        table = doc["tables"].get(key)
        if table is None or not same_source(table["provenance"], provenance):
            # measured with other kernels, Triton, GPU or workload: its buckets are not comparable
            old, table = table, {"provenance": provenance, "buckets": {}}
            doc["tables"][key] = table
            kept = ()
            if (old is not None and unchanged_paths is not None and old["provenance"]["measured"]
                    and same_source(old["provenance"], provenance, but=("inputs_sha256",))):
                kept = unchanged_paths(old["provenance"]["inputs_sha256"], provenance["inputs_sha256"])
            for launch_path in kept:
                for tokens, entry in path_entries(old, launch_path).items():
                    entry = dict(entry, measured_inputs_sha256=entry.get("measured_inputs_sha256",
                                                                         old["provenance"]["inputs_sha256"]))
                    table["buckets"][str(tokens)] = merge_bucket(table["buckets"].get(str(tokens)),
                                                                 path_entry(launch_path, entry))
        table["provenance"] = provenance
        for tokens, entry in buckets.items():
            table["buckets"][tokens] = merge_bucket(table["buckets"].get(tokens), entry)
        write_document(path, doc)
    return doc
