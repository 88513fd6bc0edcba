"""Search spaces: which launch parameters a study varies, per kernel and arch."""
from __future__ import annotations

import dataclasses
import itertools
import json

from ..configs import LaunchConfig, default_config, per_token_twin, validate_config, ws_config
from ..tuned_store import normalize_device_name
from ..variants import get_arch, has_variant
from .smoke import DEVICE as INTERPRETER

# Choices per parameter. Order matters only for readability of the study.
_COMMON = {"block_n": (32, 64, 128), "num_warps": (4, 8), "num_stages": (1, 2, 3)}
_PREFILL = {"block_t": (1, 2, 4, 8)}
# Decode on sm90 reads pages through TMA boxes: a 4th stage keeps three slices in flight. One warp:
# the softmax over a slice's keys needs no reduction across warps (the kernel runs below what its
# page stream allows, results/h200/decode-stream); bn32/bn64 fit without spills (unmeasured).
# v_early: V beside K in an unpipelined loop (LaunchConfig.v_early), asked only at num_stages 1.
_DECODE = {"num_splits": (1, 2, 4, 8, 16), "num_warps": (1, 2, 4, 8), "num_stages": (1, 2, 3, 4),
           "fused_merge": (0, 1), "merge_num_warps": (1, 2, 4), "v_early": (0, 1)}
_FP8 = {"kv_upcast": (0, 1, 2)}  # how fp8 K/V reach the MMAs (configs.KV_UPCAST_MODES)
_AMD = {"waves_per_eu": (0, 1, 2, 4), "matrix_instr_nonkdim": (16, 32), "kpack": (1, 2)}
_TMA = {"kv_tma": (1, 0)}  # archs with TMA: descriptors or plain loads (configs.LaunchConfig.kv_tma)
# The Gluon tile (LaunchConfig.warp_specialize): its one knob; every other field is its design (configs.WS_FIXED).
# 64 rows spill in the converter warps (static gate, triton 3.6).
WS_CONVERT_ROWS_SEARCHED = (16, 32)


def ws_gqa(arch: str, kernel: str, scale_mode: str | None, kv_dtype: str, num_q_heads: int, num_kv_heads: int,
           path: str = "tiled") -> int | None:
    """The GQA ratio when a study of this table also searches the Gluon tile (prefill tiles, an fp8
    cache with scalar or per_token_head scales on sm90, GQA 8 or 16), else None (scale_mode None too)."""
    gqa = num_q_heads // num_kv_heads
    if (kernel == "prefill" and path == "tiled" and kv_dtype == "fp8" and gqa in (8, 16)
            and has_variant(arch, "prefill_ws", scale_mode)):
        return gqa
    return None


def bucket_ws_gqa(bucket) -> int | None:
    """ws_gqa of a bucket's study; None under the Triton interpreter, where the Gluon tile cannot
    run (every such trial would fail with "needs a GPU")."""
    if bucket.device == normalize_device_name(INTERPRETER):
        return None
    return ws_gqa(bucket.arch, bucket.kernel, bucket.scale_mode, bucket.kv_dtype, bucket.num_q_heads,
                  bucket.num_kv_heads, bucket.path)


def bucket_space(bucket) -> list[LaunchConfig]:
    """enumerate_space of a bucket's study: the Gluon tile's configs only where bucket_ws_gqa allows them."""
    return enumerate_space(bucket.arch, bucket.kernel, num_q_heads=bucket.num_q_heads, num_kv_heads=bucket.num_kv_heads,
                           topk=bucket.topk, kv_dtype=bucket.kv_dtype, path=bucket.path,
                           scale_mode=bucket.scale_mode if bucket_ws_gqa(bucket) else None)


def choices(arch: str, kernel: str, topk: int = 16, kv_dtype: str = "bf16", path: str = "tiled",
            gqa: int | None = None) -> dict[str, tuple]:
    """The values each searched parameter takes. path "per_token": prefill's per-token path, whose
    block_t is fixed to 1 (the LaunchConfig default), so it is not searched. gqa (ws_gqa): the Gluon
    tile is searched too, warp_specialize first (with 1 only convert_rows is asked)."""
    space = {"warp_specialize": (0, 1)} if gqa else {}
    space.update(_COMMON)
    space.update(_PREFILL if kernel == "prefill" else _DECODE)
    if path == "per_token":
        del space["block_t"]
    if kernel == "decode":
        space["num_splits"] = tuple(s for s in space["num_splits"] if s <= topk)
    if kv_dtype == "fp8":
        space.update(_FP8)
        if get_arch(arch).fp8_cvt_asm:
            space["kv_upcast"] += (3,)
    if get_arch(arch).amd_knobs:
        space.update(_AMD)
    if get_arch(arch).kv_tma:
        space.update(_TMA)
    if gqa:
        space["convert_rows"] = WS_CONVERT_ROWS_SEARCHED
    return space


def normalize(config: LaunchConfig) -> LaunchConfig:
    """Parameters that do nothing in this config take their defaults, so equal launches compare equal."""
    if config.num_splits == 1:
        config = dataclasses.replace(config, fused_merge=LaunchConfig.fused_merge)
    if not config.launches_merge:
        config = dataclasses.replace(config, merge_num_warps=LaunchConfig.merge_num_warps)
    if config.num_stages != 1:  # v_early exists only unpipelined (validate_config refuses it with stages)
        config = dataclasses.replace(config, v_early=LaunchConfig.v_early)
    return config


def config_key(config: LaunchConfig) -> str:
    return json.dumps(normalize(config).to_dict(), sort_keys=True)


def plausible(config: LaunchConfig, *, num_q_heads: int, num_kv_heads: int) -> bool:
    """Cheap filter before anything compiles: at most 128 rows per tile."""
    gqa = num_q_heads // num_kv_heads
    rows = config.block_t * (1 << max(gqa - 1, 0).bit_length())
    return rows <= 128


def enumerate_space(arch: str, kernel: str, *, num_q_heads: int, num_kv_heads: int, topk: int = 16,
                    kv_dtype: str = "bf16", path: str = "tiled", scale_mode: str | None = None) -> list[LaunchConfig]:
    """Every distinct plausible config of the space (for exhaustive search and for tests); with
    scale_mode, the Gluon tile's configs too where ws_gqa allows them."""
    gqa = ws_gqa(arch, kernel, scale_mode, kv_dtype, num_q_heads, num_kv_heads, path)
    space = choices(arch, kernel, topk, kv_dtype, path)
    names = list(space)
    seen, configs = set(), []
    for values in itertools.product(*(space[n] for n in names)):
        config = normalize(LaunchConfig(**dict(zip(names, values))))
        key = config_key(config)
        if key in seen or not plausible(config, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads):
            continue
        validate_config(config, arch=arch, kernel=kernel, topk=topk)
        seen.add(key)
        configs.append(config)
    if gqa:
        configs += [ws_config(gqa=gqa, convert_rows=rows) for rows in WS_CONVERT_ROWS_SEARCHED]
    return configs


def _asked(name: str, values: dict) -> bool:
    """fused_merge only matters with splits, merge_num_warps only with a merge kernel, v_early only at
    num_stages 1; the Gluon tile (warp_specialize 1) has convert_rows as its only knob, which nothing
    else has."""
    if values.get("warp_specialize") == 1:
        return name == "convert_rows"
    if name == "convert_rows":
        return False
    if name == "fused_merge":
        return values.get("num_splits", 1) > 1
    if name == "merge_num_warps":
        return values.get("num_splits", 1) > 1 and not values.get("fused_merge", 0)
    if name == "v_early":
        return values.get("num_stages") == 1
    return True


def _config_of(values: dict, gqa: int | None) -> LaunchConfig:
    if values.get("warp_specialize") == 1:
        return ws_config(gqa=gqa, convert_rows=values["convert_rows"])
    return normalize(LaunchConfig(**values))


def suggest(trial, arch: str, kernel: str, topk: int = 16, kv_dtype: str = "bf16", path: str = "tiled",
            gqa: int | None = None) -> LaunchConfig:
    """Define-by-run sampling for Optuna: a parameter is asked only where it does something."""
    space = choices(arch, kernel, topk, kv_dtype, path, gqa)
    values = {}
    for name, options in space.items():
        if not _asked(name, values):
            continue
        values[name] = trial.suggest_categorical(name, list(options))
    return _config_of(values, gqa)


def params_of(config: LaunchConfig, arch: str, kernel: str, topk: int = 16, kv_dtype: str = "bf16",
              path: str = "tiled", gqa: int | None = None) -> dict:
    """The Optuna params that make `suggest` return `config` (for enqueue_trial)."""
    config = normalize(config)
    space = choices(arch, kernel, topk, kv_dtype, path, gqa)
    params = {}
    for name in space:
        if not _asked(name, params):
            continue
        params[name] = getattr(config, name)
    return params


def check_candidate(config: LaunchConfig, *, arch: str, kernel: str, num_q_heads: int, num_kv_heads: int,
                    topk: int = 16, kv_dtype: str = "bf16", scale_mode: str | None = None,
                    what: str = "config") -> None:
    """Raises ValueError (naming `what` and the field) unless a study of this table can run `config`
    as given: a valid launch, every searched parameter among the space's choices, no unsearched
    parameter away from its default (the study would silently measure another config), and at
    most 128 rows per tile."""
    try:
        validate_config(config, arch=arch, kernel=kernel, topk=topk)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None
    gqa = ws_gqa(arch, kernel, scale_mode, kv_dtype, num_q_heads, num_kv_heads)
    if config.warp_specialize:
        if gqa is None:
            raise ValueError(f"{what}: warp_specialize=1 (the Gluon tile) is not searched for {kernel} on {arch} "
                             f"({scale_mode} scales, {kv_dtype} cache, {num_q_heads}/{num_kv_heads} heads)")
        if config != ws_config(gqa=gqa, convert_rows=config.convert_rows):
            raise ValueError(f"{what}: a warp_specialize=1 config is configs.ws_config(gqa={gqa}, convert_rows=N), "
                             f"got {config.non_default()}")
    space = choices(arch, kernel, topk, kv_dtype, gqa=gqa)
    asked = params_of(config, arch, kernel, topk, kv_dtype, gqa=gqa)
    for name, value in asked.items():
        if value not in space[name]:
            raise ValueError(f"{what}: {name}={value} is outside the {kernel} search space on {arch} "
                             f"({kv_dtype} cache); expected one of {list(space[name])}")
    default = ws_config(gqa=gqa, convert_rows=config.convert_rows) if config.warp_specialize else LaunchConfig()
    for name, value in normalize(config).to_dict().items():
        if name not in asked and value != getattr(default, name):
            raise ValueError(f"{what}: {name}={value} is not searched for {kernel} on {arch} ({kv_dtype} cache); "
                             f"leave it at its default {getattr(default, name)}")
    if not plausible(config, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads):
        raise ValueError(f"{what}: block_t={config.block_t} gives more than 128 rows per tile at "
                         f"{num_q_heads}/{num_kv_heads} heads")


def for_path(config: LaunchConfig, path: str, arch: str) -> LaunchConfig:
    """The config a study of `path` runs for `config`: on the per-token path its twin, block_t 1
    (how seeds, candidates and the default of a table reach a per-token study; configs.per_token_twin)."""
    return per_token_twin(config, arch) if path == "per_token" else config


def default_for(bucket) -> LaunchConfig:
    """The arch default a bucket's study starts from and is confirmed against (per-token: its twin,
    the config the loader falls back to for that path)."""
    config = default_config(bucket.arch, bucket.kernel, num_tokens=bucket.tokens, num_kv_heads=bucket.num_kv_heads,
                            topk=bucket.topk)
    return normalize(for_path(config, bucket.path, bucket.arch))
