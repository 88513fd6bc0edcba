"""Argument checks shared by the kernels' API and the reference.

Every check looks at shapes, dtypes and devices only (never at tensor values), so it costs no
device synchronization and is safe inside CUDA-graph capture. Errors name the argument and what
was expected. Values are checked only on request: value_checks.py (MSA_TUNE_CHECK_VALUES=1).
"""
from __future__ import annotations

import collections
import math
import numbers
import os

import torch

from .shapes import DTYPES, KV_DTYPES
from .variants import ARCHS, FP8_DTYPES, PAGE_SIZE, SCALE_MODES, get_arch

Q_DTYPES = tuple(DTYPES.values())  # bf16, fp16, fp32
# The interpreter's bf16 arithmetic is wrong (decode NaN, prefill off by 8e8; issue 38): it takes these.
INTERPRETER_Q_DTYPES = (torch.float32, torch.float16)
SCALES_RULE = "only an fp8 kv_cache takes scales"
KV_16BIT_DTYPES = tuple(DTYPES[name] for name in KV_DTYPES if name != "fp8")  # bf16, fp16


def check_tensor(name: str, x, *, ndim: int, dtypes: tuple | None = None, device: torch.device | None = None,
                 layout: str = "") -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor{' ' + layout if layout else ''}, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor{' ' + layout if layout else ''}, got shape {tuple(x.shape)}")
    if dtypes is not None and x.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype in {[str(d) for d in dtypes]}, got {x.dtype}")
    if device is not None and x.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (the device of q), got {x.device}")
    return x


def check_shape(name: str, x: torch.Tensor, expected: tuple, layout: str) -> None:
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name}: expected shape {tuple(expected)} {layout}, got {tuple(x.shape)}")


HEAD_DIM_RULE = "a power of two >= 16"  # the kernels' tl.arange over head_dim


def head_dim_ok(head_dim: int) -> bool:
    """Whether the kernels take this head_dim (HEAD_DIM_RULE)."""
    return head_dim >= 16 and not head_dim & (head_dim - 1)


def check_int(name: str, value, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return int(value)


# The spellings an on/off environment variable takes (any case); MSA_TUNE_VLLM adds prefill/decode.
ENV_ON, ENV_OFF = ("1", "on", "true", "yes"), ("0", "off", "false", "no")


def env_switch(name: str, *, default: bool) -> bool:
    """An on/off environment variable; unset or empty: `default`. Any other spelling is an error, not
    silently the default (MSA_TUNE_CHECK_VALUES=yes once left the checks off)."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if not value:
        return default
    if value in ENV_ON or value in ENV_OFF:
        return value in ENV_ON
    raise ValueError(f"{name}: expected one of {', '.join(ENV_ON + ENV_OFF)}, got {raw!r}")


def env_int(name: str, *, default: int, minimum: int) -> int:
    """An integer environment variable; unset or empty: `default`."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return value


def check_sm_scale(sm_scale) -> float:
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
        raise TypeError(f"sm_scale: expected a float, got {type(sm_scale).__name__}")
    if not (math.isfinite(sm_scale) and sm_scale > 0):
        raise ValueError(f"sm_scale: expected a finite float > 0, got {sm_scale}")
    return float(sm_scale)


def resolve_arch(arch: str | None, device: torch.device) -> str:
    """The arch to generate for: given explicitly, or read off the device of the tensors."""
    if device.type == "cpu":
        if arch is None:
            raise ValueError("arch: required for CPU tensors (Triton interpreter); pass arch='sm90' or arch='gfx942'")
        get_arch(arch)
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("q: CPU tensors run only under the Triton interpreter; set TRITON_INTERPRET=1 before importing codegen")
        check_interpreter_versions()
        return arch
    if device.type != "cuda":
        raise ValueError(f"q: expected a CUDA/ROCm or CPU tensor, got device {device}")
    detected = detect_device_arch(device)
    if arch is not None:
        get_arch(arch)
        if arch != detected:
            raise ValueError(f"arch: {arch!r} does not match the device {device} ({detected!r})")
    return detected


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("+")[0].split(".")[:2] if part.isdigit())


def check_interpreter_versions(triton_version: str | None = None, numpy_version: str | None = None) -> None:
    """The Triton interpreter before 3.9 converts its 1-element arrays with int(), which NumPy 2.4
    refuses (the kernels' loop bounds then fail deep inside the interpreter). Checked: triton 3.6
    with numpy 2.3, triton 3.9 with numpy 2.4."""
    if triton_version is None:
        import numpy
        import triton

        triton_version, numpy_version = triton.__version__, numpy.__version__
    if _version(triton_version) < (3, 9) and _version(numpy_version) >= (2, 4):
        raise RuntimeError(f"TRITON_INTERPRET: triton {triton_version}'s interpreter needs numpy < 2.4, found numpy "
                           f"{numpy_version}; install 'numpy<2.4' or triton >= 3.9 (CI's pin)")


def check_interpreter(q: torch.Tensor) -> None:
    """Under TRITON_INTERPRET=1: the interpreter was on when Triton was imported, and q is a dtype
    it computes correctly. Triton reads the variable when a @triton.jit function is defined, so set
    after the import, triton.language's own functions stay compiled ones and the first launch
    fails inside the kernel ("Cannot call @triton.jit'd outside of the scope of a kernel")."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    probe = getattr(tl.standard, "max", None)  # a @triton.jit function of Triton's own
    if probe is not None and not isinstance(probe, InterpretedFunction):
        raise RuntimeError("TRITON_INTERPRET: set to 1 after Triton was imported, too late for the interpreter; "
                           "set TRITON_INTERPRET=1 before importing codegen (or anything that imports triton): "
                           "first thing in the script, or in the shell")
    if q.dtype not in INTERPRETER_Q_DTYPES:
        raise ValueError(f"q: the Triton interpreter (TRITON_INTERPRET=1) computes {q.dtype} wrongly; pass fp32 or "
                         f"fp16 queries (and output) on the CPU")


def detect_device_arch(device: torch.device) -> str:
    props = torch.cuda.get_device_properties(device)
    if torch.version.hip:
        name = getattr(props, "gcnArchName", "").split(":")[0]
        if name not in ARCHS:
            raise ValueError(f"arch: no generated kernels for {name!r} (have {sorted(ARCHS)})")
        return name
    if props.major == 9:
        return "sm90"
    raise ValueError(f"arch: no generated kernels for compute capability {props.major}.{props.minor} (have sm90)")


def check_heads(num_q_heads: int, num_kv_heads, *, source: str) -> int:
    """num_kv_heads against the query heads (`source`: where they were read): each KV head serves a group."""
    num_kv_heads = check_int("num_kv_heads", num_kv_heads, minimum=1)
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_kv_heads: must divide the {num_q_heads} query heads {source}, got {num_kv_heads}")
    return num_kv_heads


def check_scale_mode(scale_mode, kv_dtype) -> None:
    """A scale mode and KV dtype by name (get_config's), by the rules scale_mode_of applies to tensors."""
    if scale_mode not in SCALE_MODES:
        raise ValueError(f"scale_mode: expected one of {list(SCALE_MODES)}, got {scale_mode!r}")
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype: expected one of {list(KV_DTYPES)}, got {kv_dtype!r}")
    if scale_mode != "none" and kv_dtype != "fp8":
        raise ValueError(f"scale_mode: {scale_mode!r} with a {kv_dtype} cache: {SCALES_RULE}; "
                         f"a {kv_dtype} cache is scale mode 'none'")


def check_lookup(scale_mode, kv_dtype, num_q_heads, num_kv_heads, num_tokens, topk) -> None:
    """get_config's call shape, checked as the kernels' arguments are (the arch and kernel by
    default_config): a lookup answers only for a call the kernels would take."""
    check_scale_mode(scale_mode, kv_dtype)
    check_heads(check_int("num_q_heads", num_q_heads, minimum=1), num_kv_heads, source="(num_q_heads)")
    check_int("num_tokens", num_tokens, minimum=0)  # an empty batch is a call too
    check_int("topk", topk, minimum=1)  # topk_idx's rule: topk >= 1


def check_common(arch: str | None, q, kv_cache, topk_idx, num_kv_heads, sm_scale, output, k_scale, v_scale):
    """Checks shared by prefill and decode; returns (arch, scale_mode). The per-request metadata and
    block_table: check_prefill_metadata / check_decode_metadata."""
    check_tensor("q", q, ndim=3, dtypes=Q_DTYPES, layout="[total_q, num_q_heads, head_dim]")
    device = q.device
    arch = resolve_arch(arch, device)
    check_interpreter(q)
    total_q, num_q_heads, head_dim = q.shape
    num_kv_heads = check_heads(num_q_heads, num_kv_heads, source="of q")
    if not head_dim_ok(head_dim):
        raise ValueError(f"q: expected head_dim {HEAD_DIM_RULE}, got {head_dim}")
    check_sm_scale(sm_scale)

    fp8 = get_arch(arch).fp8_dtype
    check_tensor("kv_cache", kv_cache, ndim=4, device=device, layout="[num_blocks, num_kv_heads, 128, 2*head_dim]")
    if kv_cache.dtype in FP8_DTYPES and kv_cache.dtype != fp8:
        raise TypeError(f"kv_cache: {kv_cache.dtype} cannot run on {arch}; its fp8 cache type is {fp8}")
    if kv_cache.dtype not in KV_16BIT_DTYPES + (fp8,):
        raise TypeError(f"kv_cache: expected dtype in {[str(d) for d in KV_16BIT_DTYPES + (fp8,)]} on {arch}, got {kv_cache.dtype}")
    if kv_cache.shape[1] != num_kv_heads:  # both named: either may be the wrong one
        raise ValueError(f"num_kv_heads: {num_kv_heads} does not match kv_cache, which holds {kv_cache.shape[1]} KV "
                         f"heads (dim 1 of [num_blocks, num_kv_heads, 128, 2*head_dim], shape {tuple(kv_cache.shape)})")
    check_shape("kv_cache", kv_cache, (kv_cache.shape[0], num_kv_heads, PAGE_SIZE, 2 * head_dim),
                "[num_blocks, num_kv_heads, 128, 2*head_dim]")

    check_tensor("output", output, ndim=3, dtypes=(q.dtype,), device=device, layout="like q")
    check_shape("output", output, q.shape, "(the shape of q)")
    check_tensor("topk_idx", topk_idx, ndim=3, dtypes=(torch.int32,), device=device, layout="[num_kv_heads, total_q, topk]")
    if topk_idx.shape[0] != num_kv_heads or topk_idx.shape[1] != total_q or topk_idx.shape[2] < 1:
        raise ValueError(f"topk_idx: expected shape ({num_kv_heads}, {total_q}, topk>=1) [num_kv_heads, total_q, topk], "
                         f"got {tuple(topk_idx.shape)}")
    return arch, scale_mode_of(kv_cache, k_scale, v_scale)


def scale_mode_of(kv_cache: torch.Tensor, k_scale, v_scale) -> str:
    """The KV scale mode implied by the arguments (see msa-semantics.md)."""
    if k_scale is None and v_scale is None:
        return "none"
    if (k_scale is None) != (v_scale is None):
        given, missing = ("k_scale", "v_scale") if v_scale is None else ("v_scale", "k_scale")
        raise ValueError(f"{missing}: required when {given} is given (scales come in pairs)")
    if kv_cache.dtype not in FP8_DTYPES:
        raise ValueError(f"k_scale/v_scale: {SCALES_RULE}; a {kv_cache.dtype} cache is scale mode 'none'")
    modes = []
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not isinstance(scale, torch.Tensor):
            raise TypeError(f"{name}: expected a float32 torch.Tensor, got {type(scale).__name__}")
        if scale.dtype != torch.float32:
            raise TypeError(f"{name}: expected dtype torch.float32, got {scale.dtype}")
        if scale.device != kv_cache.device:
            raise ValueError(f"{name}: expected a tensor on {kv_cache.device} (the device of q), got {scale.device}")
        if scale.numel() == 1 and scale.dim() <= 1:
            modes.append("scalar")
        elif scale.dim() == 2 and scale.shape[0] == kv_cache.shape[1] and scale.shape[1] >= kv_cache.shape[0] * PAGE_SIZE:
            modes.append("per_token_head")
        else:
            raise ValueError(
                f"{name}: expected one element (scalar mode) or shape ({kv_cache.shape[1]}, >={kv_cache.shape[0] * PAGE_SIZE}) "
                f"[num_kv_heads, num_blocks*128] (per_token_head mode), got {tuple(scale.shape)}")
    if modes[0] != modes[1]:
        raise ValueError(f"k_scale/v_scale: must be the same mode, got k_scale {modes[0]} and v_scale {modes[1]}")
    return modes[0]


# Where each per-request argument holds the request count: (entries past num_reqs, its layout).
_PER_REQUEST = {
    "seq_lens": (0, "[num_reqs]"),
    "prefix_lens": (0, "[num_reqs]"),
    "cu_seqlens_q": (1, "[num_reqs + 1]"),
    "query_start_loc": (1, "[num_reqs + 1]"),
    "block_table": (0, "[num_reqs, max_blocks]"),
}


def _size(name: str, num_reqs: int) -> str:
    """How long `name` is for num_reqs requests: block_table in rows, the others by shape."""
    return f"{num_reqs} rows" if name == "block_table" else f"shape ({num_reqs + _PER_REQUEST[name][0]},)"


def agreed_num_reqs(**tensors: torch.Tensor) -> int:
    """The number of requests the per-request arguments (by name) agree on. The one that disagrees
    with the others is named; with no majority (two arguments, say) every one is, as either may be
    the wrong one."""
    counts = {name: t.shape[0] - _PER_REQUEST[name][0] for name, t in tensors.items()}
    votes = collections.Counter(counts.values()).most_common()
    num_reqs, most = votes[0]
    if len(votes) == 1:
        return num_reqs
    if votes[1][1] == most:
        said = ", ".join(f"{name} {_size(name, n)} {_PER_REQUEST[name][1]}" for name, n in counts.items())
        raise ValueError(f"{', '.join(counts)}: disagree on the number of requests ({said}); one of them is wrong")
    wrong = next(name for name, n in counts.items() if n != num_reqs)
    *others, last = [name for name, n in counts.items() if n == num_reqs]
    agree = f"{', '.join(others)} and {last}" if others else last
    raise ValueError(f"{wrong}: expected {_size(wrong, num_reqs)} {_PER_REQUEST[wrong][1]} ({num_reqs} "
                     f"request{'s' if num_reqs != 1 else ''}, as {agree} say), got {_size(wrong, counts[wrong])}")


def _check_block_table(block_table, device) -> None:
    check_tensor("block_table", block_table, ndim=2, dtypes=(torch.int32,), device=device,
                 layout="[num_reqs, max_blocks]")


def check_prefill_metadata(q, cu_seqlens_q, seq_lens, prefix_lens, max_query_len, block_table) -> int:
    """The per-request arguments of a prefill call; returns the number of requests."""
    device = check_tensor("q", q, ndim=3, dtypes=Q_DTYPES, layout="[total_q, num_q_heads, head_dim]").device
    check_tensor("seq_lens", seq_lens, ndim=1, dtypes=(torch.int32,), device=device, layout="[num_reqs]")
    check_tensor("cu_seqlens_q", cu_seqlens_q, ndim=1, dtypes=(torch.int32,), device=device, layout="[num_reqs + 1]")
    check_tensor("prefix_lens", prefix_lens, ndim=1, dtypes=(torch.int32,), device=device, layout="[num_reqs]")
    _check_block_table(block_table, device)
    num_reqs = agreed_num_reqs(seq_lens=seq_lens, cu_seqlens_q=cu_seqlens_q, prefix_lens=prefix_lens,
                               block_table=block_table)
    check_int("max_query_len", max_query_len, minimum=0)
    return num_reqs


def check_max_seq_len(max_seq_len, max_query_len: int) -> None:
    """Prefill's optional bound on every request's length (prefix + new tokens): None, or an int no
    smaller than max_query_len (a request holds its new tokens)."""
    if max_seq_len is None:
        return
    check_int("max_seq_len", max_seq_len, minimum=1)
    if max_seq_len < max_query_len:
        raise ValueError(f"max_seq_len: expected None or an int >= max_query_len ({max_query_len}), got {max_seq_len}")


def check_decode_metadata(q, seq_lens, decode_query_len, query_start_loc, token_to_req_indices, block_table) -> int:
    """The per-request arguments of a decode call; returns the number of requests."""
    device = check_tensor("q", q, ndim=3, dtypes=Q_DTYPES, layout="[total_q, num_q_heads, head_dim]").device
    check_tensor("seq_lens", seq_lens, ndim=1, dtypes=(torch.int32,), device=device, layout="[num_reqs]")
    _check_block_table(block_table, device)
    if (query_start_loc is None) != (token_to_req_indices is None):
        given, missing = (("query_start_loc", "token_to_req_indices") if token_to_req_indices is None
                          else ("token_to_req_indices", "query_start_loc"))
        raise ValueError(f"{missing}: required when {given} is given (varlen decode needs both)")
    if query_start_loc is None:
        num_reqs = agreed_num_reqs(seq_lens=seq_lens, block_table=block_table)
        check_int("decode_query_len", decode_query_len, minimum=1)
        if q.shape[0] < num_reqs * decode_query_len:
            raise ValueError(f"q: expected at least num_reqs * decode_query_len = {num_reqs * decode_query_len} rows, got {q.shape[0]}")
    else:
        check_tensor("query_start_loc", query_start_loc, ndim=1, dtypes=(torch.int32,), device=device, layout="[num_reqs + 1]")
        num_reqs = agreed_num_reqs(seq_lens=seq_lens, query_start_loc=query_start_loc, block_table=block_table)
        check_tensor("token_to_req_indices", token_to_req_indices, ndim=1, dtypes=(torch.int32,), device=device, layout="[total_q]")
        check_shape("token_to_req_indices", token_to_req_indices, (q.shape[0],), "[total_q]")
        # Unused here (query_start_loc gives the rows), but still an argument of the call and its plan's key.
        check_int("decode_query_len", decode_query_len, minimum=1)
    return num_reqs
