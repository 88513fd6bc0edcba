"""Launch configurations: one typed object shared by the runtime, the tuner and the static checks."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from .variants import FP8_DTYPES, PAGE_SIZE, TUNABLE_KERNELS, get_arch

_AMD_KNOBS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")
# LaunchConfig.kv_upcast values (ints, like every field, so that JSON and Optuna params stay plain).
KV_UPCAST_MODES = {0: "direct", 1: "via fp32", 2: "fp16 MMAs", 3: "fp16 MMAs, V converted before its transpose"}


def check_kv_upcast(config: "LaunchConfig", kv_dtype) -> None:
    """kv_upcast is a choice about converting fp8; on a bf16/fp16 cache only 0 means anything."""
    if config.kv_upcast != 0 and kv_dtype not in FP8_DTYPES:
        raise ValueError(f"config.kv_upcast: {config.kv_upcast} ({KV_UPCAST_MODES.get(config.kv_upcast)}) is for "
                         f"fp8 KV caches; this cache is {str(kv_dtype).removeprefix('torch.')}, use 0")


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """Launch parameters of one kernel family on one arch.

    block_n: keys per inner step (divides the 128-token page).
    block_t: prefill only; query tokens per program sharing the loads of their selected pages
        (1 = the per-token path).
    num_splits: decode only; top-k pages are split across this many programs (1 = one launch).
    merge_num_warps: decode only; warps of the merge kernel (unused with one split or a fused merge).
    fused_merge: decode only, with num_splits > 1; 1 = no merge kernel: the last split program of a
        (token, KV head) to finish merges the partials itself (one launch), 0 = a second launch.
    kv_upcast: fp8 caches only; how K/V reach the MMAs. 0 = converted to the query's dtype,
        1 = through fp32 (a different instruction sequence, sometimes faster), 2 = Q, K, P and V
        enter the MMAs as fp16 (e4m3 -> fp16 is one instruction and exact; Q and P keep 3 more
        mantissa bits than bf16; the kernel keeps Q and P inside fp16's range by itself).
        3 = as 2, with V converted to fp16 in its load layout before the MMA's transpose (sm90): as
        fp8 the transpose reads shared memory a byte at a time (results/h200/decode-vcvt).
    kv_tma: 1 = K/V slices are read through TMA descriptors where the arch has them (sm90) and the
        cache allows (16-byte aligned), else plain loads; 0 = always plain loads. A TMA box holds a
        whole slice in shared memory: fewer registers for the pointers, more shared memory, so which
        is faster depends on the path (on the H200 the bf16 per-token prefill walk took 127 registers
        and 55 KB with TMA, 104 and 39 KB without).
    warp_specialize: prefill, sm90, fp8 cache with scalar or per_token_head scales. 1 = the Gluon
        tile (templates/prefill_ws.py.jinja): 128 rows a program (block_t = 128 // GQA), a page a
        step (block_n 128), 8 MMA warps fed fp16 K/V by 4 converter warps (num_warps 8 counts the
        MMA warps; num_stages 2: the fp8 and fp16 rings; kv_upcast 2: fp16 MMAs; kv_tma 1).
    v_early: decode only, with num_stages 1; 1 = each slice's V (and per_token_head's column
        scales) is loaded beside its K, before the scores, instead of after the softmax: a one-slice
        program's V load no longer waits behind QK and the softmax (results/h100/check-and-v-early),
        at the price of V's registers held across them. With num_stages > 1 the pipeliner already
        issues the next slices' loads ahead, so it is refused there.
    convert_rows: with warp_specialize only; rows of a K/V page the converter warps convert at a
        time (fewer: fewer registers, more barriers). 0 without warp_specialize.
    waves_per_eu, matrix_instr_nonkdim, kpack: gfx942 only (0 / 0 / 1 mean "backend default").
    """

    block_n: int = 64
    block_t: int = 1
    num_warps: int = 4
    num_stages: int = 2
    num_splits: int = 1
    merge_num_warps: int = 4
    fused_merge: int = 0
    kv_upcast: int = 0
    kv_tma: int = 1
    warp_specialize: int = 0
    v_early: int = 0
    convert_rows: int = 0
    waves_per_eu: int = 0
    matrix_instr_nonkdim: int = 0
    kpack: int = 1

    def __post_init__(self):
        # The same type check a dict gets (from_dict), so an object built by hand cannot carry a
        # bool or a float into the kernels' integer arithmetic.
        for field in dataclasses.fields(self):
            check_field_type(f"config.{field.name}", getattr(self, field.name))

    @property
    def fuses_merge(self) -> bool:
        """Decode: the split kernel merges its partials itself (no second launch)."""
        return self.num_splits > 1 and bool(self.fused_merge)

    @property
    def launches_merge(self) -> bool:
        """Decode: a second launch (the merge kernel) reduces the split kernel's partials."""
        return self.num_splits > 1 and not self.fused_merge

    def non_default(self) -> dict[str, int]:
        """The fields that differ from LaunchConfig's defaults, sorted by name."""
        return non_default_fields(self.to_dict())

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], *, what: str = "config") -> "LaunchConfig":
        if not isinstance(values, Mapping):
            raise TypeError(f"{what}: expected a LaunchConfig or a mapping, got {type(values).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{what}: unknown key(s) {unknown}; expected a subset of {sorted(known)}")
        for key, value in values.items():
            check_field_type(f"{what}.{key}", value)
        return cls(**values)


def check_field_type(name: str, value) -> None:
    """Every LaunchConfig field is a plain int: bools and floats (even 64.0) are refused."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {value!r}")


def non_default_fields(values: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of a config mapping that differ from LaunchConfig's defaults, sorted by name. Keys
    LaunchConfig does not know are kept (a study written by another version still shows them)."""
    default = LaunchConfig().to_dict()
    return {k: v for k, v in sorted(values.items()) if default.get(k) != v}


def _power_of_two(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def validate_config(config: LaunchConfig, *, arch: str, kernel: str, topk: int | None = None) -> LaunchConfig:
    """Raises ValueError naming the field when `config` cannot run `kernel` on `arch`."""
    spec = get_arch(arch)
    if kernel not in TUNABLE_KERNELS:
        raise ValueError(f"kernel: expected one of {TUNABLE_KERNELS}, got {kernel!r}")
    if not isinstance(config, LaunchConfig):
        raise TypeError(f"config: expected a LaunchConfig, got {type(config).__name__}")
    if not (_power_of_two(config.block_n) and 16 <= config.block_n <= PAGE_SIZE):
        raise ValueError(f"config.block_n: expected a power of two in [16, {PAGE_SIZE}], got {config.block_n}")
    if not (_power_of_two(config.block_t) and config.block_t <= 16):
        raise ValueError(f"config.block_t: expected a power of two in [1, 16], got {config.block_t}")
    if kernel == "decode" and config.block_t != 1:
        raise ValueError(f"config.block_t: prefill-only (tokens per program); decode takes 1, got {config.block_t}")
    for field in ("num_warps", "merge_num_warps"):
        value = getattr(config, field)
        if not (_power_of_two(value) and value <= 16):
            raise ValueError(f"config.{field}: expected a power of two in [1, 16], got {value}")
    if config.fused_merge not in (0, 1):
        raise ValueError(f"config.fused_merge: expected 0 or 1, got {config.fused_merge}")
    if config.fused_merge and kernel != "decode":
        raise ValueError("config.fused_merge: a decode-only parameter, leave it 0 for prefill")
    if config.kv_upcast not in KV_UPCAST_MODES:
        raise ValueError(f"config.kv_upcast: expected one of {sorted(KV_UPCAST_MODES)} "
                         f"({', '.join(f'{k} = {v}' for k, v in KV_UPCAST_MODES.items())}), got {config.kv_upcast}")
    if config.kv_upcast == 3 and not spec.fp8_cvt_asm:
        raise ValueError(f"config.kv_upcast: 3 ({KV_UPCAST_MODES[3]}) exists on archs with PTX's e4m3 "
                         f"conversion (sm90), not on {arch}")
    if config.kv_tma not in (0, 1):
        raise ValueError(f"config.kv_tma: expected 0 (plain loads) or 1 (TMA where available), got {config.kv_tma}")
    if not 1 <= config.num_stages <= 8:
        raise ValueError(f"config.num_stages: expected 1..8, got {config.num_stages}")
    if config.v_early not in (0, 1):
        raise ValueError(f"config.v_early: expected 0 (V loaded after the softmax) or 1 (beside K), got {config.v_early}")
    if config.v_early and kernel != "decode":
        raise ValueError("config.v_early: a decode-only parameter, leave it 0 for prefill")
    if config.v_early and config.num_stages != 1:
        raise ValueError(f"config.v_early: 1 needs num_stages 1 (with {config.num_stages} stages the pipeliner "
                         f"loads the next slices' V ahead already), got num_stages {config.num_stages}")
    if kernel == "prefill" and (config.num_splits != 1 or config.merge_num_warps != LaunchConfig.merge_num_warps):
        raise ValueError("config.num_splits / config.merge_num_warps: decode-only parameters, leave them at their defaults for prefill")
    if config.num_splits < 1 or (topk is not None and config.num_splits > topk):
        bound = f"[1, topk={topk}]" if topk is not None else ">= 1"
        raise ValueError(f"config.num_splits: expected {bound}, got {config.num_splits}")
    _validate_warp_specialize(config, spec, kernel)
    if spec.amd_knobs:
        if config.waves_per_eu not in range(0, 9):
            raise ValueError(f"config.waves_per_eu: expected 0..8, got {config.waves_per_eu}")
        if config.matrix_instr_nonkdim not in (0, 16, 32):
            raise ValueError(f"config.matrix_instr_nonkdim: expected 0, 16 or 32, got {config.matrix_instr_nonkdim}")
        if config.kpack not in (1, 2):
            raise ValueError(f"config.kpack: expected 1 or 2, got {config.kpack}")
    else:
        defaults = LaunchConfig()
        for knob in _AMD_KNOBS:
            if getattr(config, knob) != getattr(defaults, knob):
                raise ValueError(f"config.{knob}: an AMD (gfx942) launch option, not available on {arch}")
    return config


# The fields a warp-specialized (Gluon) tile fixes: its design, not knobs (LaunchConfig's docstring).
WS_FIXED = dict(block_n=128, num_warps=8, num_stages=2, kv_upcast=2, kv_tma=1)
WS_CONVERT_ROWS = (16, 32, 64, 128)


def _validate_warp_specialize(config: LaunchConfig, spec, kernel: str) -> None:
    if config.warp_specialize not in (0, 1):
        raise ValueError(f"config.warp_specialize: expected 0 (Triton-language tile) or 1 (Gluon tile), "
                         f"got {config.warp_specialize}")
    if not config.warp_specialize:
        if config.convert_rows != 0:
            raise ValueError(f"config.convert_rows: a warp_specialize=1 parameter, leave it 0, got {config.convert_rows}")
        return
    if kernel != "prefill" or not spec.gluon_ws:
        raise ValueError(f"config.warp_specialize: 1 is a prefill tile written for sm90, not {kernel} on {spec.name}")
    if config.block_t < 2:
        raise ValueError(f"config.block_t: the warp-specialized tile holds 128 // GQA tokens, got {config.block_t}")
    for field, value in WS_FIXED.items():
        if getattr(config, field) != value:
            raise ValueError(f"config.{field}: the warp-specialized tile (warp_specialize=1) takes {value}, "
                             f"got {getattr(config, field)}")
    if config.convert_rows not in WS_CONVERT_ROWS:
        raise ValueError(f"config.convert_rows: expected one of {WS_CONVERT_ROWS} with warp_specialize=1, "
                         f"got {config.convert_rows}")


def ws_config(*, gqa: int, convert_rows: int = 32) -> LaunchConfig:
    """The warp-specialized tile's config for a GQA ratio (block_t = 128 // GQA)."""
    return LaunchConfig(block_t=128 // gqa, warp_specialize=1, convert_rows=convert_rows, **WS_FIXED)


# Untuned defaults per arch: the tuner's first trial and the fallback when no tuned entry exists.
# gfx942 keeps tiles smaller (64 KB LDS per workgroup) and asks for 2 waves per EU.
_ARCH_DEFAULTS = {
    ("sm90", "prefill"): LaunchConfig(block_n=64, num_warps=4, num_stages=2),
    ("sm90", "decode"): LaunchConfig(block_n=64, num_warps=4, num_stages=2),
    ("gfx942", "prefill"): LaunchConfig(block_n=64, num_warps=4, num_stages=1, waves_per_eu=2, matrix_instr_nonkdim=16, kpack=1),
    # block_n 32: the decode step holds a slice's K and V tiles at once (loaded together, as TMA
    # wants on sm90); at 64, per_token_head spills 48 VGPRs at the 64/4 layout (static report).
    ("gfx942", "decode"): LaunchConfig(block_n=32, num_warps=4, num_stages=1, waves_per_eu=2, matrix_instr_nonkdim=16, kpack=1),
}

# Aim for about this many decode programs so small batches still fill the GPU (132 SMs on H200,
# 304 CUs on MI300X): the split count grows as the batch shrinks. Depends on shapes only, so a
# captured CUDA graph stays valid.
_DECODE_TARGET_PROGRAMS = {"sm90": 264, "gfx942": 608}


def per_token_twin(config: LaunchConfig, arch: str) -> LaunchConfig:
    """The per-token path's config for a tiled one: the same at block_t 1; a warp-specialized tile has
    no per-token form, so it gives the arch's default prefill config at block_t 1."""
    if config.warp_specialize:
        return dataclasses.replace(_ARCH_DEFAULTS[(arch, "prefill")], block_t=1)
    return dataclasses.replace(config, block_t=1)


def default_config(arch: str, kernel: str, *, num_tokens: int, num_kv_heads: int, topk: int = 16) -> LaunchConfig:
    get_arch(arch)
    if kernel not in TUNABLE_KERNELS:
        raise ValueError(f"kernel: expected one of {TUNABLE_KERNELS}, got {kernel!r}")
    base = _ARCH_DEFAULTS[(arch, kernel)]
    if kernel == "prefill":
        return base
    programs = max(1, num_tokens * num_kv_heads)
    splits = 1
    while splits * 2 <= topk and programs * splits * 2 <= _DECODE_TARGET_PROGRAMS[arch]:
        splits *= 2
    return dataclasses.replace(base, num_splits=splits)
