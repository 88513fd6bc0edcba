"""vLLM general plugin: MiniMax-M3's sparse attention runs on msa-tune's kernels.

Entry point `msa_tune` in the group `vllm.general_plugins` (pyproject.toml), so vLLM's
`load_general_plugins()` calls `register()` in every vLLM process before it builds a model. It
replaces `minimax_m3_sparse_attn` (prefill) and `minimax_m3_sparse_attn_decode` in every module of
`vllm.models.minimax_m3` that holds them (codegen.vllm_hook), with wrappers of the same signature
that call codegen.api, or vLLM's own function for whatever msa-tune does not serve.

Environment:
  MSA_TUNE_VLLM       1 (default): prefill and decode; `prefill` or `decode`: that one only;
                      0: leave vLLM alone.
  MSA_TUNE_VLLM_ARCH  sm90 or gfx942, for CPU tensors under TRITON_INTERPRET=1 (tests); on a GPU
                      the arch is read off the device.
  MSA_TUNE_WARMUP     1 (default): at the first call of a head layout and cache type (in vLLM's
                      start-up profile run) compile every kernel the tuned table can pick for it
                      (codegen.warmup), so that no request waits for a compile; 0: compile on
                      first use instead (also on/off, true/false, yes/no; any other value: no
                      warm-up, and the log's warning names the variable).
  MSA_TUNE_WARMUP_WORKERS  compile processes for that warm-up (default 1: in the worker itself,
                      no other CUDA context while vLLM measures its memory; an int >= 1).
Everything it decides is said once in vLLM's log (logger `vllm.plugins.msa_tune`).
"""
from __future__ import annotations

import inspect
import logging
import os
import re
import threading

import torch

from .validate import ENV_OFF, ENV_ON, HEAD_DIM_RULE, env_int, env_switch, head_dim_ok
from .variants import get_arch
from .vllm_hook import PackagePatcher

ENV_SWITCH = "MSA_TUNE_VLLM"
ENV_ARCH = "MSA_TUNE_VLLM_ARCH"
ENV_WARMUP = "MSA_TUNE_WARMUP"
ENV_WARMUP_WORKERS = "MSA_TUNE_WARMUP_WORKERS"
TESTED_VLLM = ((0, 33, 0), (0, 34, 0))  # [from, to): the releases whose signatures this mirrors
PACKAGE = "vllm.models.minimax_m3"
KERNEL_OF = {"minimax_m3_sparse_attn": "prefill", "minimax_m3_sparse_attn_decode": "decode"}
# vLLM 0.33's parameters, in order; a function with others is left alone (a changed vLLM).
VLLM_PARAMS = {
    "prefill": ("q", "kv_cache", "topk_idx", "block_table", "cu_seqlens_q", "seq_lens", "prefix_lens",
                "max_query_len", "num_kv_heads", "sm_scale", "output", "k_scale", "v_scale"),
    "decode": ("q", "kv_cache", "topk_idx", "block_table", "seq_lens", "num_kv_heads", "sm_scale", "output",
               "decode_query_len", "k_scale", "v_scale"),
}
_SERVED_ARCHS = ("sm90", "gfx942")  # codegen's archs, as _platform_problem recognizes their GPUs

LOGGER = "vllm.plugins.msa_tune"  # under "vllm": vLLM's handler, level and format
_said: set = set()
_lock = threading.Lock()
_patcher: PackagePatcher | None = None


def _logger() -> logging.Logger:
    # vLLM configures the "vllm" logger (handler, level, format); init_logger is how its modules log.
    from vllm.logger import init_logger

    return init_logger(LOGGER)


def _say_once(level: int, key, message: str, *args) -> None:
    with _lock:
        if key in _said:
            return
        _said.add(key)
    _logger().log(level, "msa-tune: " + message, *args)


# -- what this process can serve (decided once, at load) --------------------------------------------
def _kernels_switched_on() -> tuple[str, ...] | str:
    """The kernels to route, or why none."""
    value = os.environ.get(ENV_SWITCH, "1").strip().lower()
    if value in ENV_ON:
        return ("prefill", "decode")
    if value in ("prefill", "decode"):
        return (value,)
    if value in ENV_OFF + ("",):
        return f"{ENV_SWITCH}={value!r}: turned off"
    return f"{ENV_SWITCH}={value!r} is none of 1, 0, prefill, decode: turned off"


def _version_problem(version: str) -> str | None:
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if match is None:
        return f"cannot read vLLM's version {version!r}"
    found = tuple(int(x) for x in match.groups())
    low, high = TESTED_VLLM
    if not low <= found < high:
        return (f"vLLM {version} is outside the tested range [{'.'.join(map(str, low))}, "
                f"{'.'.join(map(str, high))})")
    return None


def _platform_problem() -> str | None:
    """Why this machine's GPU has no msa-tune kernels, or None. Asks vLLM's platform, which reads
    NVML / amdsmi: no CUDA context in processes that fork workers later."""
    forced = os.environ.get(ENV_ARCH)
    if forced:
        return None if forced in _SERVED_ARCHS else f"{ENV_ARCH}={forced!r} is not one of {_SERVED_ARCHS}"
    from vllm.platforms import current_platform

    if current_platform.is_cuda():
        cap = current_platform.get_device_capability()
        if cap is not None and cap.major == 9:
            return None
        return f"msa-tune has kernels for sm90 and gfx942, this GPU is compute capability {cap}"
    if current_platform.is_rocm():
        from vllm.platforms.rocm import on_gfx942

        return None if on_gfx942() else "msa-tune has kernels for sm90 and gfx942, this ROCm GPU is neither"
    return (f"no GPU msa-tune serves on platform {type(current_platform).__name__} "
            f"(for the Triton interpreter set {ENV_ARCH})")


# -- per call ---------------------------------------------------------------------------------------
_arch_of_device: dict = {}


def _arch(device: torch.device) -> str:
    """The arch of a device, read once per device (ValueError: one msa-tune has no kernels for)."""
    arch = _arch_of_device.get(device)
    if arch is None:
        if device.type == "cpu":
            arch = os.environ.get(ENV_ARCH) or ""
            if arch not in _SERVED_ARCHS:
                raise ValueError(f"CPU tensors: set {ENV_ARCH} to one of {_SERVED_ARCHS} (Triton interpreter)")
        else:
            from .validate import detect_device_arch

            arch = detect_device_arch(device)
        _arch_of_device[device] = arch
    return arch


def _serve(q, kv_cache, num_kv_heads, k_scale, v_scale):
    """(arch, scale mode, k_scale, v_scale) when msa-tune serves this call, else the reason it
    does not. Checks dtypes and shapes only: no device sync, the same answer in a CUDA graph."""
    try:
        arch = _arch(q.device)
    except Exception as exc:  # ValueError: a GPU msa-tune has no kernels for
        return f"{type(exc).__name__}: {exc}"
    fp8 = get_arch(arch).fp8_dtype
    if kv_cache.dtype not in (torch.bfloat16, torch.float16, fp8):
        return f"KV cache dtype {kv_cache.dtype} (msa-tune serves bf16, fp16 and {fp8} on {arch})"
    if q.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"query dtype {q.dtype}"
    head_dim = q.shape[-1]
    if not head_dim_ok(head_dim):
        return f"head_dim {head_dim} (msa-tune needs {HEAD_DIM_RULE})"
    if kv_cache.dtype != fp8 or (k_scale is None and v_scale is None):
        return arch, "none", None, None  # vLLM ignores scales on a 16-bit cache
    if k_scale is None or v_scale is None:
        return "only one of k_scale / v_scale"  # vLLM's kernel raises its own error
    if k_scale.dtype != torch.float32 or v_scale.dtype != torch.float32:
        return f"KV scales of dtype {k_scale.dtype}/{v_scale.dtype} (msa-tune takes float32)"
    if k_scale.numel() == 1 and v_scale.numel() == 1 and k_scale.dim() <= 1 and v_scale.dim() <= 1:
        return arch, "scalar", k_scale, v_scale
    slots = kv_cache.shape[0] * kv_cache.shape[2]
    if all(s.dim() == 2 and s.shape[0] == num_kv_heads and s.shape[1] >= slots for s in (k_scale, v_scale)):
        return arch, "per_token_head", k_scale, v_scale
    return (f"KV scales of shapes {tuple(k_scale.shape)}/{tuple(v_scale.shape)} (msa-tune takes one element, "
            f"or [num_kv_heads, >= num_blocks*128])")


def _warm_up(arch, q, kv_cache, num_kv_heads, scale_mode, kv_dtype: str, topk: int, block_table,
             query_len: int) -> None:
    """Once per head layout, scale mode, cache and query dtype: codegen.warmup for it (both kernels,
    single-token decode and this call's query length), unless MSA_TUNE_WARMUP=0. Runs inside the
    first call, which vLLM makes in its start-up profile run, before any request."""
    key = ("warmup", q.device, q.shape[1], num_kv_heads, scale_mode, kv_cache.dtype, q.dtype, query_len)
    with _lock:
        if key in _said:
            return
        _said.add(key)
    if not env_switch(ENV_WARMUP, default=True) or q.device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return
    if q.shape[-1] != 128 or topk != 16:  # the warm-up builds MiniMax-M3's shapes
        _logger().info("msa-tune: no warm-up for head_dim %d, top-k %d (it covers 128 and 16)", q.shape[-1], topk)
        return
    from .shapes import DTYPES
    from .warmup import warmup

    q_dtype = next(name for name, dtype in DTYPES.items() if dtype == q.dtype)
    report = warmup(layouts=((q.shape[1], num_kv_heads),), modes=((scale_mode, kv_dtype),),
                    query_lens=tuple(sorted({1, query_len})), max_model_len=block_table.shape[1] * 128,
                    workers=env_int(ENV_WARMUP_WORKERS, default=1, minimum=1), device=q.device, q_dtype=q_dtype,
                    progress=False)
    _logger().info("msa-tune: %s (%d/%d heads, %s %s cache)%s", report, q.shape[1], num_kv_heads, scale_mode,
                   kv_dtype, "".join(f"; failed: {what}: {err}" for what, err in report.failed[:3]))


def _say_table(kernel, arch, q, kv_cache, num_kv_heads, scale_mode, topk, block_table=None, query_len=1) -> None:
    """Once per tuned table: which file and table serve this GPU, tuned or the arch default."""
    key = ("table", kernel, q.device, scale_mode, kv_cache.dtype, q.shape[1], num_kv_heads)
    if key in _said:  # every call after the first stops here
        return
    try:
        from . import get_config
        from .api import device_name
        from .tuned_store import kv_dtype_name

        device = device_name(q.device)
        kv = kv_dtype_name(kv_cache.dtype)
        choice = get_config(kernel, arch, device, scale_mode, kv, q.shape[1], num_kv_heads, q.shape[0], topk)
        what = "tuned" if choice.is_tuned else "the arch default"
        _say_once(logging.INFO, key, "%s on %s (%s), %s %s cache, %d/%d heads: %s config (%s: %s)",
                  kernel, device, arch, scale_mode, kv, q.shape[1], num_kv_heads, what, choice.source,
                  choice.reason)
    except Exception as exc:  # a log line must never stop serving
        _say_once(logging.WARNING, key, "could not look up the tuned table for %s: %s", kernel, exc)
        return
    if block_table is not None:
        try:
            _warm_up(arch, q, kv_cache, num_kv_heads, scale_mode, kv, topk, block_table, query_len)
        except Exception as exc:  # the call compiles what it needs itself
            _say_once(logging.WARNING, ("warmup-failed", _shape_free(str(exc))), "msa-tune: warm-up failed: %s", exc)


def _shape_free(text: str) -> str:
    return re.sub(r"\d+", "N", text)  # one log line per kind of reason, not per token count


def _fallback_reason(kernel: str, why: str) -> None:
    _say_once(logging.INFO, ("fallback", kernel, _shape_free(why)), "%s stays on vLLM's kernel: %s", kernel, why)


def _api_refused(kernel: str, exc: Exception) -> None:
    # codegen.api checks every argument before it launches anything, so vLLM can still run the call.
    _say_once(logging.WARNING, ("refused", kernel, _shape_free(str(exc))),
              "%s refused a call, vLLM's kernel runs it: %s", kernel, exc)


def _route(kernel: str, run_ours, run_vllm, q, kv_cache, topk_idx, num_kv_heads, k_scale, v_scale, block_table=None,
           query_len=1):
    """One call: msa-tune's kernel (`run_ours(k_scale, v_scale, arch)`) where it serves the call,
    else vLLM's (`run_vllm()`). Returns None like vLLM's: the result is in `output`."""
    served = _serve(q, kv_cache, num_kv_heads, k_scale, v_scale)
    if isinstance(served, tuple):
        arch, mode, ks, vs = served
        _say_table(kernel, arch, q, kv_cache, num_kv_heads, mode, topk_idx.shape[-1], block_table, query_len)
        try:  # no autograd context needed: a planned call runs no torch op, the kernels write `output`
            run_ours(ks, vs, arch)
            return None
        except (ValueError, TypeError) as exc:
            _api_refused(kernel, exc)
    else:
        _fallback_reason(kernel, served)
    return run_vllm()


def _prefill_wrapper(original):
    from .api import sparse_attn_prefill

    def minimax_m3_sparse_attn(q, kv_cache, topk_idx, block_table, cu_seqlens_q, seq_lens, prefix_lens,
                               max_query_len, num_kv_heads, sm_scale, output, k_scale=None, v_scale=None):
        common = (q, kv_cache, topk_idx, block_table, cu_seqlens_q, seq_lens, prefix_lens, max_query_len,
                  num_kv_heads, sm_scale, output)
        return _route("prefill", lambda ks, vs, arch: sparse_attn_prefill(*common, ks, vs, arch=arch),
                      lambda: original(*common, k_scale=k_scale, v_scale=v_scale),
                      q, kv_cache, topk_idx, num_kv_heads, k_scale, v_scale, block_table)

    return minimax_m3_sparse_attn


def _decode_wrapper(original):
    from .api import sparse_attn_decode

    def minimax_m3_sparse_attn_decode(q, kv_cache, topk_idx, block_table, seq_lens, num_kv_heads, sm_scale,
                                      output, decode_query_len, k_scale=None, v_scale=None):
        common = (q, kv_cache, topk_idx, block_table, seq_lens, num_kv_heads, sm_scale, output, decode_query_len)
        return _route("decode", lambda ks, vs, arch: sparse_attn_decode(*common, ks, vs, arch=arch),
                      lambda: original(*common, k_scale=k_scale, v_scale=v_scale),
                      q, kv_cache, topk_idx, num_kv_heads, k_scale, v_scale, block_table, decode_query_len)

    return minimax_m3_sparse_attn_decode


_WRAPPERS = {"prefill": _prefill_wrapper, "decode": _decode_wrapper}


def _wrap(name: str, original, kernels):
    """msa-tune's wrapper for one of vLLM's functions, or None to leave it."""
    kernel = KERNEL_OF[name]
    where = f"{getattr(original, '__module__', '?')}.{name}"
    if kernel not in kernels:
        return None
    if not getattr(original, "__module__", "").startswith(PACKAGE):
        return None  # not vLLM's (someone else's patch): leave it
    try:
        params = tuple(inspect.signature(original).parameters)
    except (TypeError, ValueError):
        params = None
    if params != VLLM_PARAMS[kernel]:
        _say_once(logging.WARNING, ("signature", where), "%s has parameters %s, not vLLM 0.33's %s: left alone",
                  where, params, VLLM_PARAMS[kernel])
        return None
    wrapper = _WRAPPERS[kernel](original)  # imports codegen.api (Triton, the generated modules)
    wrapper.__qualname__ = wrapper.__name__ = name
    wrapper.__doc__ = f"msa-tune's {kernel} with the signature of {where}, which runs what msa-tune does not serve."
    wrapper.vllm_original = original  # what it falls back to (and what tests compare against)
    _say_once(logging.INFO, ("routed", where), "%s now runs msa-tune's %s kernels", where, kernel)
    return wrapper


def _replacer(kernels):
    def replace(name: str, original):
        try:
            return _wrap(name, original, kernels)
        except Exception as exc:  # runs inside vLLM's import of the module: never break it
            _say_once(logging.WARNING, ("wrap", name), "cannot route %s (%r): vLLM's function stays", name, exc)
            return None

    return replace


def register() -> None:
    """The entry point vLLM calls. Never raises: on any problem vLLM's kernels stay."""
    global _patcher
    try:
        if _patcher is not None:
            return  # loaded twice in one process
        kernels = _kernels_switched_on()
        if isinstance(kernels, str):
            _say_once(logging.INFO, "off", "%s; vLLM's MiniMax-M3 sparse attention kernels stay", kernels)
            return
        import vllm

        problem = _version_problem(getattr(vllm, "__version__", "?"))
        if problem:  # installed for this vLLM but untested with it: worth a warning
            _say_once(logging.WARNING, "off", "%s; vLLM's MiniMax-M3 sparse attention kernels stay", problem)
            return
        problem = _platform_problem()
        if problem:
            _say_once(logging.INFO, "off", "%s; vLLM's MiniMax-M3 sparse attention kernels stay", problem)
            return
        _patcher = PackagePatcher(PACKAGE, KERNEL_OF, _replacer(kernels))
        _patcher.install()
        _say_once(logging.INFO, "on", "routing MiniMax-M3 sparse attention (%s) to msa-tune (vLLM %s)",
                  " + ".join(kernels), vllm.__version__)
    except Exception:
        logging.getLogger(LOGGER).exception("msa-tune: the plugin failed to load; vLLM's MiniMax-M3 kernels stay")


def patcher() -> PackagePatcher | None:
    """The installed patcher (None when the plugin is off): its holders() lists what it patched."""
    return _patcher
