"""Static resource gates: compile a generated kernel ahead of time, on the CPU, and read its resources.

`compile_report` compiles one (arch, kernel, scale mode, KV dtype, head layout, config) for
sm90 (``GPUTarget("cuda", 90, 32)``) or gfx942 (``GPUTarget("hip", "gfx942", 64)``) and returns a
`ResourceReport`: registers, spills, scratch, shared memory / LDS, occupancy (gfx942), the matrix
instructions used, and the limit violations (`problems`). `check_launch` does the same for what
one runtime call launches (decode = split kernel, plus the merge kernel when num_splits > 1);
the tuner uses it to drop a candidate before spending GPU time on it. `shipped_launches` and
`report` cover every shipped (module, config); `python -m codegen.static_cli` is the command line.

Figures come from the artifacts the GPU would load:
- sm90: registers, stack and local memory from ``cuobjdump --dump-resource-usage`` on the cubin
  (what ``CUfunction`` attributes report: triton's ``n_regs``; ``n_spills`` is local size / 4);
  spill bytes from triton's own ptxas log (``N bytes spill stores``); shared memory is
  ``metadata.shared`` (the dynamic shared memory triton launches with and checks against the
  device limit); wgmma vs mma.sync from the PTX.
- gfx942: the AMDGPU metadata in the amdgcn text (``.vgpr_count`` including AGPRs,
  ``.agpr_count``, ``.vgpr_spill_count``, ``; ScratchSize``, ``; Occupancy``); LDS is
  ``metadata.shared`` (the amdgcn text says 0 because triton allocates LDS dynamically).

Compiled figures are cached as JSON (never binaries) under ``$MSA_TUNE_CACHE_DIR`` or
``~/.cache/msa-tune/static``, keyed by the template-input hash and text of the generated module,
the arch, the kernel, the scale mode and fold_scales (False: the unfolded scalar baseline module,
``<variant>_unfolded``), the signature/specialization, constexprs, options, dtypes and the Triton
version. Limits are applied when a report is built, so changing a limit needs no recompile.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import io
import json
import multiprocessing
import os
import pathlib
import re
import subprocess
import tempfile
import time
import warnings
from typing import Any, Iterable, Mapping

import torch
import triton

from .api import load_module
from .configs import LaunchConfig, default_config, validate_config
from .variants import ARCHS, KERNELS, PAGE_SIZE, Variant, get_arch

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
TUNED_DIR = REPO_ROOT / "tuned_configs"
EXCEPTIONS_PATH = REPO_ROOT / "static_exceptions.json"
CACHE_ENV = "MSA_TUNE_CACHE_DIR"
# Bump when the figures read from an artifact change meaning: old cache entries are then ignored.
FIGURES_VERSION = 1

KV_DTYPES = ("fp8", "bf16", "fp16")
Q_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_KV_TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16}

# What the shipped-config gate covers (see shipped_launches).
SHIPPED_MODES = (("scalar", "fp8"), ("per_token_head", "fp8"), ("none", "bf16"), ("none", "fp8"))
# The unfolded scalar baseline modules (fold_scales=False), gated like the folded ones.
SHIPPED_UNFOLDED_MODES = (("scalar", "fp8"),)
HEAD_LAYOUTS = {"TP1": (64, 4), "TP4": (16, 1), "TP8": (8, 1)}
# One decode batch small enough to get the most splits, one large enough to get a single split.
DECODE_TOKEN_COUNTS = (1, 1024)


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
    kernel: str  # "prefill" | "decode_split" | "decode_merge"
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
    # Other KV dtypes / head layouts whose launches compile identically and were merged into this one.
    also_kv_dtypes: tuple[str, ...] = ()
    also_heads: tuple[str, ...] = ()

    def __post_init__(self):
        if not isinstance(self.fold_scales, bool):
            raise TypeError(f"fold_scales: expected a bool, got {type(self.fold_scales).__name__}")
        Variant(self.arch, self.kernel, self.scale_mode, self.fold_scales)  # validates the names
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype: expected one of {KV_DTYPES}, got {self.kv_dtype!r}")
        if self.q_dtype not in Q_DTYPES:
            raise ValueError(f"q_dtype: expected one of {sorted(Q_DTYPES)}, got {self.q_dtype!r}")
        for name in ("num_q_heads", "num_kv_heads", "head_dim", "topk"):
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
        return "prefill" if self.kernel == "prefill" else "decode"

    @property
    def heads(self) -> str:
        return f"{self.num_q_heads}/{self.num_kv_heads}"

    @property
    def id(self) -> str:
        """A readable, unique-enough name: used as the pytest id and in messages."""
        extra = "" if (self.head_dim, self.topk, self.q_dtype, self.varlen) == (128, 16, "bf16", False) else (
            f"-d{self.head_dim}-k{self.topk}-q{self.q_dtype}" + ("-varlen" if self.varlen else ""))
        return (f"{self.variant}-{self.kv_dtype}-{self.num_q_heads}x{self.num_kv_heads}-"
                f"{config_label(self.arch, self.kernel, self.config).replace(' ', '-')}{extra}")


def config_label(arch: str, kernel: str, config: LaunchConfig) -> str:
    """The config fields that matter to `kernel` on `arch`, short (e.g. "bn64 bt1 w4 st2")."""
    if kernel == "decode_merge":
        return f"sp{config.num_splits} w{config.merge_num_warps}"
    parts = [f"bn{config.block_n}"]
    if kernel == "prefill":
        parts.append(f"bt{config.block_t}")
    parts += [f"w{config.num_warps}", f"st{config.num_stages}"]
    if kernel == "decode_split":
        parts.append(f"sp{config.num_splits}" + ("fm" if config.fused_merge and config.num_splits > 1 else ""))
    if config.kv_upcast:
        parts.append(f"up{config.kv_upcast}")
    if get_arch(arch).amd_knobs:
        parts += [f"wpe{config.waves_per_eu}", f"mi{config.matrix_instr_nonkdim}", f"kp{config.kpack}"]
    return " ".join(parts)


def runtime_use_pdl(arch: str, kernel: str) -> bool:
    """What codegen.api does on a GPU: programmatic dependent launch for sm90 decode only."""
    return get_arch(arch).use_pdl and kernel in ("decode_split", "decode_merge")


def _as_config(config) -> LaunchConfig:
    if isinstance(config, LaunchConfig):
        return config
    return LaunchConfig.from_dict(config)


def launches_for(arch: str, kernel: str, scale_mode: str, kv_dtype: str, num_q_heads: int, num_kv_heads: int,
                 config, *, head_dim: int = 128, topk: int = 16, q_dtype: str = "bf16", varlen: bool = False,
                 source: str = "custom", fold_scales: bool = True) -> list[StaticLaunch]:
    """The kernels one runtime call launches: prefill; or decode_split (+ decode_merge when num_splits > 1
    and the merge is not fused).
    fold_scales=False: the unfolded scalar baseline modules (as codegen.api with fold_scales=False)."""
    config = _as_config(config)
    if kernel == "prefill":
        kernels = ["prefill"]
    elif kernel == "decode":
        kernels = ["decode_split"] + (["decode_merge"] if config.num_splits > 1 and not config.fused_merge else [])
    else:
        raise ValueError(f"kernel: expected 'prefill' or 'decode' (a runtime call), got {kernel!r}")
    return [StaticLaunch(arch, k, scale_mode, kv_dtype, num_q_heads, num_kv_heads, config, head_dim=head_dim,
                         topk=topk, q_dtype=q_dtype, varlen=varlen, use_pdl=runtime_use_pdl(arch, k), source=source,
                         fold_scales=fold_scales)
            for k in kernels]


# ---------------------------------------------------------------------------------------------
# Signature and specialization: mimic a typical real launch


def _typical_int_args(launch: StaticLaunch) -> dict[str, int]:
    """Values the integer arguments take in a typical real launch (layouts as in codegen.cases).

    Triton's JIT specializes integer arguments on their values: 1 becomes a compile-time constant
    and a multiple of 16 gets ``tt.divisibility = 16``. The generated code then differs (address
    arithmetic, vector widths), so the ahead-of-time compile feeds these values through the same
    specialization routine as the JIT. Assumed layouts:
    - q and out [tokens, Hq, D] contiguous; the KV cache a token-major view [pages, Hkv, 128, 2D] of
      [pages, 128, Hkv, 2D] (stride_*_d == 1, every other stride a multiple of 16);
    - top-k ids [Hkv, tokens, topk] transposed from [tokens, Hkv, topk] (stride_tk_k == 1);
    - block table [requests, 1024] (a row stride that is a multiple of 16);
    - per-token-head scales [Hkv, slots] transposed from [slots, Hkv] (stride_*s_h == 1);
    - num_reqs neither 1 nor a multiple of 16 (a generic batch); decode_query_len == 1 (plain
      decode; varlen launches pass 1 too); blocks_per_split = ceil(topk / num_splits).
    tests/static checks the result against the JIT's own binder fed with codegen.cases inputs, and
    benchmarks/compare_resources.py against the kernels the JIT loads on an H200.
    """
    hq, hkv, d, topk = launch.num_q_heads, launch.num_kv_heads, launch.head_dim, launch.topk
    return {
        "topk": topk,
        "num_reqs": 7,
        "decode_query_len": 1,
        "blocks_per_split": -(-topk // launch.config.num_splits),
        "stride_q_t": hq * d, "stride_q_h": d, "stride_q_d": 1,
        "stride_o_t": hq * d, "stride_o_h": d, "stride_o_d": 1,
        "stride_kv_b": PAGE_SIZE * hkv * 2 * d, "stride_kv_h": 2 * d, "stride_kv_t": hkv * 2 * d, "stride_kv_d": 1,
        "stride_tk_h": topk, "stride_tk_t": hkv * topk, "stride_tk_k": 1,
        "stride_bt_r": 1024, "stride_bt_b": 1,
        "stride_ks_h": 1, "stride_ks_t": hkv, "stride_vs_h": 1, "stride_vs_t": hkv,
    }


def _pointer_dtype(launch: StaticLaunch, arg: str) -> torch.dtype:
    """Element type of a pointer argument, by the naming convention of the generated modules."""
    if arg in ("q_ptr", "out_ptr"):
        return Q_DTYPES[launch.q_dtype]
    if arg in ("part_o_ptr", "part_lse_ptr") and launch.kernel == "decode_split" and launch.config.num_splits == 1:
        return Q_DTYPES[launch.q_dtype]  # one split: the launcher passes the (never written) output tensor
    if arg == "kv_ptr":
        return get_arch(launch.arch).fp8_dtype if launch.kv_dtype == "fp8" else _KV_TORCH[launch.kv_dtype]
    if arg in ("k_scale_ptr", "v_scale_ptr", "part_o_ptr", "part_lse_ptr"):
        return torch.float32
    return torch.int32


def _specializer():
    try:  # the routine the JIT itself runs on every argument (triton 3.6 .. 3.9)
        from triton._C.libtriton import native_specialize_impl
    except ImportError as exc:  # pragma: no cover - older triton
        raise RuntimeError(f"codegen.static needs triton >= 3.6 (native_specialize_impl); "
                           f"found triton {triton.__version__}") from exc
    return native_specialize_impl


def _signature(launch: StaticLaunch, fn, kernel_constexprs: dict) -> tuple[dict, dict, dict, list[str]]:
    """(signature, constexprs incl. specialized ints, attrs, notes) as the JIT would build them.

    Pointers are 16-byte aligned tensors ("D": ``tt.divisibility``) and, on gfx942 with buffer ops
    on (triton's default), within 2 GB ("S": ``tt.pointer_range = 32``); both come from handing a
    small CPU tensor of the right dtype to the JIT's specializer. In ASTSource, attrs are keyed
    by the argument's index path ``(i,)`` and hold ``[[name, value], ...]`` (triton 3.6 and 3.9).
    """
    backend_cls, _ = _backend_classes(launch.arch)
    specialize = _specializer()
    typical = _typical_int_args(launch)
    signature, constexprs, attrs, notes = {}, dict(kernel_constexprs), {}, []
    for index, name in enumerate(fn.arg_names):
        if name in kernel_constexprs:
            signature[name] = "constexpr"
            continue
        if name.endswith("_ptr"):
            value = torch.empty(16, dtype=_pointer_dtype(launch, name))
        elif name == "sm_scale":
            value = float(launch.head_dim) ** -0.5
        elif name in typical:
            value = typical[name]
        else:  # an argument this module does not know: compile it unspecialized and say so
            value = 7
            notes.append(f"argument {name!r} has no typical value in codegen.static; compiled as a generic i32")
        kind, desc = specialize(backend_cls, value, False, True, True)
        signature[name] = kind
        if kind == "constexpr":
            constexprs[name] = desc
        elif isinstance(desc, str):
            attrs[(index,)] = backend_cls.parse_attr(desc)
    return signature, constexprs, attrs, notes


def _jit_function(kernel):
    """The JITFunction under any heuristics/autotune wrappers."""
    from triton.runtime.jit import JITFunction

    fn = kernel
    while not isinstance(fn, JITFunction):
        if not hasattr(fn, "fn"):
            raise TypeError(f"KERNEL: expected a @triton.jit function, got {type(kernel).__name__} "
                            "(is TRITON_INTERPRET=1 set? static checks need real compilation)")
        fn = fn.fn
    return fn


@dataclasses.dataclass(frozen=True)
class CompileInputs:
    launch: StaticLaunch
    signature: dict
    constexprs: dict
    attrs: dict
    options: dict
    notes: tuple
    key: str


@functools.lru_cache(maxsize=None)
def _backend(arch: str):
    from triton.compiler.compiler import make_backend

    return make_backend(target_of(arch))


def _resolved_options(arch: str, options: Mapping[str, Any]) -> dict:
    """Every backend option after defaults and environment knobs (e.g. FP fusion) are applied.

    Part of the cache key, so a changed default or knob recompiles; library paths are left out so
    the key does not depend on where Triton is installed.
    """
    resolved = dataclasses.asdict(_backend(arch).parse_options(dict(options)))
    resolved.pop("extern_libs", None)
    return resolved


def _cache_invalidating_env() -> dict:
    """The TRITON_* environment variables that Triton itself treats as changing a compile."""
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars
    except ImportError:  # pragma: no cover - older triton
        return {}
    return dict(get_cache_invalidating_env_vars())


def _module_text_sha256(module) -> str:
    return hashlib.sha256(pathlib.Path(module.__file__).read_bytes()).hexdigest()


def compile_inputs(launch: StaticLaunch, options: Mapping[str, Any] | None = None) -> CompileInputs:
    """Everything triton.compile gets for `launch`, validated, plus its cache key. Compiles nothing."""
    validate_config(launch.config, arch=launch.arch, kernel=launch.family, topk=launch.topk)
    module = launch.module()
    fn = _jit_function(module.KERNEL)
    kernel_constexprs = module.constexprs(num_q_heads=launch.num_q_heads, num_kv_heads=launch.num_kv_heads,
                                          head_dim=launch.head_dim, topk=launch.topk, config=launch.config,
                                          varlen=launch.varlen, use_pdl=launch.use_pdl)
    compile_options = dict(module.options(launch.config))
    if launch.kernel == "decode_merge" and launch.use_pdl:
        compile_options["launch_pdl"] = True  # codegen.api launches the merge kernel with launch_pdl
    compile_options.update(options or {})
    validate_options(launch.arch, compile_options)
    signature, constexprs, attrs, notes = _signature(launch, fn, kernel_constexprs)
    key_material = {
        "figures_version": FIGURES_VERSION,
        "inputs_sha256": getattr(module, "INPUTS_SHA256", None),
        "module_sha256": _module_text_sha256(module),
        "arch": launch.arch,
        "kernel": launch.kernel,
        "scale_mode": launch.scale_mode,
        "fold_scales": launch.fold_scales,
        "signature": signature,
        "constexprs": constexprs,
        "attrs": {str(list(k)): v for k, v in attrs.items()},
        "options": compile_options,
        "resolved_options": _resolved_options(launch.arch, compile_options),
        "env": _cache_invalidating_env(),
        "triton": triton.__version__,
    }
    key = hashlib.sha256(json.dumps(key_material, sort_keys=True, default=str).encode()).hexdigest()
    return CompileInputs(launch, signature, constexprs, attrs, compile_options, tuple(notes), key)


# ---------------------------------------------------------------------------------------------
# Compiling and reading the figures


def _first_int(pattern: str, text: str) -> int | None:
    match = re.search(pattern, text)
    return int(match.group(1)) if match else None


def _cuobjdump_usage(cubin: bytes, kernel_name: str) -> dict[str, int]:
    """REG / STACK / SHARED / LOCAL of `kernel_name` from ``cuobjdump --dump-resource-usage``."""
    from triton import knobs

    with tempfile.TemporaryDirectory(prefix="msa-static-") as tmp:
        path = pathlib.Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        out = subprocess.run([knobs.nvidia.cuobjdump.path, "--dump-resource-usage", str(path)],
                             capture_output=True, text=True, check=True).stdout
    # "Function <name>:" is followed by the line "REG:.. STACK:.. SHARED:.. LOCAL:.. ...".
    match = re.search(rf"Function {re.escape(kernel_name)}:\s*\n\s*(REG:[^\n]*)", out)
    if not match:
        raise ValueError(f"cuobjdump: no resource line for {kernel_name}")
    line = match.group(1)
    return {k: int(v) for k, v in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", line)}


def _sm90_figures(compiled, ptxas_log: str) -> dict:
    usage = {}
    notes = []
    try:
        usage = _cuobjdump_usage(compiled.asm["cubin"], compiled.metadata.name)
    except (OSError, subprocess.CalledProcessError, ValueError) as exc:
        notes.append(f"cuobjdump failed ({exc}); registers from the ptxas log")
    spill_stores = _first_int(r"(\d+) bytes spill stores", ptxas_log)
    registers = usage.get("REG", _first_int(r"Used (\d+) registers", ptxas_log))
    stack, local = usage.get("STACK"), usage.get("LOCAL")
    scratch = None if stack is None and local is None else (stack or 0) + (local or 0)
    if spill_stores is None:
        notes.append("no ptxas log captured: spill bytes estimated as the stack + local memory size")
        spill_stores = scratch
    ptx = compiled.asm.get("ptx", "")
    mma = [name for name, pattern in (("wgmma", "wgmma.mma_async"), ("mma.sync", "mma.sync")) if pattern in ptx]
    if "wgmma.mma_async instructions are serialized" in ptxas_log:
        notes.append("ptxas: wgmma instructions serialized (insufficient registers for the wgmma pipeline)")
    return {
        "registers": registers,
        "spill": spill_stores,
        "spill_unit": "bytes",
        "scratch_bytes": scratch,
        "shared_bytes": compiled.metadata.shared,
        "occupancy": None,
        "vgpr": None,
        "agpr": None,
        "mma": "+".join(mma) or "none",
        "extra": {"static_shared_bytes": usage.get("SHARED"), "stack_bytes": stack, "local_bytes": local},
        "notes": notes,
    }


def _gfx942_figures(compiled) -> dict:
    text = compiled.asm.get("amdgcn", "")
    total_vgpr = _first_int(r"\.vgpr_count:\s+(\d+)", text)
    if total_vgpr is None:
        total_vgpr = _first_int(r"; TotalNumVgprs: (\d+)", text)
    return {
        "registers": total_vgpr,
        "spill": _first_int(r"\.vgpr_spill_count:\s+(\d+)", text),
        "spill_unit": "count",
        "scratch_bytes": _first_int(r"; ScratchSize: (\d+)", text),
        "shared_bytes": compiled.metadata.shared,
        "occupancy": _first_int(r"; Occupancy: (\d+)", text),
        "vgpr": _first_int(r"; NumVgprs: (\d+)", text),
        "agpr": _first_int(r"\.agpr_count:\s+(\d+)", text),
        "mma": "mfma" if "v_mfma" in text else "none",
        "extra": {"sgpr": _first_int(r"\.sgpr_count:\s+(\d+)", text),
                  "sgpr_spill": _first_int(r"\.sgpr_spill_count:\s+(\d+)", text)},
        "notes": [],
    }


def _short_error(exc: BaseException) -> str:
    """The informative lines of a compile error (ptxas errors carry the whole PTX)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    keep = [ln for ln in lines if re.search(r"error|fatal|exceed|insufficient|out of", ln, re.I)] or lines[:3]
    return f"{type(exc).__name__}: " + " | ".join(keep[:4])[:600]


def compile_figures(inputs: CompileInputs) -> dict:
    """Compiles `inputs` for its target and reads the resource figures (no cache involved).

    Triton's own compile cache is bypassed (always_compile) so that ptxas runs and its log, with
    the spill bytes, is captured; the log and any failure dump are kept off stdout. Knobs and
    stdout are process-wide: compile from several processes (as report_many does), not threads.
    """
    from triton import knobs
    from triton.compiler import ASTSource

    launch = inputs.launch
    fn = _jit_function(launch.module().KERNEL)
    source = ASTSource(fn=fn, signature=inputs.signature, constexprs=inputs.constexprs, attrs=inputs.attrs)
    captured = io.StringIO()
    start = time.perf_counter()
    with knobs.compilation.scope(), knobs.nvidia.scope(), contextlib.redirect_stdout(captured), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        knobs.compilation.always_compile = True
        knobs.nvidia.dump_ptxas_log = True
        try:
            compiled = triton.compile(source, target=target_of(launch.arch), options=dict(inputs.options))
        except Exception as exc:  # a compile failure is a finding, reported like a limit violation
            return {"error": _short_error(exc), "compile_seconds": round(time.perf_counter() - start, 2)}
    if launch.arch == "sm90":
        figures = _sm90_figures(compiled, captured.getvalue())
    else:
        figures = _gfx942_figures(compiled)
    figures["compile_seconds"] = round(time.perf_counter() - start, 2)
    return figures


# ---------------------------------------------------------------------------------------------
# The cache


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


# ---------------------------------------------------------------------------------------------
# Reports


@dataclasses.dataclass(frozen=True)
class ResourceReport:
    """Resource figures of one compiled kernel and the limits it violates (`problems`)."""

    variant: str
    arch: str
    kernel: str
    scale_mode: str
    kv_dtype: str
    q_dtype: str
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    topk: int
    varlen: bool
    use_pdl: bool
    source: str
    config: dict
    constexprs: dict
    options: dict
    registers: int | None  # sm90: per thread; gfx942: VGPRs per wave, arch + acc (AGPR) together
    spill: int | None  # sm90: bytes of spill stores; gfx942: number of spilled VGPRs
    spill_unit: str  # "bytes" | "count"
    scratch_bytes: int | None  # sm90: stack + local memory per thread; gfx942: scratch per lane
    shared_bytes: int | None  # sm90: dynamic shared memory per block; gfx942: LDS per workgroup
    occupancy: int | None  # gfx942: waves per SIMD as the compiler reports it; sm90: None
    vgpr: int | None  # gfx942: architectural VGPRs
    agpr: int | None  # gfx942: accumulation VGPRs
    mma: str  # "wgmma" | "mma.sync" | "wgmma+mma.sync" | "mfma" | "none"
    triton_version: str
    problems: tuple[str, ...]
    notes: tuple[str, ...] = ()
    extra: dict = dataclasses.field(default_factory=dict)
    error: str | None = None
    cached: bool = False
    compile_seconds: float | None = None
    compile_key: str = ""
    launch_id: str = ""
    also_kv_dtypes: tuple[str, ...] = ()  # other KV dtypes / head layouts that compile identically
    also_heads: tuple[str, ...] = ()
    fold_scales: bool = True  # False: the unfolded scalar baseline module (variant name ends in _unfolded)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def heads(self) -> str:
        return f"{self.num_q_heads}/{self.num_kv_heads}"

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["problems"] = list(self.problems)
        data["notes"] = list(self.notes)
        data["also_kv_dtypes"] = list(self.also_kv_dtypes)
        data["also_heads"] = list(self.also_heads)
        data["ok"] = self.ok
        return data

    def summary(self) -> str:
        """One line naming the kernel and every figure (used in failure messages)."""
        regs = f"{self.registers}" + (f" (vgpr {self.vgpr}, agpr {self.agpr})" if self.arch == "gfx942" else "")
        return (f"{self.launch_id}: registers {regs}, spill {self.spill} {self.spill_unit}, "
                f"scratch {self.scratch_bytes} B, {LIMITS[self.arch].shared_name} {self.shared_bytes} B, "
                f"occupancy {self.occupancy}, mma {self.mma}, triton {self.triton_version}"
                + (f"; problems: {'; '.join(self.problems)}" if self.problems else "; ok"))


def _kb(n: int) -> str:
    return f"{n / 1024:.1f} KB ({n} B)"


def problems_of(arch: str, figures: Mapping[str, Any]) -> list[str]:
    """Every limit violation in `figures`, each naming the figure and the limit."""
    limits = LIMITS[arch]
    if figures.get("error"):
        return [f"compile failed: {figures['error']}"]
    found = []
    shared = figures.get("shared_bytes")
    if shared is not None and shared > limits.shared_bytes:
        found.append(f"{limits.shared_name} {_kb(shared)} > limit {_kb(limits.shared_bytes)}")
    registers = figures.get("registers")
    if registers is not None and registers > limits.registers:
        found.append(f"registers {registers} > limit {limits.registers} {limits.register_unit}")
    spill = figures.get("spill")
    if spill:
        what = "bytes of spill stores" if figures.get("spill_unit") == "bytes" else "VGPRs spilled"
        found.append(f"register spills: {spill} {what} (limit 0)")
    scratch = figures.get("scratch_bytes")
    if scratch and not spill:  # scratch without spills: local arrays or stack use, still memory traffic
        found.append(f"scratch/local memory {scratch} B per thread (limit 0)")
    if registers is None or shared is None:
        found.append("figures missing: could not read registers or shared memory from the compiled kernel")
    return found


def _report_from(inputs: CompileInputs, figures: dict, cached: bool) -> ResourceReport:
    launch = inputs.launch
    return ResourceReport(
        variant=launch.variant, arch=launch.arch, kernel=launch.kernel, scale_mode=launch.scale_mode,
        kv_dtype=launch.kv_dtype, q_dtype=launch.q_dtype, num_q_heads=launch.num_q_heads,
        num_kv_heads=launch.num_kv_heads, head_dim=launch.head_dim, topk=launch.topk, varlen=launch.varlen,
        use_pdl=launch.use_pdl, source=launch.source, config=launch.config.to_dict(),
        constexprs={k: v for k, v in inputs.constexprs.items()}, options=dict(inputs.options),
        registers=figures.get("registers"), spill=figures.get("spill"),
        spill_unit=figures.get("spill_unit", "bytes" if launch.arch == "sm90" else "count"),
        scratch_bytes=figures.get("scratch_bytes"), shared_bytes=figures.get("shared_bytes"),
        occupancy=figures.get("occupancy"), vgpr=figures.get("vgpr"), agpr=figures.get("agpr"),
        mma=figures.get("mma", "none"), triton_version=triton.__version__,
        problems=tuple(problems_of(launch.arch, figures)),
        notes=tuple(inputs.notes) + tuple(figures.get("notes", ())), extra=dict(figures.get("extra", {})),
        error=figures.get("error"), cached=cached, compile_seconds=figures.get("compile_seconds"),
        compile_key=inputs.key, launch_id=launch.id, also_kv_dtypes=launch.also_kv_dtypes,
        also_heads=launch.also_heads, fold_scales=launch.fold_scales,
    )


def report_launch(launch: StaticLaunch, *, options: Mapping[str, Any] | None = None,
                  use_cache: bool = True) -> ResourceReport:
    """Compiles (or looks up) one StaticLaunch and checks it against its target's limits."""
    inputs = compile_inputs(launch, options)
    figures, cached = cached_figures(inputs, use_cache=use_cache)
    return _report_from(inputs, figures, cached)


def compile_report(arch: str, kernel: str, scale_mode: str, kv_dtype: str, num_q_heads: int, num_kv_heads: int,
                   config, *, head_dim: int = 128, topk: int = 16, q_dtype: str = "bf16", varlen: bool = False,
                   use_pdl: bool | None = None, options: Mapping[str, Any] | None = None,
                   use_cache: bool = True, fold_scales: bool = True) -> ResourceReport:
    """Compiles one generated kernel ahead of time for `arch` and returns its resource report.

    kernel: "prefill" | "decode_split" | "decode_merge"; kv_dtype: "fp8" | "bf16" | "fp16";
    config: a LaunchConfig or a mapping of its fields. use_pdl: None = what the runtime does (on
    for sm90 decode kernels). options: extra compile options over the module's own, validated
    by name against the backend (a misspelled option is a ValueError). fold_scales=False: the
    unfolded scalar baseline module (scale_mode "scalar" only). Raises ValueError/TypeError
    on invalid arguments; a kernel that fails to compile gives a report whose `problems` say so.
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {KERNELS}, got {kernel!r}")
    launch = StaticLaunch(arch, kernel, scale_mode, kv_dtype, num_q_heads, num_kv_heads, _as_config(config),
                          head_dim=head_dim, topk=topk, q_dtype=q_dtype, varlen=varlen,
                          use_pdl=runtime_use_pdl(arch, kernel) if use_pdl is None else use_pdl,
                          fold_scales=fold_scales)
    return report_launch(launch, options=options, use_cache=use_cache)


def check_launch(arch: str, kernel: str, scale_mode: str, kv_dtype: str, num_q_heads: int, num_kv_heads: int,
                 config, *, fold_scales: bool = True, **kw) -> list[ResourceReport]:
    """Reports for every kernel one runtime call launches (kernel: "prefill" | "decode").

    decode = decode_split, plus decode_merge when config.num_splits > 1 (sm90 with use_pdl, as the
    runtime). Keywords: head_dim, topk, q_dtype, varlen, fold_scales (False: the unfolded scalar
    baseline), options, use_cache. The launch fits when
    ``all(r.ok for r in reports)``; otherwise each report's `problems` say which figure broke
    which limit (the tuner records them as the reason to drop the candidate).
    """
    options = kw.pop("options", None)
    use_cache = kw.pop("use_cache", True)
    return [report_launch(launch, options=options, use_cache=use_cache)
            for launch in launches_for(arch, kernel, scale_mode, kv_dtype, num_q_heads, num_kv_heads, config,
                                       fold_scales=fold_scales, **kw)]


# ---------------------------------------------------------------------------------------------
# Everything shipped


def _default_launches() -> list[StaticLaunch]:
    launches = []
    modes = [(mode, kv, True) for mode, kv in SHIPPED_MODES] + [(mode, kv, False) for mode, kv in SHIPPED_UNFOLDED_MODES]
    for arch in ARCHS:
        for scale_mode, kv_dtype, fold_scales in modes:
            for _, (hq, hkv) in sorted(HEAD_LAYOUTS.items()):
                config = default_config(arch, "prefill", num_tokens=1, num_kv_heads=hkv)
                launches += launches_for(arch, "prefill", scale_mode, kv_dtype, hq, hkv, config, source="default",
                                         fold_scales=fold_scales)
                for tokens in DECODE_TOKEN_COUNTS:
                    config = default_config(arch, "decode", num_tokens=tokens, num_kv_heads=hkv)
                    launches += launches_for(arch, "decode", scale_mode, kv_dtype, hq, hkv, config,
                                             source=f"default@{tokens}tok", fold_scales=fold_scales)
    return launches + _design_launches()


def _design_launches() -> list[StaticLaunch]:
    """The launch options no default uses but the tuner may pick (fp8 upcast paths, the fused
    decode merge), compiled once per arch and fp8 scale mode at the TP4 layout (16/1)."""
    launches = []
    for arch in ARCHS:
        for scale_mode in ("scalar", "per_token_head"):
            base = default_config(arch, "prefill", num_tokens=1, num_kv_heads=1)
            for upcast in (1, 2):
                launches += launches_for(arch, "prefill", scale_mode, "fp8", 16, 1,
                                         dataclasses.replace(base, kv_upcast=upcast), source="design")
            base = dataclasses.replace(default_config(arch, "decode", num_tokens=1, num_kv_heads=1), num_splits=4,
                                       fused_merge=1)
            for upcast in (0, 2):
                launches += launches_for(arch, "decode", scale_mode, "fp8", 16, 1,
                                         dataclasses.replace(base, kv_upcast=upcast), source="design")
    return launches


_TABLE_KEY = re.compile(r"(prefill|decode)/([a-z_]+)/([a-z0-9]+)/(\d+)x(\d+)")
_ENTRY_KEYS = ("kernel", "scale_mode", "kv_dtype", "num_q_heads", "num_kv_heads")


def _tuned_entries(node, context: dict, where: str):
    """Yields (context, config dict, where) for every dict holding a "config" dict, depth first.

    The schema of tuned_configs/ is not final, so the fields an entry needs may sit on the entry
    itself, on any enclosing object, or in a "<kernel>/<scale_mode>/<kv_dtype>/<Hq>x<Hkv>" key.
    """
    if isinstance(node, dict):
        context = dict(context)
        for key in ("arch", "head_dim", "topk", *_ENTRY_KEYS):
            if key in node and not isinstance(node[key], (dict, list)):
                context[key] = node[key]
        if isinstance(node.get("config"), dict):
            yield context, node["config"], where
        for key, child in node.items():
            if key == "config" or not isinstance(child, (dict, list)):
                continue
            child_context = context
            match = _TABLE_KEY.fullmatch(str(key))
            if match:
                child_context = dict(context, kernel=match[1], scale_mode=match[2], kv_dtype=match[3],
                                     num_q_heads=int(match[4]), num_kv_heads=int(match[5]))
            yield from _tuned_entries(child, child_context, f"{where}.{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from _tuned_entries(child, context, f"{where}[{i}]")


def tuned_launches(folder: pathlib.Path | None = None) -> list[StaticLaunch]:
    """Launches of every config in tuned_configs/*.json; unreadable entries are skipped with a warning."""
    folder = TUNED_DIR if folder is None else pathlib.Path(folder)
    launches = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            warnings.warn(f"{path.name}: not readable JSON ({exc}); skipped")
            continue
        file_arch = path.name.split("__")[0] if path.name.split("__")[0] in ARCHS else None
        for context, config, where in _tuned_entries(doc, {"arch": file_arch} if file_arch else {}, path.name):
            missing = [k for k in ("arch", *_ENTRY_KEYS) if context.get(k) is None]
            if missing:
                warnings.warn(f"{where}: tuned entry without {missing}; skipped")
                continue
            kernel = "decode" if str(context["kernel"]).startswith("decode") else context["kernel"]
            try:
                launches += launches_for(
                    context["arch"], kernel, context["scale_mode"], context["kv_dtype"],
                    int(context["num_q_heads"]), int(context["num_kv_heads"]), LaunchConfig.from_dict(config),
                    head_dim=int(context.get("head_dim", 128)), topk=int(context.get("topk", 16)),
                    source=f"tuned:{path.name}")
            except (TypeError, ValueError) as exc:
                warnings.warn(f"{where}: {exc}; skipped")
    return launches


def _merged(kept: StaticLaunch, other: StaticLaunch) -> StaticLaunch:
    """`kept`, noting that `other` (another KV dtype or head layout) compiles to the same kernel."""
    kv = kept.also_kv_dtypes + ((other.kv_dtype,) if other.kv_dtype not in (kept.kv_dtype, *kept.also_kv_dtypes)
                                else ())
    heads = kept.also_heads + ((other.heads,) if other.heads not in (kept.heads, *kept.also_heads) else ())
    return dataclasses.replace(kept, also_kv_dtypes=kv, also_heads=heads)


def _dedupe(launches: Iterable[StaticLaunch]) -> list[StaticLaunch]:
    """One launch per distinct compile (e.g. the merge kernel ignores the KV dtype, and 64/4 and
    16/1 heads give the same constexprs and specializations); the first one notes the others."""
    unique: dict[Any, StaticLaunch] = {}
    for launch in launches:
        try:
            key = compile_inputs(launch).key
        except (TypeError, ValueError):  # invalid: keep it, so the gate reports it
            key = launch
        unique[key] = _merged(unique[key], launch) if key in unique else launch
    return list(unique.values())


def shipped_launches(tuned_folder: pathlib.Path | None = None) -> list[StaticLaunch]:
    """Every shipped (module, config) to gate, one per distinct compile.

    Each arch x {prefill, decode} x scale modes {scalar: fp8, per_token_head: fp8, none: bf16
    and fp8; plus the unfolded scalar baseline, fold_scales=False: fp8} x head layouts TP1 (64/4),
    TP4 (16/1), TP8 (8/1) with the arch default config (decode at DECODE_TOKEN_COUNTS tokens, so
    num_splits == 1 and > 1 are both covered), plus every config in tuned_configs/*.json.
    """
    return _dedupe(_default_launches() + tuned_launches(tuned_folder))


# ---------------------------------------------------------------------------------------------
# Allowed exceptions


_EXCEPTION_MATCH_KEYS = ("arch", "kernel", "scale_mode", "fold_scales", "kv_dtype", "heads", "config", "problem")


def load_exceptions(path: pathlib.Path | None = None) -> list[dict]:
    """The allowed exceptions: a JSON object {"exceptions": [...]} (or a bare list).

    Each entry matches reports by any of arch, kernel, scale_mode, fold_scales (false: the
    unfolded baseline), kv_dtype, heads ("64/4"), config (a subset of the config's fields) and
    problem (a substring of the problem text), and must give a non-empty "reason".
    """
    path = EXCEPTIONS_PATH if path is None else pathlib.Path(path)
    if not path.exists():
        return []
    doc = json.loads(path.read_text())
    entries = doc.get("exceptions") if isinstance(doc, dict) else doc
    if not isinstance(entries, list):
        raise ValueError(f"{path.name}: expected {{\"exceptions\": [...]}} or a list")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(f"{path.name}[{i}]: expected an object")
        unknown = sorted(set(entry) - set(_EXCEPTION_MATCH_KEYS) - {"reason"})
        if unknown:
            raise ValueError(f"{path.name}[{i}]: unknown key(s) {unknown}; expected {_EXCEPTION_MATCH_KEYS} + reason")
        if not str(entry.get("reason", "")).strip():
            raise ValueError(f"{path.name}[{i}]: every exception needs a non-empty \"reason\"")
    return entries


def _exception_matches(entry: dict, report: ResourceReport, problem: str) -> bool:
    for key in ("arch", "kernel", "scale_mode", "fold_scales", "kv_dtype"):
        if key in entry and entry[key] != getattr(report, key):
            return False
    if "heads" in entry and entry["heads"] != report.heads:
        return False
    if any(report.config.get(k) != v for k, v in entry.get("config", {}).items()):
        return False
    return entry.get("problem", "") in problem


def split_problems(report: ResourceReport, exceptions: list[dict]) -> tuple[list[str], list[str]]:
    """(unexcused problems, reasons of the exceptions that excuse the others)."""
    unexcused, reasons = [], []
    for problem in report.problems:
        entry = next((e for e in exceptions if _exception_matches(e, report, problem)), None)
        if entry is None:
            unexcused.append(problem)
        else:
            reasons.append(entry["reason"])
    return unexcused, reasons


# ---------------------------------------------------------------------------------------------
# Reports over many launches


def _worker_figures(launch: StaticLaunch, use_cache: bool) -> dict:
    return cached_figures(compile_inputs(launch), use_cache=use_cache)[0]


def _invalid_report(launch: StaticLaunch, exc: Exception) -> ResourceReport:
    """A report for a launch that cannot even be set up (e.g. an invalid tuned config)."""
    return ResourceReport(
        variant=launch.variant, arch=launch.arch, kernel=launch.kernel, scale_mode=launch.scale_mode,
        kv_dtype=launch.kv_dtype, q_dtype=launch.q_dtype, num_q_heads=launch.num_q_heads,
        num_kv_heads=launch.num_kv_heads, head_dim=launch.head_dim, topk=launch.topk, varlen=launch.varlen,
        use_pdl=launch.use_pdl, source=launch.source, config=launch.config.to_dict(), constexprs={}, options={},
        registers=None, spill=None, spill_unit="", scratch_bytes=None, shared_bytes=None, occupancy=None,
        vgpr=None, agpr=None, mma="none", triton_version=triton.__version__,
        problems=(f"invalid launch: {exc}",), error=str(exc), launch_id=launch.id, fold_scales=launch.fold_scales)


def report_many(launches: Iterable[StaticLaunch], *, jobs: int | None = None,
                use_cache: bool = True) -> list[ResourceReport]:
    """Reports for `launches` in order; cache misses compile in a process pool of `jobs` workers
    (default: one per core). A launch that cannot be set up gets a report saying why."""
    prepared: list[CompileInputs | ResourceReport] = []
    for launch in launches:
        try:
            prepared.append(compile_inputs(launch))
        except (TypeError, ValueError) as exc:
            prepared.append(_invalid_report(launch, exc))
    inputs = [item for item in prepared if isinstance(item, CompileInputs)]
    figures, cached = {}, {}
    for item in inputs:
        hit = _cache_load(item) if use_cache else None
        if hit is not None:
            figures[item.key], cached[item.key] = hit, True
    todo = {item.key: item.launch for item in inputs if item.key not in figures}
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(todo)))
    if jobs == 1:
        for key, launch in todo.items():
            figures[key], cached[key] = _worker_figures(launch, use_cache), False
    elif todo:
        # spawn, not fork: triton/LLVM state in this process is not fork-safe.
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            futures = {key: pool.submit(_worker_figures, launch, use_cache) for key, launch in todo.items()}
            for key, future in futures.items():
                figures[key], cached[key] = future.result(), False
    return [item if isinstance(item, ResourceReport) else _report_from(item, figures[item.key], cached[item.key])
            for item in prepared]


def _fmt(value, unit: str = "", missing: str = "?") -> str:
    return missing if value is None else f"{value}{unit}"


def report_rows(reports: Iterable[ResourceReport], exceptions: list[dict] | None = None) -> list[dict]:
    """JSON-ready rows: each report's fields plus status ("ok" | "excepted" | "FAIL")."""
    exceptions = load_exceptions() if exceptions is None else exceptions
    rows = []
    for report in reports:
        unexcused, reasons = split_problems(report, exceptions)
        status = "FAIL" if unexcused else ("excepted" if report.problems else "ok")
        rows.append(dict(report.to_dict(), status=status, unexcused_problems=unexcused, exception_reasons=reasons))
    return rows


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KB"


def _row_cells(row: dict) -> list[str]:
    arch = row["arch"]
    regs = _fmt(row["registers"])
    if arch == "gfx942":
        regs += f" (a{_fmt(row['agpr'])})"
    spill = _fmt(row["spill"], " B" if row["spill_unit"] == "bytes" else "")
    shared = _size(row["shared_bytes"])
    status = row["status"]
    if row["problems"]:
        status += ": " + "; ".join(row["problems"])
    kv_dtypes = ", ".join([row["kv_dtype"], *row.get("also_kv_dtypes", ())])
    heads = ", ".join([f"{row['num_q_heads']}/{row['num_kv_heads']}", *row.get("also_heads", ())])
    scale = row["scale_mode"] + ("" if row.get("fold_scales", True) else " unfolded")
    return [arch, row["kernel"], scale, kv_dtypes, heads,
            config_label(arch, row["kernel"], LaunchConfig(**row["config"])), row.get("source", ""), regs, spill,
            _fmt(row["scratch_bytes"], " B"), shared,
            _fmt(row["occupancy"], missing="-" if arch == "sm90" else "?"), row["mma"], status]


TABLE_HEADER = ["arch", "kernel", "scale", "kv", "heads", "config", "source", "regs", "spill", "scratch", "smem/LDS", "occ",
                "mma", "status"]


def table_text(rows: list[dict]) -> str:
    """A Markdown table (readable as plain text too) of `rows`, preceded by the limits and version."""
    lines = [f"Triton {triton.__version__}. Limits: "
             + "; ".join(f"{arch}: {LIMITS[arch].describe()}" for arch in LIMITS) + ".",
             "regs: sm90 per thread; gfx942 VGPRs per wave incl. AGPRs (aN = AGPRs). spill: sm90 bytes of "
             "spill stores, gfx942 spilled VGPRs. occ: gfx942 waves per SIMD.", "",
             "| " + " | ".join(TABLE_HEADER) + " |", "|" + "|".join("---" for _ in TABLE_HEADER) + "|"]
    lines += ["| " + " | ".join(_row_cells(row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def report(launches: Iterable[StaticLaunch] | None = None, *, jobs: int | None = None, use_cache: bool = True,
           exceptions: list[dict] | None = None) -> tuple[list[dict], str]:
    """(rows, table text) over `launches` (default: everything shipped)."""
    launches = shipped_launches() if launches is None else launches
    rows = report_rows(report_many(launches, jobs=jobs, use_cache=use_cache), exceptions)
    return rows, table_text(rows)


def write_json(path, rows: list[dict], *, command: str | None = None) -> None:
    """Writes the rows with the Triton version and the limits they were checked against."""
    doc = {
        "triton_version": triton.__version__,
        "torch_version": torch.__version__,
        "command": command,
        "limits": {arch: dataclasses.asdict(limits) for arch, limits in LIMITS.items()},
        "targets": {arch: repr(target_of(arch)) for arch in LIMITS},
        "rows": rows,
    }
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")
