"""Argument checks shared by the kernels' API and the reference.

Every check looks at shapes, dtypes and devices only (never at tensor values), so it costs no
device synchronization and is safe inside CUDA-graph capture. Errors name the argument and what
was expected.
"""
from __future__ import annotations

import math
import numbers
import os

import torch

from .shapes import DTYPES, KV_DTYPES
from .variants import ARCHS, FP8_DTYPES, PAGE_SIZE, get_arch

Q_DTYPES = tuple(DTYPES.values())  # bf16, fp16, fp32
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


def check_common(arch: str | None, q, kv_cache, topk_idx, block_table, num_kv_heads, sm_scale, output,
                 k_scale, v_scale, num_reqs: int):
    """Checks shared by prefill and decode; returns (arch, scale_mode)."""
    check_tensor("q", q, ndim=3, dtypes=Q_DTYPES, layout="[total_q, num_q_heads, head_dim]")
    device = q.device
    arch = resolve_arch(arch, device)
    total_q, num_q_heads, head_dim = q.shape
    num_kv_heads = check_int("num_kv_heads", num_kv_heads, minimum=1)
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_kv_heads: must divide the {num_q_heads} query heads of q, got {num_kv_heads}")
    if not head_dim_ok(head_dim):
        raise ValueError(f"q: expected head_dim {HEAD_DIM_RULE}, got {head_dim}")
    check_sm_scale(sm_scale)

    fp8 = get_arch(arch).fp8_dtype
    check_tensor("kv_cache", kv_cache, ndim=4, device=device, layout="[num_blocks, num_kv_heads, 128, 2*head_dim]")
    if kv_cache.dtype in FP8_DTYPES and kv_cache.dtype != fp8:
        raise TypeError(f"kv_cache: {kv_cache.dtype} cannot run on {arch}; its fp8 cache type is {fp8}")
    if kv_cache.dtype not in KV_16BIT_DTYPES + (fp8,):
        raise TypeError(f"kv_cache: expected dtype in {[str(d) for d in KV_16BIT_DTYPES + (fp8,)]} on {arch}, got {kv_cache.dtype}")
    check_shape("kv_cache", kv_cache, (kv_cache.shape[0], num_kv_heads, PAGE_SIZE, 2 * head_dim),
                "[num_blocks, num_kv_heads, 128, 2*head_dim]")

    check_tensor("output", output, ndim=3, dtypes=(q.dtype,), device=device, layout="like q")
    check_shape("output", output, q.shape, "(the shape of q)")
    check_tensor("topk_idx", topk_idx, ndim=3, dtypes=(torch.int32,), device=device, layout="[num_kv_heads, total_q, topk]")
    if topk_idx.shape[0] != num_kv_heads or topk_idx.shape[1] != total_q or topk_idx.shape[2] < 1:
        raise ValueError(f"topk_idx: expected shape ({num_kv_heads}, {total_q}, topk>=1) [num_kv_heads, total_q, topk], "
                         f"got {tuple(topk_idx.shape)}")
    check_tensor("block_table", block_table, ndim=2, dtypes=(torch.int32,), device=device, layout="[num_reqs, max_blocks]")
    if block_table.shape[0] != num_reqs:
        raise ValueError(f"block_table: expected {num_reqs} rows (one per request, like seq_lens), got {block_table.shape[0]}")
    return arch, scale_mode_of(kv_cache, k_scale, v_scale)


def scale_mode_of(kv_cache: torch.Tensor, k_scale, v_scale) -> str:
    """The KV scale mode implied by the arguments (see msa-semantics.md)."""
    if k_scale is None and v_scale is None:
        return "none"
    if (k_scale is None) != (v_scale is None):
        given, missing = ("k_scale", "v_scale") if v_scale is None else ("v_scale", "k_scale")
        raise ValueError(f"{missing}: required when {given} is given (scales come in pairs)")
    if kv_cache.dtype not in FP8_DTYPES:
        raise ValueError(f"k_scale/v_scale: only an fp8 kv_cache takes scales; a {kv_cache.dtype} cache is scale mode 'none'")
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


def check_prefill_metadata(q, cu_seqlens_q, seq_lens, prefix_lens, max_query_len) -> int:
    device = check_tensor("q", q, ndim=3, dtypes=Q_DTYPES, layout="[total_q, num_q_heads, head_dim]").device
    check_tensor("seq_lens", seq_lens, ndim=1, dtypes=(torch.int32,), device=device, layout="[num_reqs]")
    num_reqs = seq_lens.shape[0]
    check_tensor("cu_seqlens_q", cu_seqlens_q, ndim=1, dtypes=(torch.int32,), device=device, layout="[num_reqs + 1]")
    check_shape("cu_seqlens_q", cu_seqlens_q, (num_reqs + 1,), "[num_reqs + 1]")
    check_tensor("prefix_lens", prefix_lens, ndim=1, dtypes=(torch.int32,), device=device, layout="[num_reqs]")
    check_shape("prefix_lens", prefix_lens, (num_reqs,), "[num_reqs]")
    check_int("max_query_len", max_query_len, minimum=0)
    return num_reqs


def check_decode_metadata(q, seq_lens, decode_query_len, query_start_loc, token_to_req_indices) -> int:
    device = check_tensor("q", q, ndim=3, dtypes=Q_DTYPES, layout="[total_q, num_q_heads, head_dim]").device
    check_tensor("seq_lens", seq_lens, ndim=1, dtypes=(torch.int32,), device=device, layout="[num_reqs]")
    num_reqs = seq_lens.shape[0]
    if (query_start_loc is None) != (token_to_req_indices is None):
        given, missing = (("query_start_loc", "token_to_req_indices") if token_to_req_indices is None
                          else ("token_to_req_indices", "query_start_loc"))
        raise ValueError(f"{missing}: required when {given} is given (varlen decode needs both)")
    if query_start_loc is None:
        check_int("decode_query_len", decode_query_len, minimum=1)
        if q.shape[0] < num_reqs * decode_query_len:
            raise ValueError(f"q: expected at least num_reqs * decode_query_len = {num_reqs * decode_query_len} rows, got {q.shape[0]}")
    else:
        check_tensor("query_start_loc", query_start_loc, ndim=1, dtypes=(torch.int32,), device=device, layout="[num_reqs + 1]")
        check_shape("query_start_loc", query_start_loc, (num_reqs + 1,), "[num_reqs + 1]")
        check_tensor("token_to_req_indices", token_to_req_indices, ndim=1, dtypes=(torch.int32,), device=device, layout="[total_q]")
        check_shape("token_to_req_indices", token_to_req_indices, (q.shape[0],), "[total_q]")
    return num_reqs
