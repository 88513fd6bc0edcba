"""What the static gates compile: one launch of one generated kernel, its arch limits and options."""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Mapping

import torch

from ..configs import LaunchConfig
from ..modules import load_module
from ..shapes import DTYPES as Q_DTYPES  # a query's dtype by name (no fp8 queries)
from ..shapes import DECODE_BUCKETS, KV_DTYPES, torch_dtype
from ..tuned_store import REPO_CONFIG_DIR as TUNED_DIR
from ..variants import ARCHS, PAGE_SIZE, WS_SCALE_MODES, Variant, get_arch, has_variant


REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
EXCEPTIONS_PATH = REPO_ROOT / "static_exceptions.json"
CACHE_ENV = "MSA_TUNE_CACHE_DIR"
# Bump when the figures read from an artifact change meaning: old cache entries are then ignored.
FIGURES_VERSION = 1

# What the shipped-config gate covers (see shipped_launches).
SHIPPED_MODES = (("scalar", "fp8"), ("per_token_head", "fp8"), ("none", "bf16"), ("none", "fp8"))
# The unfolded scalar baseline modules (fold_scales=False), gated like the folded ones.
SHIPPED_UNFOLDED_MODES = (("scalar", "fp8"),)
# Decode defaults at every token bucket the tuner knows (so every split count the arch default
# picks, which a GPU without a tuned table runs, is gated) and at one batch large enough for 1 split.
DECODE_TOKEN_COUNTS = (*DECODE_BUCKETS, 1024)


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-target limits a kernel must fit (shared memory per block / LDS per workgroup, registers)."""

    shared_bytes: int
    registers: int
    shared_name: str
    register_unit: str

    def describe(self) -> str:
        return (f"{self.shared_name} <= {self.shared_bytes // 1024} KB ({self.shared_bytes} B), "
                f"registers <= {self.registers} {self.register_unit}, no spills")


# One kernel's compile (Triton + ptxas), measured ahead of time on one CPU core of the static gate's
# machine: above it a config costs a fresh GPU machine more than it tells (tests/gpu must finish
# in 4 minutes cold). The tuner drops candidates over it (codegen.static.check_launch) and the GPU
# suite uses none (tests/static/test_compile_time.py). docs/static-report.md states the figures.
COMPILE_SECONDS_LIMIT = 20.0

LIMITS = {
    "sm90": Limits(ARCHS["sm90"].shared_mem_bytes, 255, "shared memory per block", "per thread"),
    "gfx942": Limits(ARCHS["gfx942"].shared_mem_bytes, 512, "LDS per workgroup", "VGPRs (arch + acc) per wave"),
}


def target_of(arch: str):
    """The Triton compile target of `arch` (what the GPU's own JIT would use)."""
    from triton.backends.compiler import GPUTarget

    get_arch(arch)
    return GPUTarget("cuda", 90, 32) if arch == "sm90" else GPUTarget("hip", "gfx942", 64)


def _backend_classes(arch: str):
    """(backend class, options dataclass) of `arch`'s Triton backend."""
    get_arch(arch)
    if arch == "sm90":
        from triton.backends.nvidia.compiler import CUDABackend, CUDAOptions

        return CUDABackend, CUDAOptions
    from triton.backends.amd.compiler import HIPBackend, HIPOptions

    return HIPBackend, HIPOptions


def validate_options(arch: str, options: Mapping[str, Any]) -> dict:
    """Raises ValueError naming every option that `arch`'s backend does not know.

    Triton silently drops unknown option names (``wavs_per_eu`` compiles as ``waves_per_eu=0``;
    AMD knobs given to the cuda target vanish), so a typo would go unnoticed without this check.
    """
    if not isinstance(options, Mapping):
        raise TypeError(f"options: expected a mapping of option name to value, got {type(options).__name__}")
    _, options_cls = _backend_classes(arch)
    valid = {f.name for f in dataclasses.fields(options_cls)}
    unknown = sorted(set(options) - valid)
    if unknown:
        raise ValueError(f"options: unknown option name(s) {unknown} for {arch} "
                         f"({options_cls.__module__}.{options_cls.__name__}); valid names: {sorted(valid)}")
    return dict(options)


# ---------------------------------------------------------------------------------------------
# What is compiled: one launch of one generated kernel


@dataclasses.dataclass(frozen=True)
class StaticLaunch:
    """One compile of one generated kernel, as a runtime call would launch it."""

    arch: str
    kernel: str  # "prefill" | "prefill_ws" (warp_specialize configs) | "decode_split" | "decode_merge"
    scale_mode: str
    kv_dtype: str  # "fp8" | "bf16" | "fp16"
    num_q_heads: int
    num_kv_heads: int
    config: LaunchConfig
    head_dim: int = 128
    topk: int = 16
    q_dtype: str = "bf16"
    varlen: bool = False
    use_pdl: bool = False
    source: str = "custom"  # where the config comes from ("default", "tuned:<file>", ...): shown in reports
    # False: the unfolded scalar-scale baseline module (<variant>_unfolded; scale mode "scalar" only).
    fold_scales: bool = True
    # False: a cache whose rows Triton cannot see 16-byte aligned (the [pages, Hkv, 128, 2D + 8]
    # buffer's [..., :2D] view): plain loads, and the launch's own constexprs for it (kv_rows_aligned).
    kv_rows_aligned: bool = True
    # decode_split: tokens per request of a uniform (non-varlen) decode launch; 1 is plain decode, which
    # Triton compiles with the value as a constant, >1 the speculative-verify shape (one compile for all).
    decode_query_len: int = 1
    # Other KV dtypes / head layouts whose launches compile identically and were merged into this one.
    also_kv_dtypes: tuple[str, ...] = ()
    also_heads: tuple[str, ...] = ()

    def __post_init__(self):
        for name in ("fold_scales", "kv_rows_aligned"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}: expected a bool, got {type(getattr(self, name)).__name__}")
        Variant(self.arch, self.kernel, self.scale_mode, self.fold_scales)  # validates the names
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype: expected one of {KV_DTYPES}, got {self.kv_dtype!r}")
        if self.q_dtype not in Q_DTYPES:
            raise ValueError(f"q_dtype: expected one of {sorted(Q_DTYPES)}, got {self.q_dtype!r}")
        for name in ("num_q_heads", "num_kv_heads", "head_dim", "topk", "decode_query_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(f"num_q_heads: expected a multiple of num_kv_heads={self.num_kv_heads}, "
                             f"got {self.num_q_heads}")
        if not isinstance(self.config, LaunchConfig):
            raise TypeError(f"config: expected a LaunchConfig, got {type(self.config).__name__}")

    @property
    def variant(self) -> str:
        return Variant(self.arch, self.kernel, self.scale_mode, self.fold_scales).name

    def module(self):
        """The generated module this launch compiles a kernel of."""
        return load_module(self.arch, self.kernel, self.scale_mode, self.fold_scales)

    @property
    def family(self) -> str:
        """The tunable kernel family ("prefill" or "decode") whose config this is."""
        return "prefill" if self.kernel.startswith("prefill") else "decode"

    @property
    def heads(self) -> str:
        return f"{self.num_q_heads}/{self.num_kv_heads}"

    @property
    def id(self) -> str:
        """A readable, unique-enough name: used as the pytest id and in messages."""
        extra = "" if (self.head_dim, self.topk, self.q_dtype, self.varlen) == (128, 16, "bf16", False) else (
            f"-d{self.head_dim}-k{self.topk}-q{self.q_dtype}" + ("-varlen" if self.varlen else ""))
        if self.decode_query_len != 1:
            extra += f"-qlen{self.decode_query_len}"
        return (f"{self.variant}-{self.kv_dtype}-{self.num_q_heads}x{self.num_kv_heads}-"
                f"{config_label(self.arch, self.kernel, self.config).replace(' ', '-')}{extra}")


def config_label(arch: str, kernel: str, config: LaunchConfig) -> str:
    """The config fields that matter to `kernel` on `arch`, short (e.g. "bn64 bt1 w4 st2")."""
    if kernel == "decode_merge":
        return f"sp{config.num_splits} w{config.merge_num_warps}"
    if kernel == "prefill_ws":  # its other fields are fixed (configs.WS_FIXED)
        return f"ws bt{config.block_t} cr{config.convert_rows}"
    parts = [f"bn{config.block_n}"]
    if kernel == "prefill":
        parts.append(f"bt{config.block_t}")
    parts += [f"w{config.num_warps}", f"st{config.num_stages}"]
    if kernel == "decode_split":
        parts.append(f"sp{config.num_splits}" + ("fm" if config.fuses_merge else ""))
    if config.kv_upcast:
        parts.append(f"up{config.kv_upcast}")
    if config.v_early:
        parts.append("ve")
    if get_arch(arch).amd_knobs:
        parts += [f"wpe{config.waves_per_eu}", f"mi{config.matrix_instr_nonkdim}", f"kp{config.kpack}"]
    return " ".join(parts)


def runtime_use_pdl(arch: str, kernel: str) -> bool:
    """What codegen.api does on a GPU: programmatic dependent launch for every sm90 launch."""
    return get_arch(arch).use_pdl and kernel in ("decode_split", "decode_merge", "prefill", "prefill_ws")


def _as_config(config) -> LaunchConfig:
    if isinstance(config, LaunchConfig):
        return config
    return LaunchConfig.from_dict(config)


def prefill_kernel(arch: str, scale_mode: str, config: LaunchConfig, fold_scales: bool = True) -> str:
    """The generated module a prefill config's tiles run: prefill_ws for warp_specialize configs where
    that module exists, else prefill (where a warp_specialize config is then reported as invalid)."""
    if config.warp_specialize and has_variant(arch, "prefill_ws", scale_mode, fold_scales):
        return "prefill_ws"
    return "prefill"


def sample_kv_cache(launch: StaticLaunch) -> torch.Tensor:
    """A small paged cache [pages, Hkv, 128, 2 * head_dim] of the launch's KV dtype."""
    return torch.empty(2, launch.num_kv_heads, PAGE_SIZE, 2 * launch.head_dim,
                       dtype=torch_dtype(launch.arch, launch.kv_dtype))


def check_tile_module(launch: StaticLaunch) -> None:
    """Raises ValueError unless a prefill launch compiles the module its config runs (codegen.api):
    warp_specialize=1 runs the Gluon tile (prefill_ws), at the shapes that module accepts, and no
    other config runs it."""
    if launch.kernel == "prefill_ws":
        _check_ws_launch(launch)
    elif launch.kernel == "prefill" and launch.config.warp_specialize:
        if prefill_kernel(launch.arch, launch.scale_mode, launch.config, launch.fold_scales) == "prefill_ws":
            hint = "compile it as kernel 'prefill_ws' (launches_for does)"
        else:
            archs = ", ".join(arch for arch, spec in ARCHS.items() if spec.gluon_ws)
            hint = (f"there is none for {launch.arch} scale mode {launch.scale_mode!r}"
                    f"{'' if launch.fold_scales else ' unfolded'} (folded {WS_SCALE_MODES} on {archs} only)")
        raise ValueError(f"config.warp_specialize: 1 runs the Gluon tile (prefill_ws), not {launch.variant}; {hint}")


def _check_ws_launch(launch: StaticLaunch) -> None:
    """A prefill_ws launch needs a warp_specialize config and what its module's own `unsupported`
    accepts (GQA, head_dim, an fp8 e4m3fn cache, block_t): codegen.api never runs anything else."""
    if not launch.config.warp_specialize:
        raise ValueError("config.warp_specialize: kernel 'prefill_ws' is the warp-specialized tile, which takes "
                         "warp_specialize=1 (codegen.configs.ws_config), got 0")
    q = torch.empty(1, launch.num_q_heads, launch.head_dim, dtype=Q_DTYPES[launch.q_dtype])
    why = launch.module().unsupported(q=q, kv_cache=sample_kv_cache(launch), num_kv_heads=launch.num_kv_heads,
                                      output=q, config=launch.config)
    if why is not None:
        raise ValueError(f"{launch.variant}: needs {why}")


def launches_for(arch: str, kernel: str, scale_mode: str, kv_dtype: str, num_q_heads: int, num_kv_heads: int,
                 config, *, head_dim: int = 128, topk: int = 16, q_dtype: str = "bf16", varlen: bool = False,
                 source: str = "custom", fold_scales: bool = True) -> list[StaticLaunch]:
    """The kernels one runtime call launches: prefill (prefill_ws for a warp_specialize config); or
    decode_split (+ decode_merge when the config launches a merge kernel: more than one split, not fused).
    fold_scales=False: the unfolded scalar baseline modules (as codegen.api with fold_scales=False)."""
    config = _as_config(config)
    if kernel == "prefill":
        kernels = [prefill_kernel(arch, scale_mode, config, fold_scales)]
    elif kernel == "decode":
        kernels = ["decode_split"] + (["decode_merge"] if config.launches_merge else [])
    else:
        raise ValueError(f"kernel: expected 'prefill' or 'decode' (a runtime call), got {kernel!r}")
    return [StaticLaunch(arch, k, scale_mode, kv_dtype, num_q_heads, num_kv_heads, config, head_dim=head_dim,
                         topk=topk, q_dtype=q_dtype, varlen=varlen, use_pdl=runtime_use_pdl(arch, k), source=source,
                         fold_scales=fold_scales)
            for k in kernels]


