"""The launch configs tests/gpu runs, named once.

The GPU suite's cost on a fresh machine is mostly Triton compiles (ptxas included): every distinct
(config, specialization) compiles once per cold cache. Keeping the suite's configs here lets the
tests share compiled kernels (several tests, one config) and lets the static gate measure what
each of them costs to compile (benchmarks/compile_times.py, docs/static-report.md).
"""
from __future__ import annotations

import dataclasses
import pathlib

from .configs import LaunchConfig
from .tuned_store import PER_TOKEN, path_entries, read_document

# Prefill tiles (block_t > 1) and the per-token walk (block_t 1).
PREFILL_PER_TOKEN = LaunchConfig(block_n=64, block_t=1)
PREFILL_PER_TOKEN_WIDE = LaunchConfig(block_n=128, block_t=1)
PREFILL_TILES = LaunchConfig(block_n=64, block_t=4)
PREFILL = (PREFILL_PER_TOKEN, PREFILL_PER_TOKEN_WIDE, PREFILL_TILES)

# The warp-specialized Gluon tile (sm90, fp8 with scalar or per_token_head scales; config per GQA:
# configs.ws_config): rows converted at a time, the tile's one knob.
PREFILL_WS_CONVERT_ROWS = (16, 32)

# Decode: one split (no merge), split-K with the unfused merge kernel, the fused merge. Five splits
# of 16 blocks leave the last split empty (ceil(16/5) = 4 blocks each): the merge must skip it. The
# graph, top-k tail, NaN and unaligned-cache tests run the same two, so they reuse these kernels.
DECODE_ONE_SPLIT = LaunchConfig(block_n=64, num_splits=1)
DECODE_UNFUSED = LaunchConfig(block_n=64, num_splits=5)
DECODE_FUSED = LaunchConfig(block_n=64, num_splits=5, fused_merge=1)
DECODE_FUSED_ALL = LaunchConfig(block_n=64, num_splits=16, fused_merge=1)  # one block per split
DECODE = (DECODE_ONE_SPLIT, DECODE_UNFUSED, DECODE_FUSED, DECODE_FUSED_ALL)


def prefill_upcast(kv_upcast: int) -> tuple[LaunchConfig, ...]:
    """fp8 K/V through fp32 (1), into fp16 MMAs (2), or V converted fp8 -> fp16 on the way (3)."""
    return (LaunchConfig(block_n=128, kv_upcast=kv_upcast), LaunchConfig(block_n=64, block_t=4, kv_upcast=kv_upcast))


def decode_upcast(kv_upcast: int) -> tuple[LaunchConfig, ...]:
    return (LaunchConfig(block_n=128, num_splits=1, kv_upcast=kv_upcast),
            LaunchConfig(block_n=64, num_splits=8, fused_merge=1, kv_upcast=kv_upcast))


def decode_v_early(kv_dtype: str, fp8_cvt_asm: bool) -> tuple[LaunchConfig, ...]:
    """v_early 1 (V beside K, unpipelined): a one-slice program of 8 warps (the candidate lists' form,
    kv_upcast 3 where the arch has it) and a 64-key walk of several slices a program."""
    upcast = (3 if fp8_cvt_asm else 0) if kv_dtype == "fp8" else 0
    return (LaunchConfig(block_n=128, num_warps=8, num_stages=1, num_splits=16, fused_merge=1, kv_upcast=upcast,
                         v_early=1),
            LaunchConfig(block_n=64, num_stages=1, num_splits=4, fused_merge=1, v_early=1))


# NaN past the sequence, prefill: (block_t, block_n, kv_upcast for fp8). block_t 8 with 8 warps
# stays: it is the one tile that zeroes NaN in the fp8 -> fp16 conversion at the widest tile.
PREFILL_NAN = ((1, 128, 3), (4, 128, 3), (4, 64, 2), (8, 64, 3))


def prefill_nan_config(block_t: int, block_n: int, kv_upcast: int, kv_dtype: str) -> LaunchConfig:
    return LaunchConfig(block_t=block_t, block_n=block_n, num_warps=8 if block_t == 8 else 4,
                        kv_upcast=kv_upcast if kv_dtype == "fp8" else 0)


def suite_configs() -> dict[str, list[LaunchConfig]]:
    """Every distinct config tests/gpu launches, per kernel family (the tuned table's come on top)."""
    prefill = list(PREFILL)
    decode = list(DECODE)
    for upcast in (1, 2):
        prefill += prefill_upcast(upcast)
        decode += decode_upcast(upcast)
    decode += decode_v_early("fp8", True) + decode_v_early("bf16", True)
    for block_t, block_n, upcast in PREFILL_NAN:
        prefill.append(prefill_nan_config(block_t, block_n, upcast, "fp8"))
        prefill.append(prefill_nan_config(block_t, block_n, upcast, "bf16"))
    dedup = lambda items: list(dict.fromkeys(items))  # noqa: E731  (LaunchConfig is frozen: hashable)
    return {"prefill": dedup(prefill), "decode": dedup(decode)}


@dataclasses.dataclass(frozen=True)
class TunedEntry:
    """One distinct config of a tuned table, at the smallest bucket that uses it."""

    table: str  # e.g. "decode/scalar/fp8/64x4"
    bucket: int  # token count
    config: LaunchConfig
    per_token: bool  # prefill's per-token sub-entry (selection="per_token")

    @property
    def id(self) -> str:
        return f"{self.table}@{self.bucket}" + ("-per_token" if self.per_token else "")


def tuned_entries(path: pathlib.Path) -> list[TunedEntry]:
    """Each distinct (table, config, path) of the tuned-config file at `path`, once: the GPU suite
    runs every config the table can hand a user, without one test per bucket."""
    doc = read_document(path)
    found: dict[tuple, TunedEntry] = {}
    for table, body in sorted(doc["tables"].items()):
        # Per path: a bucket may hold either path's entry alone (a run whose budget ran out between
        # the tiled and the per-token studies leaves per-token-only buckets).
        for path_name, per_token in (("tiled", False), (PER_TOKEN, True)):
            for bucket, entry in sorted(path_entries(body, path_name).items()):
                config = LaunchConfig.from_dict(entry["config"])
                found.setdefault((table, config, per_token), TunedEntry(table, bucket, config, per_token))
    return list(found.values())


# The tuned entries run at their bucket's token count or this many, whichever is smaller: the
# config is what is checked (compiles, runs, right), not its speed.
TUNED_MAX_TOKENS = 256


def tuned_case_shape(entry: TunedEntry, query_len: int = 1) -> dict:
    """serving_case keywords for `entry`: decode, min(bucket, 256) tokens as requests of `query_len`
    tokens each (at least one request; > 1: speculative verify, which Triton compiles apart from
    single-token decode); prefill, one chunk of min(bucket, 256) tokens after 3000 cached ones."""
    kernel, mode, kv_dtype, heads = entry.table.split("/")
    if query_len < 1 or (query_len > 1 and kernel != "decode"):
        raise ValueError(f"query_len: expected 1, or > 1 for a decode entry; got {query_len} for {entry.table}")
    hq, hkv = (int(x) for x in heads.split("x"))
    tokens = min(entry.bucket, TUNED_MAX_TOKENS)
    shape = dict(num_q_heads=hq, num_kv_heads=hkv, kv_dtype=kv_dtype, scale_mode=mode, context=3000)
    if kernel == "decode":
        return dict(shape, batch=max(1, tokens // query_len), tokens=query_len)
    return dict(shape, batch=1, tokens=tokens)
