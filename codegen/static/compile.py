"""Ahead-of-time compiles that mimic a real launch's specialization, the figures read off the
artifacts, and their cache."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import json
import pathlib
import re
import subprocess
import tempfile
import time
import warnings
from typing import Any, Mapping

import torch
import triton

from ..configs import validate_config
from ..modules import load_module
from ..shapes import torch_dtype
from ..variants import PAGE_SIZE, get_arch
from .launch import (FIGURES_VERSION, Q_DTYPES, StaticLaunch, _backend_classes, check_tile_module, sample_kv_cache,
                     target_of, validate_options)

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
    - num_reqs neither 1 nor a multiple of 16 (a generic batch); decode_query_len the launch's (1:
      plain decode; varlen launches pass 1 too); blocks_per_split = ceil(topk / num_splits).
    tests/static checks the result against the JIT's own binder fed with codegen.cases inputs, and
    benchmarks/probes/compare_resources.py against the kernels the JIT loads on an H200.
    """
    hq, hkv, d, topk = launch.num_q_heads, launch.num_kv_heads, launch.head_dim, launch.topk
    return {
        "topk": topk,
        "num_reqs": 7,
        "decode_query_len": 1 if launch.varlen else launch.decode_query_len,
        "blocks_per_split": -(-topk // launch.config.num_splits),
        "stride_q_t": hq * d, "stride_q_h": d, "stride_q_d": 1,
        "stride_o_t": hq * d, "stride_o_h": d, "stride_o_d": 1,
        "stride_kv_b": PAGE_SIZE * hkv * 2 * d, "stride_kv_h": 2 * d, "stride_kv_t": hkv * 2 * d, "stride_kv_d": 1,
        "stride_tk_h": topk, "stride_tk_t": hkv * topk, "stride_tk_k": 1,
        "stride_bt_r": 1024, "stride_bt_b": 1,
        "stride_ks_h": 1, "stride_ks_t": hkv, "stride_vs_h": 1, "stride_vs_t": hkv,
        **({} if launch.kv_rows_aligned else _unaligned_kv_strides(launch)),
    }


def _unaligned_kv_strides(launch: StaticLaunch) -> dict[str, int]:
    """The cache strides of a [pages, Hkv, 128, 2D + 8] buffer's [..., :2D] view (fp8: a token row of
    2D + 8 bytes, which Triton cannot see 16-byte aligned; StaticLaunch.kv_rows_aligned False)."""
    row = 2 * launch.head_dim + 8
    return {"stride_kv_b": launch.num_kv_heads * PAGE_SIZE * row, "stride_kv_h": PAGE_SIZE * row,
            "stride_kv_t": row}


def _pointer_dtype(launch: StaticLaunch, arg: str) -> torch.dtype:
    """Element type of a pointer argument, by the naming convention of the generated modules."""
    if arg in ("q_ptr", "out_ptr"):
        return Q_DTYPES[launch.q_dtype]
    if arg in ("part_o_ptr", "part_lse_ptr") and launch.kernel == "decode_split" and launch.config.num_splits == 1:
        return Q_DTYPES[launch.q_dtype]  # one split: the launcher passes the (never written) output tensor
    if arg == "kv_ptr":
        return torch_dtype(launch.arch, launch.kv_dtype)
    if arg == "part_o_ptr":  # what the split kernel's launch allocates (fp16 or fp32), read by either merge
        split = load_module(launch.arch, "decode_split", launch.scale_mode, launch.fold_scales)
        return split.partial_dtype(torch_dtype(launch.arch, launch.kv_dtype), Q_DTYPES[launch.q_dtype])
    if arg in ("k_scale_ptr", "v_scale_ptr", "part_lse_ptr"):
        return torch.float32
    if arg == "plan_ptr":  # prefill tiles' plan scratch; the per-token walk gets the output instead
        return torch.int64 if launch.config.block_t > 1 else Q_DTYPES[launch.q_dtype]
    return torch.int32


def _kv_descriptor(launch: StaticLaunch, kernel_constexprs: dict):
    """The `kv_desc` argument: the module's own TMA descriptor over a small cache of the launch's
    dtype and head_dim (only its type and box shape enter the signature), or, without TMA, the
    cache tensor the launcher passes in its place. prefill_ws always reads through its descriptor
    (a Gluon one, whose box the module fixes)."""
    cache = sample_kv_cache(launch)
    if launch.kernel == "prefill_ws":
        return launch.module().kv_descriptor(cache)
    if not kernel_constexprs.get("KV_TMA"):
        return cache
    return launch.module().kv_descriptor(cache, launch.head_dim, kernel_constexprs["BLOCK_N"])


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
    Arguments the function lists in do_not_specialize (or do_not_specialize_on_alignment) are
    specialized as the JIT's binder does them: a plain i32 even at value 1, with no divisibility.
    """
    backend_cls, _ = _backend_classes(launch.arch)
    specialize = _specializer()
    typical = _typical_int_args(launch)
    signature, constexprs, attrs, notes = {}, dict(kernel_constexprs), {}, []
    for index, (name, param) in enumerate(zip(fn.arg_names, fn.params)):
        if name in kernel_constexprs:
            signature[name] = "constexpr"
            continue
        if name.endswith("_ptr"):
            value = torch.empty(16, dtype=_pointer_dtype(launch, name))
        elif name == "kv_desc":
            value = _kv_descriptor(launch, kernel_constexprs)
        elif name == "sm_scale":
            value = float(launch.head_dim) ** -0.5
        elif name in typical:
            value = typical[name]
        else:  # an argument this module does not know: compile it unspecialized and say so
            value = 7
            notes.append(f"argument {name!r} has no typical value in codegen.static; compiled as a generic i32")
        kind, desc = specialize(backend_cls, value, False, not param.do_not_specialize,
                                not param.do_not_specialize_on_alignment)
        signature[name] = kind
        if kind == "constexpr":
            constexprs[name] = desc
        elif isinstance(desc, str):
            attrs[(index,)] = backend_cls.parse_attr(desc)
    return signature, constexprs, attrs, notes


def _jit_function(kernel):
    """The JITFunction (a @gluon.jit one too: a subclass) under any heuristics/autotune wrappers."""
    from triton.runtime.jit import JITFunction

    fn = kernel
    while not isinstance(fn, JITFunction):
        if not hasattr(fn, "fn"):
            raise TypeError(f"KERNEL: expected a @triton.jit or @gluon.jit function, got {type(kernel).__name__} "
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
    check_tile_module(launch)
    module = launch.module()
    fn = _jit_function(module.KERNEL)
    kernel_constexprs = module.constexprs(num_q_heads=launch.num_q_heads, num_kv_heads=launch.num_kv_heads,
                                          head_dim=launch.head_dim, topk=launch.topk, config=launch.config,
                                          varlen=launch.varlen, use_pdl=launch.use_pdl,
                                          # a contiguous cache's path, unless the config asks for plain loads
                                          kv_tma=(get_arch(launch.arch).kv_tma and launch.config.kv_tma == 1
                                                  and launch.kv_rows_aligned),
                                          kv_rows_aligned=launch.kv_rows_aligned,
                                          decode_query_len=launch.decode_query_len)
    compile_options = dict(module.options(launch.config))
    if launch.use_pdl:
        compile_options["launch_pdl"] = True  # codegen.api launches these kernels with launch_pdl
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


def cuobjdump(cubin: bytes, *flags: str) -> str:
    """What Triton's cuobjdump prints for `cubin` with `flags` (e.g. "-sass")."""
    from triton import knobs

    with tempfile.TemporaryDirectory(prefix="msa-static-") as tmp:
        path = pathlib.Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        return subprocess.run([knobs.nvidia.cuobjdump.path, *flags, str(path)],
                              capture_output=True, text=True, check=True).stdout


def _cuobjdump_usage(cubin: bytes, kernel_name: str) -> dict[str, int]:
    """REG / STACK / SHARED / LOCAL of `kernel_name` from ``cuobjdump --dump-resource-usage``."""
    out = cuobjdump(cubin, "--dump-resource-usage")
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

    launch = inputs.launch
    source = _ast_source(inputs)
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


def _ast_source(inputs: CompileInputs):
    """What triton.compile takes for `inputs`' kernel, as the JIT would build it: a Gluon kernel
    compiles from a GluonASTSource (its IR is written by the kernel, not lowered from Triton's)."""
    fn = _jit_function(inputs.launch.module().KERNEL)
    if fn.is_gluon():
        from triton.experimental.gluon._runtime import GluonASTSource as source_class
    else:
        from triton.compiler import ASTSource as source_class
    return source_class(fn, inputs.signature, inputs.constexprs, inputs.attrs)


def compile_asm(launch: StaticLaunch, stage: str = "ptx") -> str | bytes:
    """One stage of `launch`'s compiled kernel (a key of Triton's `asm`: "ttgir", and "ptx" and "cubin"
    (bytes) on sm90 or "amdgcn" on gfx942), through Triton's own compile cache: for reading the
    generated code."""
    inputs = compile_inputs(launch)
    return triton.compile(_ast_source(inputs), target=target_of(launch.arch), options=dict(inputs.options)).asm[stage]


def async_copies(ptx: str) -> int:
    """The asynchronous copies in sm90 PTX (cp.async, and TMA's cp.async.bulk.tensor): a pipelined
    loop issues more of them, the prefetches of its next K/V slices before the loop."""
    return len(re.findall(r"cp[.]async[.]", ptx))
