"""`selection="auto"` in one launch: the sampled tile-inflation estimate of codegen.selection, the
decision and both launches' offsets, computed by one small Triton kernel instead of ~20 torch ops.

On the H200 `auto` cost 110-140 us a call over the tiled launch alone (results/h200/prefill-next):
the estimate's ~20 small torch kernels (gathers, a segmented sort, reductions), each a graph node,
and the empty grid of the path not taken; how the two split was not measured. This replaces the
first (untimed on a GPU so far). Each program counts the distinct pages and the picks of a few sampled tiles of one
KV head and adds them to two device counters; the last program to arrive (an acq_rel counter, as in
the fused decode merge) decides, writes the tiled and per-token cu_seqlens (one of them zeros) and
puts the counters back to zero for the next call. The arithmetic is `selection.tile_inflation`'s,
which stays the reference the tests compare against.
"""
from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from .variants import PAGE_SIZE
from .workspace import arrival_counters

# Samples a program walks, in series. One: the launch's latency is one sample's chain of loads (cu,
# prefix, top-k) and the arrival, not eight of them (H200, short prefills at TP4/TP8: the launch took
# 7.9-14.0 us at 8 a program, 3.9-5.5 us at 1; results/h200/auto-cost).
SAMPLES_PER_PROGRAM = 1


# The counts vary with every batch; specializing on them (== 1, multiples of 16) would compile
# this small kernel anew for many batch shapes, a stall on a server's first requests.
@triton.jit(do_not_specialize=["num_reqs", "num_tiles", "samples", "search_steps", "stride_tk_h", "stride_tk_t"])
def _inflation_decision_kernel(
    topk_ptr, cu_ptr, prefix_ptr, counters_ptr, tiled_cu_ptr, per_token_cu_ptr, inflation_ptr,
    num_reqs, num_tiles, samples, topk, threshold, search_steps,
    stride_tk_h, stride_tk_t, stride_tk_k,
    BLOCK_T: tl.constexpr, TOPK_P2: tl.constexpr, PAGE: tl.constexpr, PER_PROGRAM: tl.constexpr,
    CU_BLOCK: tl.constexpr, USE_PDL: tl.constexpr,
):
    if USE_PDL:  # under PDL: the call's inputs may come from the launch before (no early trigger: prefill.py)
        tl.extra.cuda.gdc_wait()
    g = tl.program_id(0)  # KV head
    chunk = tl.program_id(1)
    N: tl.constexpr = BLOCK_T * TOPK_P2
    offs = tl.arange(0, N)
    tok_in_tile = offs // TOPK_P2
    entry = offs % TOPK_P2
    earlier = offs[None, :] < offs[:, None]  # [i, j]: j comes before i in (token, entry) order
    distinct = tl.zeros([], dtype=tl.int32)
    picks = tl.zeros([], dtype=tl.int32)
    for i in range(PER_PROGRAM):
        s = chunk * PER_PROGRAM + i
        if s < samples:
            # The sample's first token: the same spread as selection.tile_inflation (int64: no overflow).
            start = (s.to(tl.int64) * num_tiles // samples) * BLOCK_T
            token = start + tok_in_tile
            # Request of each token: how many requests end at or before it (searchsorted, right).
            lo = tl.zeros([N], dtype=tl.int32)
            hi = tl.zeros([N], dtype=tl.int32) + num_reqs
            for _ in range(search_steps):
                mid = (lo + hi) // 2
                active = lo < hi
                end = tl.load(cu_ptr + mid + 1, mask=active, other=0)
                before = end <= token
                lo = tl.where(active & before, mid + 1, lo)
                hi = tl.where(active & ~before, mid, hi)
            req = tl.minimum(lo, num_reqs - 1)
            pos = tl.load(prefix_ptr + req).to(tl.int64) + token - tl.load(cu_ptr + req)
            own_block = pos // PAGE
            n_read = tl.minimum(topk, own_block + 1)  # the entries the kernels read (read_mask)
            ids = tl.load(topk_ptr + g * stride_tk_h + token * stride_tk_t + entry * stride_tk_k,
                          mask=entry < n_read, other=-1).to(tl.int64)
            picked = (entry < n_read) & (ids >= 0) & (ids <= own_block)
            # A page is (request, block): the same id in two requests is two pages.
            key = tl.where(picked, req.to(tl.int64) * 4294967296 + ids, -1)
            same_earlier = tl.sum((earlier & (key[:, None] == key[None, :])).to(tl.int32), axis=1)
            distinct += tl.sum((picked & (same_earlier == 0)).to(tl.int32), axis=0)
            picks += tl.sum(picked.to(tl.int32), axis=0)
    tl.atomic_add(counters_ptr, distinct, sem="relaxed", scope="gpu")
    tl.atomic_add(counters_ptr + 1, picks, sem="relaxed", scope="gpu")
    # The release orders this program's counts before its arrival; the last one to arrive reads
    # every program's counts after its acquire.
    tl.debug_barrier()
    arrived = tl.atomic_add(counters_ptr + 2, 1, sem="acq_rel", scope="gpu")
    if arrived == tl.num_programs(0) * tl.num_programs(1) - 1:
        total_distinct = tl.atomic_add(counters_ptr, 0, sem="acquire", scope="gpu").to(tl.float32)
        total_picks = tl.atomic_add(counters_ptr + 1, 0, sem="acquire", scope="gpu").to(tl.float32)
        inflation = total_distinct * BLOCK_T / tl.maximum(total_picks, 1.0)
        tl.store(inflation_ptr, inflation)
        keep = (inflation <= threshold).to(tl.int32)
        for c0 in range(0, num_reqs + 1, CU_BLOCK):
            o = c0 + tl.arange(0, CU_BLOCK)
            m = o <= num_reqs
            cu = tl.load(cu_ptr + o, mask=m, other=0)
            tl.store(tiled_cu_ptr + o, cu * keep, mask=m)
            tl.store(per_token_cu_ptr + o, cu * (1 - keep), mask=m)
        tl.atomic_xchg(counters_ptr, 0, sem="relaxed", scope="gpu")  # zero for the next call (and replay)
        tl.atomic_xchg(counters_ptr + 1, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(counters_ptr + 2, 0, sem="relaxed", scope="gpu")


def decide_and_split(topk_idx: torch.Tensor, block_t: int, threshold: float, cu_seqlens_q: torch.Tensor,
                     prefix_lens: torch.Tensor, sampled_tiles: int,
                     inflation_out: torch.Tensor | None = None, *, counters: torch.Tensor | None = None,
                     use_pdl: bool = False, record: list | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(cu_seqlens of the tiled launch, of the per-token launch) in one launch: the tiled one keeps
    the offsets when the sampled inflation is at most `threshold`, else the per-token one does; the
    other gets zeros. `inflation_out` (float32, one element) receives the estimate (for tests).
    CUDA-graph safe: the grid depends on shapes only, the counters return to zero.
    `counters`: >= 3 zeroed int32 (default: the device's shared "selection" buffer; a call plan
    passes its own, so calls on two streams never share them). use_pdl: under programmatic dependent
    launch (Hopper), as the prefill launches after it. `record`: a list that receives the
    launch as (kernel, grid, args, kwargs) instead of running it (codegen.plan binds it); with
    nothing to sample it returns (cu_seqlens_q, zeros) without recording a launch."""
    if block_t < 2:
        raise ValueError(f"block_t: a tile has at least 2 tokens, got {block_t}")
    num_kv_heads, total_q, topk = topk_idx.shape
    num_reqs = cu_seqlens_q.numel() - 1
    num_tiles = total_q // block_t
    device = topk_idx.device
    if inflation_out is None:
        inflation_out = torch.empty(1, dtype=torch.float32, device=device)
    if num_tiles == 0 or num_reqs < 1:  # nothing to sample: tiles, as tile_inflation's 1.0 says
        if record is not None:
            return cu_seqlens_q, torch.zeros_like(cu_seqlens_q)
        inflation_out.fill_(1.0)
        return cu_seqlens_q.clone(), torch.zeros_like(cu_seqlens_q)
    samples = min(sampled_tiles, num_tiles)
    tiled_cu, per_token_cu = torch.empty_like(cu_seqlens_q), torch.empty_like(cu_seqlens_q)
    if counters is None:
        counters = arrival_counters(device, 3, key="selection")
    grid = (num_kv_heads, triton.cdiv(samples, SAMPLES_PER_PROGRAM))
    args = (topk_idx, cu_seqlens_q, prefix_lens, counters, tiled_cu, per_token_cu, inflation_out,
            num_reqs, num_tiles, samples, topk, float(threshold), num_reqs.bit_length(), *topk_idx.stride())
    kwargs = dict(BLOCK_T=block_t, TOPK_P2=triton.next_power_of_2(topk), PAGE=PAGE_SIZE, PER_PROGRAM=SAMPLES_PER_PROGRAM,
                  CU_BLOCK=256, USE_PDL=use_pdl, num_warps=4, launch_pdl=use_pdl)
    if record is not None:
        record.append((_inflation_decision_kernel, grid, args, kwargs))
    else:
        _inflation_decision_kernel[grid](*args, **kwargs)
    return tiled_cu, per_token_cu


@dataclasses.dataclass(frozen=True)
class PlanDecision:
    """`auto` decided inside the Gluon tile's plan launch (templates/prefill_ws.py.jinja), which builds
    every tile's plan anyway: exact over all tiles, and one launch fewer than decide_and_split. Its
    tensors: counters (>= 3 zeroed int32, put back to zero by the launch), the tiled and per-token
    launches' cu_seqlens (written by the launch), the inflation (float32, one element)."""
    counters: torch.Tensor
    tiled_cu: torch.Tensor
    per_token_cu: torch.Tensor
    inflation: torch.Tensor
    threshold: float

    @classmethod
    def for_call(cls, cu_seqlens_q: torch.Tensor, threshold: float, counters: torch.Tensor) -> "PlanDecision":
        return cls(counters, torch.empty_like(cu_seqlens_q), torch.empty_like(cu_seqlens_q),
                   torch.empty(1, dtype=torch.float32, device=cu_seqlens_q.device), float(threshold))
