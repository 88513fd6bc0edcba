"""The opt-in check of index values: MSA_TUNE_CHECK_VALUES=1 in the environment.

validate.py looks at shapes, dtypes and devices only. Reading values means copying them to the
host, a device sync per call (and impossible inside CUDA-graph capture), so it is off by default;
set the variable (also for vLLM's processes) while debugging a caller. Each failure is a
ValueError naming the argument and the first offending index.

What the kernels do without it (README "Bad input"): a token sees the keys before min(its
position + 1, seq_len), so a negative or too small seq_len, any prefix_lens, and decode's
query_start_loc give wrong (or zero) rows but stay in bounds; a seq_len longer than its
block-table row can make the kernels read past that row (decode always; prefill when prefix_lens
is that long too). cu_seqlens_q (prefill's rows of q, topk_idx and output), token_to_req_indices
and the block-table entries a request uses are addresses, used unchecked: out-of-range ones read
or write outside those tensors.
"""
from __future__ import annotations

import os

import torch

from . import validate
from .variants import PAGE_SIZE

ENV = "MSA_TUNE_CHECK_VALUES"


_enabled: bool | None = None  # the environment's answer, read at the first call of this process


def values_checked() -> bool:
    """Whether MSA_TUNE_CHECK_VALUES=1. The environment is read once per process, at the first call
    (vLLM's workers inherit it): an environment lookup costs microseconds, a call's whole host path
    with a reused call plan little more. read_environment() reads it again."""
    if _enabled is None:
        return read_environment()
    return _enabled


def read_environment() -> bool:
    """Reads MSA_TUNE_CHECK_VALUES now (1/on/true/yes turn the check on; unset, 0/off/false/no leave it
    off; anything else is a ValueError naming it); for a change made after the first call, e.g.
    os.environ set in a running interpreter."""
    global _enabled
    _enabled = validate.env_switch(ENV, default=False)
    return _enabled


def check_prefill_call(q, kv_cache, topk_idx, block_table, cu_seqlens_q, seq_lens, prefix_lens, max_query_len,
                       num_kv_heads, sm_scale, output, k_scale, v_scale, *, arch) -> None:
    """sparse_attn_prefill's arguments, shapes first (validate.py), then values. Called before the
    call-plan lookup: a plan is reused for every call of its shape, while values change per call."""
    validate.check_prefill_metadata(q, cu_seqlens_q, seq_lens, prefix_lens, max_query_len, block_table)
    validate.check_common(arch, q, kv_cache, topk_idx, num_kv_heads, sm_scale, output, k_scale, v_scale)
    check_prefill_values(q, kv_cache, block_table, cu_seqlens_q, seq_lens, prefix_lens, max_query_len)


def check_decode_call(q, kv_cache, topk_idx, block_table, seq_lens, num_kv_heads, sm_scale, output, decode_query_len,
                      k_scale, v_scale, query_start_loc, token_to_req_indices, *, arch) -> None:
    """sparse_attn_decode's arguments, shapes first (validate.py), then values (see check_prefill_call)."""
    validate.check_decode_metadata(q, seq_lens, decode_query_len, query_start_loc, token_to_req_indices, block_table)
    validate.check_common(arch, q, kv_cache, topk_idx, num_kv_heads, sm_scale, output, k_scale, v_scale)
    check_decode_values(q, kv_cache, block_table, seq_lens, query_start_loc, token_to_req_indices)


def check_prefill_values(q, kv_cache, block_table, cu_seqlens_q, seq_lens, prefix_lens, max_query_len) -> None:
    seq, prefix, cu = _host(seq_lens), _host(prefix_lens), _host(cu_seqlens_q)
    _non_negative("seq_lens", seq)
    _non_negative("prefix_lens", prefix)
    _rising_from_zero("cu_seqlens_q", cu, end=q.shape[0], end_is="the token count of q")
    q_lens = cu[1:] - cu[:-1]
    wrong = _first(prefix + q_lens != seq)
    if wrong is not None:
        b = wrong
        raise ValueError(f"seq_lens[{b}]: expected prefix_lens[{b}] + query length (cu_seqlens_q[{b + 1}] - "
                         f"cu_seqlens_q[{b}]) = {int(prefix[b])} + {int(q_lens[b])} = {int(prefix[b] + q_lens[b])}, "
                         f"got {int(seq[b])}")
    longer = _first(q_lens > max_query_len)
    if longer is not None:  # the grid covers max_query_len tokens per request: the rest would stay unwritten
        raise ValueError(f"max_query_len: expected >= every query length, got {max_query_len}; request {longer} "
                         f"has {int(q_lens[longer])} (cu_seqlens_q[{longer + 1}] - cu_seqlens_q[{longer}])")
    _block_ids(block_table, seq, kv_cache.shape[0])


def check_decode_values(q, kv_cache, block_table, seq_lens, query_start_loc, token_to_req_indices) -> None:
    seq = _host(seq_lens)
    _non_negative("seq_lens", seq)
    if query_start_loc is not None:
        starts = _host(query_start_loc)
        # Rows past the last start are CUDA-graph padding (come out as zeros), so it may end early.
        _rising_from_zero("query_start_loc", starts, end=q.shape[0], end_is="the row count of q", exact=False)
        reqs = _host(token_to_req_indices)[: int(starts[-1])]
        outside = _first((reqs < 0) | (reqs >= len(seq)))
        if outside is not None:
            raise ValueError(f"token_to_req_indices[{outside}]: expected a request in [0, {len(seq)}), "
                             f"got {int(reqs[outside])}")
    _block_ids(block_table, seq, kv_cache.shape[0])


def _host(x: torch.Tensor) -> torch.Tensor:
    return x.detach().to("cpu", torch.int64)


def _first(mask: torch.Tensor) -> int | None:
    hits = mask.nonzero()
    return int(hits[0, 0]) if len(hits) else None


def _non_negative(name: str, values: torch.Tensor) -> None:
    bad = _first(values < 0)
    if bad is not None:
        raise ValueError(f"{name}[{bad}]: expected >= 0, got {int(values[bad])}")


def _rising_from_zero(name: str, values: torch.Tensor, *, end: int, end_is: str, exact: bool = True) -> None:
    if int(values[0]) != 0:
        raise ValueError(f"{name}[0]: expected 0, got {int(values[0])}")
    falls = _first(values[1:] < values[:-1])
    if falls is not None:
        raise ValueError(f"{name}[{falls + 1}]: expected >= {name}[{falls}] = {int(values[falls])} "
                         f"(offsets rise), got {int(values[falls + 1])}")
    last = len(values) - 1
    if (int(values[last]) != end) if exact else (int(values[last]) > end):
        expected = f"{end}" if exact else f"<= {end}"
        raise ValueError(f"{name}[{last}]: expected {expected} ({end_is}), got {int(values[last])}")


def _block_ids(block_table: torch.Tensor, seq: torch.Tensor, num_blocks: int) -> None:
    """The entries each request uses, its first cdiv(seq_len, 128), must name pages of the cache;
    the entries after them are never read (any value)."""
    table = _host(block_table)
    used = (seq.clamp_min(0) + PAGE_SIZE - 1) // PAGE_SIZE
    short = _first(used > table.shape[1])
    if short is not None:
        raise ValueError(f"block_table: expected at least {int(used[short])} columns for request {short} "
                         f"(seq_lens[{short}] = {int(seq[short])} keys), got {table.shape[1]}")
    read = torch.arange(table.shape[1]) < used[:, None]
    outside = (read & ((table < 0) | (table >= num_blocks))).flatten().nonzero()
    if len(outside):
        b, j = divmod(int(outside[0, 0]), table.shape[1])
        raise ValueError(f"block_table[{b}, {j}]: expected a page of kv_cache in [0, {num_blocks}), "
                         f"got {int(table[b, j])}")
