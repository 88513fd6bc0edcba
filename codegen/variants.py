"""Variant descriptions: the single source of every generated module's name.

A variant is one (arch, kernel, scale mode) triple. Its ``name`` is the generated module's
file name, the key under which tuned configs are stored and the compile-cache key prefix, so
those three can never drift apart.
"""
from __future__ import annotations

import dataclasses

import torch

SCALE_MODES = ("none", "scalar", "per_token_head")
KERNELS = ("prefill", "decode_split", "decode_merge", "prefill_ws")
# prefill_ws: the warp-specialized Gluon prefill tile (LaunchConfig.warp_specialize), on archs with
# ArchSpec.gluon_ws and for the fp8 scale modes below; every other variant exists on every arch.
WS_SCALE_MODES = ("scalar", "per_token_head")
# The kernel families a user tunes; decode_split and decode_merge are launched together.
TUNABLE_KERNELS = ("prefill", "decode")

PAGE_SIZE = 128  # tokens per KV page; also the sparse block size of MiniMax-M3


@dataclasses.dataclass(frozen=True)
class ArchSpec:
    """What differs between GPU architectures, as template parameters (never template copies)."""

    name: str
    fp8_dtype: torch.dtype  # the fp8 KV-cache element type this arch's hardware converts natively
    use_pdl: bool  # programmatic dependent launch (Hopper): the merge kernel's prologue overlaps
    amd_knobs: bool  # waves_per_eu / matrix_instr_nonkdim / kpack are launch options
    kv_tma: bool  # the decode kernel reads K/V pages through TMA descriptors (Hopper's copy engine)
    # PTX converts e4m3 to fp16 two values an instruction (cvt.rn.f16x2.e4m3x2): kv_upcast 3.
    fp8_cvt_asm: bool
    shared_mem_bytes: int  # per block (sm90) or workgroup LDS (gfx942): limit for configs
    gluon_ws: bool  # the warp-specialized Gluon prefill tile (prefill_ws) is written for this arch


ARCHS: dict[str, ArchSpec] = {
    "sm90": ArchSpec(
        name="sm90",
        fp8_dtype=torch.float8_e4m3fn,
        use_pdl=True,
        amd_knobs=False,
        kv_tma=True,
        fp8_cvt_asm=True,
        shared_mem_bytes=227 * 1024,
        gluon_ws=True,
    ),
    "gfx942": ArchSpec(
        name="gfx942",
        fp8_dtype=torch.float8_e4m3fnuz,
        use_pdl=False,
        amd_knobs=True,
        kv_tma=False,
        fp8_cvt_asm=False,
        shared_mem_bytes=64 * 1024,
        gluon_ws=False,
    ),
}

# Every arch's fp8 KV-cache type: the dtypes that make a cache "fp8".
FP8_DTYPES = tuple(spec.fp8_dtype for spec in ARCHS.values())

def get_arch(arch: str) -> ArchSpec:
    if arch not in ARCHS:
        raise ValueError(f"arch: expected one of {sorted(ARCHS)}, got {arch!r}")
    return ARCHS[arch]


@dataclasses.dataclass(frozen=True)
class Variant:
    arch: str
    kernel: str
    scale_mode: str
    fold_scales: bool = True  # False: the seed's unfolded scalar baseline (scales every K/V element)

    def __post_init__(self):
        get_arch(self.arch)
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel: expected one of {KERNELS}, got {self.kernel!r}")
        if self.scale_mode not in SCALE_MODES:
            raise ValueError(f"scale_mode: expected one of {SCALE_MODES}, got {self.scale_mode!r}")

        if not self.fold_scales and self.scale_mode != "scalar":
            raise ValueError(f"fold_scales: only the scalar mode has an unfolded baseline, not {self.scale_mode!r}")
        if self.kernel == "prefill_ws":
            if not get_arch(self.arch).gluon_ws:
                raise ValueError(f"kernel: prefill_ws (the Gluon warp-specialized tile) is written for sm90, not {self.arch!r}")
            if self.scale_mode not in WS_SCALE_MODES or not self.fold_scales:
                raise ValueError(f"scale_mode: prefill_ws takes an fp8 cache with scales {WS_SCALE_MODES}, "
                                 f"not {self.scale_mode!r}{'' if self.fold_scales else ' unfolded'}")

    @property
    def name(self) -> str:
        suffix = "" if self.fold_scales else "_unfolded"
        return f"{self.arch}_{self.kernel}_{self.scale_mode}{suffix}"

    @property
    def module(self) -> str:
        return f"codegen.generated.{self.name}"

    @property
    def template(self) -> str:
        return f"{self.kernel}.py.jinja"


def has_variant(arch: str, kernel: str, scale_mode: str, fold_scales: bool = True) -> bool:
    """Whether (arch, kernel, scale mode) has a generated module (prefill_ws exists for some only)."""
    if kernel != "prefill_ws":
        return fold_scales or scale_mode == "scalar"
    return get_arch(arch).gluon_ws and scale_mode in WS_SCALE_MODES and fold_scales


def all_variants() -> list[Variant]:
    folded = [Variant(a, k, m) for a in ARCHS for k in KERNELS for m in SCALE_MODES if has_variant(a, k, m)]
    return folded + [Variant(a, k, "scalar", fold_scales=False) for a in ARCHS for k in KERNELS
                     if has_variant(a, k, "scalar", False)]
