"""Does the real prefill tile reach the dense rate when written like the warp-specialized Gluon rung? (H200)

gluon_rung.py's `ws=1` kernel (a 4-warp converter partition: TMA fp8 K/V -> fp16 ring; 8 consumer warps:
QK, softmax, PV left in flight) ran dense causal fp8 attention at 720 us against 670 us for Triton's bf16
dense kernel, where the Triton-language prefill tile takes ~1012-1045 us on the same FLOPs (TP1 4x2k
correlated). This probe writes the real prefill tile that way (Triton 3.6 Gluon, sm90): the paged fp8
cache, GQA rows, the tile's sparse plan, the masks and the scalar fp8 scales, and times it beside the API.

Semantics (scale mode `scalar`, fp8 e4m3fn cache, q bf16, head_dim 128, page 128, GQA 16: TP1 64/4 and
TP4 16/1). Inputs exactly as codegen.api.sparse_attn_prefill gets them (q [T, Hq, D], kv_cache
[pages, Hkv, 128, 2D] any strides with a unit last one, topk_idx [Hkv, T, topk] any strides, block_table,
cu_seqlens_q, seq_lens, prefix_lens, one-element k_scale / v_scale, sm_scale, output [T, Hq, D]).
One program = 8 consecutive query tokens of one request x the 16 query heads of one KV head: 128 rows
(row r = token r // 16, head g*16 + r % 16). Grid (cdiv(max_query_len, 8), num_reqs, Hkv), walked last tile
first (HEAVY_FIRST: a request's last tiles see the most pages, so they start first and the tail is short).

Design
  - Plan (host, torch ops, built once per input set and reused by every timed call; its cost is timed
    separately and reported as plan_ms): per program, the tile's listings (token t, entry e < n_t, n_t =
    min(topk, cdiv(p_t + 1, 128))) whose block is live for that token (0 <= id < cdiv(kv_end_t, 128),
    kv_end_t = min(p_t + 1, seq_len)), keyed (block, rank) with rank = earlier listings of the block in
    the same row, so a block a row lists twice is walked twice for that row only (the contract's
    multiplicity, as the template's listing ranks do); distinct keys in ascending block order. Each
    page is cut into 128 / BN slices and a slice no token sees any key of is dropped, so a step is one
    BN-key slice. Per step the int32 plan [programs, 3, PLANS] holds: page (physical page id), key0
    (logical position of the slice's first key) and info = n_vis | sub << 8 | tokens << 16 | whole << 24
    (n_vis: slots of the slice any getter sees; sub: the slice's first slot in its page; tokens: bit t
    when token t gets the step; whole: every token of the tile gets it and sees all BN keys: no mask);
    count [programs] = steps. Programs whose tokens are all past their request's end have 0 steps: both
    partitions then run empty loops (no early return, so they agree by construction).
  - Converter partition (4 warps, setmaxnreg PRODUCER_REGS): TMA K and V boxes [1, 1, BN, D] of the
    4-D cache descriptor (its real strides; coordinates [page, g, sub, 0] and [page, g, sub, D]) into an
    NS-stage fp8 ring (kbar / vbar, expect-tx), NS steps ahead, the page ids read from the plan a full
    iteration before the copy is issued; per step j: fp8 -> fp16 into stage j % NC of an fp16 ring, CR
    rows at a time; V rows >= n_vis zeroed while converted (a page's tail past seq_len may hold NaN, and
    p = 0 there would still give 0 * NaN); fence_async_shared, partition bar.sync, one-thread arrive on
    kready / vready. Waits kempty / vempty (QK(j - NC) / PV(j - NC) retired) before overwriting a stage.
  - Consumer (default partition, 8 warps = two warpgroups of 64 rows each): q bf16 -> fp16 once into
    shared memory (before the split); per step: wait kready, QK async, one warpgroup_mma_wait(0) that
    retires QK(j) and PV(j-1), bar.sync, arrive kempty(j) and vempty(j-1); on partial steps (whole == 0)
    scores of keys a row may not see -> -inf (its token's bit clear, or key0 + n >= the token's kv_end);
    base-2 online softmax on raw scores (row max * qk_scale, qk_scale = sm_scale * log2 e * k_scale), a
    row with no visible key yet shifts by 0 (m stays -inf, p = alpha = 0); wait vready, PV async left in
    flight. The step's plan words (key0, info) are loaded one step ahead. Epilogue: o = acc * v_scale / l
    (l = 0 -> zeros), bf16 into q's shared buffer, one TMA store [16, D] per valid token into the output
    viewed as [T * Hq, D] (rows of tokens past the request's end are never written).
  - All mbarriers have count 1 (Gluon's mbarrier.arrive is one thread's, issued after a partition-wide
    thread_barrier); ready barriers are waited at parity (j // NC) & 1, empty ones at ((j // NC) & 1) ^ 1
    (a fresh barrier passes parity 1 at once), fp8 stages at (j // NS) & 1.

  - The plan's semantics are checked on the CPU (--plan-check): `emulate` redoes the kernel's arithmetic
    from the plan (the steps, the V zeroing, the masks only on partial steps, asserting that a `whole`
    step masks nothing) in float64 and matches codegen's reference at ~2.5e-8 rel. L2 on ragged inputs
    with junk ids, a NaN tail past seq_len and a duplicate listing, and on correlated ones, BN 128 and 64.

Simplifications
  - The plan is computed on the host side with torch ops (not in the kernel), reported apart (plan_ms).
  - fp16 range: q is divided by max(|q|max / 2^15, 1) over the tile and the score scale takes it back
    (the template's q_div guard, done once per program before the split); a negative k_scale flips q.
  - GQA must be 16 and BLOCK_T 8 (128 rows); head_dim 128; the output must be contiguous (TMA store
    over [T * Hq, D]); scale mode `scalar` only.

Run
  python benchmarks/probes/gluon_tile.py --plan-check             # CPU: the plan's emulation vs the reference
  python benchmarks/probes/gluon_tile.py --aot [--out DIR]        # sm90 compile here: regs, spills, smem
  python benchmarks/probes/gluon_tile.py --time --out DIR         # on an H200: accuracy, kernel vs API
    (first: ragged accuracy checks with a NaN tail, TP1 and TP4, every config; then per case: the API's
    Triton-language tile bt4 bn128 w4 st2 up3, then each config: plan_ms, rel_l2 vs the float32 reference
    with a NaN-poisoned output, graph-timed us over 3 seeds x 4 calls, share of the bf16 matmul rate,
    vs_api = API us / this us; gluon_tile.json is rewritten after every row, so a run killed by a
    `timeout` keeps what it had)
  (--configs '[[BN, NS, NC, CR, PRODUCER_REGS], ...]' picks configs; --cases tp1_4x2k,tp1_1x8k,tp4_1x8k)
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import pathlib
import re
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "probes"))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: E402
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_init, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

from gluon_rung import alloc_rings, compile_gluon_sm90  # noqa: E402  (the rung's rings and AOT compile)

D = 128
PAGE = 128
BT = 8  # query tokens per program
GQA = 16  # query heads per KV head (TP1 64/4, TP4 16/1)
BM = BT * GQA
NUM_WARPS = 8  # consumer: two warpgroups of 64 rows
# (BN, NS = fp8 TMA ring stages, NC = fp16 ring stages, CR = rows converted per chunk, producer registers)
CONFIGS = [(128, 2, 2, 32, 56), (128, 2, 2, 64, 88), (64, 3, 3, 32, 56), (64, 4, 3, 32, 56)]
CASES = {"tp1_4x2k": ("tp1", 4, 2048), "tp1_1x8k": ("tp1", 1, 8192), "tp4_1x8k": ("tp4", 1, 8192)}


# ----------------------------------------------------------------------------------------------------------
# converter partition
@gluon.jit
def _issue(kv_desc, k8, v8, kbar, vbar, g, page, sub, j, n_steps, BN: gl.constexpr, D: gl.constexpr,
           NS: gl.constexpr):
    """TMA loads of step j's fp8 K and V boxes into fp8 stage j % NS (nothing past the last step)."""
    s = j % NS
    pred = j < n_steps
    nbytes: gl.constexpr = kv_desc.block_type.nbytes
    mbarrier.expect(kbar.index(s), nbytes, pred)
    mbarrier.expect(vbar.index(s), nbytes, pred)
    box_layout: gl.constexpr = kv_desc.layout
    k_dst = k8.index(s)._reinterpret(gl.float8e4nv, [1, 1, BN, D], box_layout)
    v_dst = v8.index(s)._reinterpret(gl.float8e4nv, [1, 1, BN, D], box_layout)
    tma.async_copy_global_to_shared(kv_desc, [page, g, sub, 0], kbar.index(s), k_dst, pred)
    tma.async_copy_global_to_shared(kv_desc, [page, g, sub, D], vbar.index(s), v_dst, pred)


@gluon.jit
def _upcast(src, dst, n_vis, BN: gl.constexpr, CR: gl.constexpr, MASK: gl.constexpr, cvt_layout: gl.constexpr):
    """fp8 shared tile -> registers -> fp16 shared tile, CR rows at a time; with MASK, rows >= n_vis are 0."""
    for c in gl.static_range(BN // CR):
        x = src.slice(c * CR, CR).load(cvt_layout).to(gl.float16)
        if MASK:
            rows = c * CR + gl.arange(0, CR, layout=gl.SliceLayout(1, cvt_layout))
            x = gl.where((rows < n_vis)[:, None], x, 0.0)
        dst.slice(c * CR, CR).store(x)


@gluon.jit
def _converter(kv_desc, k8, v8, k16, v16, bars, plan_row, g, n_steps, BN: gl.constexpr, D: gl.constexpr,
               NS: gl.constexpr, NC: gl.constexpr, CR: gl.constexpr, PLANS: gl.constexpr):
    """Worker partition (4 warps): TMA fp8 K/V into the NS ring, fp8 -> fp16 into the NC ring (V zeroed past
    n_vis on partial slices); ready[c] arrived once per use, empty[c] waited at parity ((j // NC) & 1) ^ 1."""
    kbar, vbar, kready, vready, kempty, vempty = bars
    cvt_layout: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    for i in gl.static_range(NS):
        ok = i < n_steps
        page = gl.load(plan_row + i, mask=ok, other=0)
        info = gl.load(plan_row + 2 * PLANS + i, mask=ok, other=0)
        _issue(kv_desc, k8, v8, kbar, vbar, g, page, (info >> 8) & 0xFF, i, n_steps, BN, D, NS)
    for j in range(n_steps):
        # this step's visible slots, and the page of step j + NS (its copy is issued at the end)
        info = gl.load(plan_row + 2 * PLANS + j)
        n_vis = info & 0xFF
        jn = j + NS
        okn = jn < n_steps
        page_n = gl.load(plan_row + jn, mask=okn, other=0)
        info_n = gl.load(plan_row + 2 * PLANS + jn, mask=okn, other=0)
        s = j % NS
        c = j % NC
        ph = (j // NS) & 1
        pe = ((j // NC) & 1) ^ 1
        mbarrier.wait(kbar.index(s), ph)
        mbarrier.wait(kempty.index(c), pe)  # QK(j - NC) retired
        _upcast(k8.index(s), k16.index(c), n_vis, BN, CR, False, cvt_layout)
        fence_async_shared()  # generic-proxy stores before the consumer's wgmma (async proxy) reads them
        gl.thread_barrier()  # all 4 warps' stores done before the one-thread arrive
        mbarrier.arrive(kready.index(c))
        mbarrier.wait(vbar.index(s), ph)
        mbarrier.wait(vempty.index(c), pe)  # PV(j - NC) retired
        if n_vis < BN:
            _upcast(v8.index(s), v16.index(c), n_vis, BN, CR, True, cvt_layout)
        else:
            _upcast(v8.index(s), v16.index(c), n_vis, BN, CR, False, cvt_layout)
        fence_async_shared()  # also orders this stage's fp8 reads before the TMA below overwrites it
        gl.thread_barrier()
        mbarrier.arrive(vready.index(c))
        _issue(kv_desc, k8, v8, kbar, vbar, g, page_n, (info_n >> 8) & 0xFF, jn, n_steps, BN, D, NS)


# ----------------------------------------------------------------------------------------------------------
# consumer (default partition)
@gluon.jit
def _consumer(q_s, k16, v16, bars, o_desc, plan_row, n_steps, qk_scale, v_scale, kv_lo, seq_len, n_tok, out_row0,
              HQ, head0, BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, NC: gl.constexpr, GQA: gl.constexpr,
              BT: gl.constexpr, PLANS: gl.constexpr, NUM_WARPS: gl.constexpr):
    """QK, masks, softmax, PV, epilogue. kv_lo = prefix + i0: token t of the tile sees keys < min(kv_lo + t + 1,
    seq_len). Output row of (token t, head h): (out_row0 + t) * HQ + head0 + h of the [T * Hq, D] view."""
    kbar, vbar, kready, vready, kempty, vempty = bars
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                       instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                       instr_shape=[16, D, 16])
    offs_m = gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
    offs_n = gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
    row_t = offs_m // GQA
    kv_end_row = gl.minimum(kv_lo + row_t + 1, seq_len)
    m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, s_layout))
    acc = warpgroup_mma_init(gl.zeros([BM, D], gl.float32, o_layout))
    ok0 = 0 < n_steps
    key0_n = gl.load(plan_row + PLANS, mask=ok0, other=0)
    info_n = gl.load(plan_row + 2 * PLANS, mask=ok0, other=0)
    for j in range(n_steps):
        key0 = key0_n
        info = info_n
        okn = j + 1 < n_steps
        key0_n = gl.load(plan_row + PLANS + j + 1, mask=okn, other=0)
        info_n = gl.load(plan_row + 2 * PLANS + j + 1, mask=okn, other=0)
        c = j % NC
        ph = (j // NC) & 1
        mbarrier.wait(kready.index(c), ph)
        qk = warpgroup_mma(q_s, k16.index(c).permute((1, 0)), gl.zeros([BM, BN], gl.float32, s_layout),
                           use_acc=False, is_async=True)
        qk, acc = warpgroup_mma_wait(0, deps=[qk, acc])  # retires PV(j-1) and QK(j)
        gl.thread_barrier()  # both warpgroups' wgmmas retired before the one-thread arrives
        mbarrier.arrive(kempty.index(c))
        mbarrier.arrive(vempty.index((j + NC - 1) % NC), pred=j > 0)  # V(j-1)'s stage
        if (info >> 24) == 0:  # partial step: a row sees the keys of its token's steps, before its kv_end
            tokens = (info >> 16) & 0xFF
            lim = gl.where(((tokens >> row_t) & 1) != 0, kv_end_row - key0, 0)
            qk = gl.where(offs_n[None, :] < lim[:, None], qk, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(qk, 1) * qk_scale)
        m_shift = gl.where(m_new == float("-inf"), 0.0, m_new)  # no visible key yet: exp2 gives 0, not NaN
        alpha = gl.exp2(m_i - m_shift)
        p = gl.exp2(qk * qk_scale - m_shift[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p16 = gl.convert_layout(p.to(gl.float16), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
        mbarrier.wait(vready.index(c), ph)
        acc = warpgroup_mma(p16, v16.index(c), acc, is_async=True)  # PV(j): left in flight
        m_i = m_new
    acc = warpgroup_mma_wait(0, deps=[acc])
    l_safe = gl.where(l_i > 0.0, l_i, 1.0)
    o = acc * gl.convert_layout(v_scale / l_safe, gl.SliceLayout(1, o_layout))[:, None]
    # every QK retired (the last step's bar.sync): q's buffer is free and has the bf16 tile's size and swizzle
    o_s = q_s._reinterpret(gl.bfloat16, [BM, D], q_s.layout)
    o_s.store(o.to(gl.bfloat16))
    fence_async_shared()
    gl.thread_barrier()
    for t in gl.static_range(BT):
        if t < n_tok:
            tma.async_copy_shared_to_global(o_desc, [(out_row0 + t) * HQ + head0, 0], o_s.slice(t * GQA, GQA))
    tma.store_wait(0)


@gluon.jit
def _prefill_ws(q_ptr, kv_desc, o_desc, plan_ptr, count_ptr, cu_ptr, seq_lens_ptr, prefix_lens_ptr, k_scale_ptr,
                v_scale_ptr, sm_scale, stride_q_t, stride_q_h, HQ,
                BT: gl.constexpr, GQA: gl.constexpr, D: gl.constexpr, BN: gl.constexpr, NS: gl.constexpr,
                NC: gl.constexpr, CR: gl.constexpr, PLANS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                NUM_WARPS: gl.constexpr, HEAVY_FIRST: gl.constexpr):
    BM: gl.constexpr = BT * GQA
    gl.static_assert(BM == 128)
    gl.static_assert(128 % BN == 0)
    gl.static_assert(BN % CR == 0)
    gl.static_assert(NC >= 2)
    if HEAVY_FIRST:  # the last tiles of a request see the most pages: launch them first (less tail)
        tile = gl.num_programs(0) - 1 - gl.program_id(0)
    else:
        tile = gl.program_id(0)
    req = gl.program_id(1)
    g = gl.program_id(2)
    prog = tile + gl.num_programs(0) * (req + gl.num_programs(1) * g)
    plan_row = plan_ptr + prog.to(gl.int64) * (3 * PLANS)
    n_steps = gl.load(count_ptr + prog)
    q_start = gl.load(cu_ptr + req)
    q_len = gl.load(cu_ptr + req + 1) - q_start
    i0 = tile * BT
    n_tok = gl.minimum(gl.maximum(q_len - i0, 0), BT)
    kv_lo = gl.load(prefix_lens_ptr + req) + i0
    seq_len = gl.load(seq_lens_ptr + req)

    # q: rows (token r // GQA, head g * GQA + r % GQA); bf16 -> fp16 once, into fp16's range (q_div), sign of
    # k_scale folded into q so the loop's raw row maxima stay valid.
    q_ld_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [NUM_WARPS, 1], [1, 0])
    offs_qm = gl.arange(0, BM, layout=gl.SliceLayout(1, q_ld_layout))
    offs_qd = gl.arange(0, D, layout=gl.SliceLayout(0, q_ld_layout))
    tok = offs_qm // GQA
    q_rows = (q_start + i0 + tok).to(gl.int64) * stride_q_t + (g * GQA + offs_qm % GQA) * stride_q_h
    q = gl.load(q_ptr + q_rows[:, None] + offs_qd[None, :], mask=(tok < n_tok)[:, None], other=0.0)
    qf = q.to(gl.float32)
    q_amax = gl.max(gl.max(gl.abs(qf), 1), 0)
    q_div = gl.maximum(q_amax / 32768.0, 1.0)
    qk_scale = sm_scale * 1.4426950408889634 * gl.load(k_scale_ptr)
    q_mul = gl.where(qk_scale < 0.0, -1.0, 1.0) / q_div
    qk_scale = gl.abs(qk_scale) * q_div
    v_scale = gl.load(v_scale_ptr)
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, D], gl.float16)
    q_s = gl.allocate_shared_memory(gl.float16, [BM, D], q_layout, (qf * q_mul).to(gl.float16))

    k8, v8, k16, v16, bars = alloc_rings(BN, D, NS, NC)
    fence_async_shared()  # barrier inits and q visible to the TMA unit / wgmma
    gl.thread_barrier()

    gl.warp_specialize([
        (_consumer, (q_s, k16, v16, bars, o_desc, plan_row, n_steps, qk_scale, v_scale, kv_lo, seq_len, n_tok,
                     q_start + i0, HQ, g * GQA, BM, BN, D, NC, GQA, BT, PLANS, NUM_WARPS)),
        (_converter, (kv_desc, k8, v8, k16, v16, bars, plan_row, g, n_steps, BN, D, NS, NC, CR, PLANS)),
    ], [4], [PRODUCER_REGS])


# ----------------------------------------------------------------------------------------------------------
# host side
def plans_width(topk, BN):
    return BT * topk * (PAGE // BN)


def build_plan(args, BN):
    """The tile plans of one call (torch ops on the inputs' device): (plan int32 [programs, 3, PLANS], count
    int32 [programs], grid). Programs are numbered tile + tiles * (req + reqs * g), as in the kernel."""
    q, topk_idx, table = args["q"], args["topk_idx"], args["block_table"]
    cu = args["cu_seqlens_q"].long()
    seq = args["seq_lens"].long()
    pre = args["prefix_lens"].long()
    hkv, total_q, topk = topk_idx.shape
    reqs = seq.shape[0]
    tiles = triton.cdiv(int(args["max_query_len"]), BT)
    dev = q.device
    sub_n = PAGE // BN
    q_len = cu[1:] - cu[:-1]
    loc = torch.arange(tiles * BT, device=dev).view(1, tiles, BT)
    valid = loc < q_len[:, None, None]  # [R, tiles, BT]
    tok = (cu[:-1, None, None] + loc).clamp(max=max(total_q - 1, 0))
    pos = pre[:, None, None] + loc
    kv_end = torch.minimum(pos + 1, seq[:, None, None])
    n_read = ((pos + 1).clamp(min=0) + PAGE - 1).div(PAGE, rounding_mode="floor").clamp(max=topk)
    n_caus = (kv_end.clamp(min=0) + PAGE - 1).div(PAGE, rounding_mode="floor")
    ids = topk_idx[:, tok].long()  # [Hkv, R, tiles, BT, topk]
    kk = torch.arange(topk, device=dev)
    read = valid[None, ..., None] & (kk < n_read[None, ..., None])
    live = read & (ids >= 0) & (ids < n_caus[None, ..., None])
    earlier = (ids[..., :, None] == ids[..., None, :]) & live[..., None, :] & (kk[None, :] < kk[:, None])
    rank = earlier.sum(-1)
    big = 1 << 62
    key = torch.where(live, ids * topk + rank, big)
    sees = (kv_end[None, ..., None] - ids * PAGE).clamp(0, PAGE)
    bit = (1 << torch.arange(BT, device=dev)).view(1, 1, 1, BT, 1).expand_as(key)
    progs = hkv * reqs * tiles
    width = BT * topk
    key, sees, bit = key.reshape(progs, width), sees.reshape(progs, width), bit.reshape(progs, width)
    skey, order = key.sort(dim=1)
    sees = sees.gather(1, order)
    bit = bit.gather(1, order)
    ok = skey < big
    first = ok & torch.cat([torch.ones_like(ok[:, :1]), skey[:, 1:] != skey[:, :-1]], 1)
    n_pages = first.sum(1)
    slot = torch.where(ok, first.long().cumsum(1) - 1, width)  # a dump column for the dead listings
    zeros = torch.zeros(progs, width + 1, dtype=torch.long, device=dev)
    tokens = zeros.clone().scatter_add_(1, slot, torch.where(ok, bit, 0))
    getters = zeros.clone().scatter_add_(1, slot, ok.long())
    n_vis = zeros.clone().scatter_reduce_(1, slot, torch.where(ok, sees, 0), "amax")
    min_sees = torch.full_like(zeros, PAGE).scatter_reduce_(1, slot, torch.where(ok, sees, PAGE), "amin")
    blk = zeros.clone().scatter_(1, slot, torch.where(ok, skey // topk, 0))
    tokens, getters, n_vis, min_sees, blk = (t[:, :width] for t in (tokens, getters, n_vis, min_sees, blk))
    n_tok = valid.sum(-1).view(1, reqs, tiles).expand(hkv, reqs, tiles).reshape(progs)
    req_of = torch.arange(reqs, device=dev).view(1, reqs, 1).expand(hkv, reqs, tiles).reshape(progs)
    used = torch.arange(width, device=dev)[None, :] < n_pages[:, None]
    page = table.long()[req_of[:, None], torch.where(used, blk, 0)]
    everyone = getters == n_tok[:, None]
    subs = torch.arange(sub_n, device=dev).view(1, 1, sub_n) * BN
    nv = (n_vis[..., None] - subs).clamp(0, BN)  # [P, width, sub_n]
    keep = used[..., None] & (nv > 0)
    whole = everyone[..., None] & (min_sees[..., None] - subs >= BN)
    info = nv | (subs << 8) | (tokens[..., None] << 16) | (whole.long() << 24)
    key0 = blk[..., None] * PAGE + subs
    fields = torch.stack([page[..., None].expand_as(nv), key0, info], 1).reshape(progs, 3, width * sub_n)
    keep = keep.reshape(progs, width * sub_n)
    dest = torch.where(keep, keep.long().cumsum(1) - 1, width * sub_n)
    plan = torch.zeros(progs, 3, width * sub_n + 1, dtype=torch.long, device=dev)
    plan.scatter_(2, dest[:, None, :].expand(progs, 3, width * sub_n), fields)
    plan = plan[:, :, :width * sub_n].to(torch.int32).contiguous()
    count = keep.sum(1).to(torch.int32)
    return plan, count, (tiles, reqs, hkv)


def kv_desc(kv_cache, BN):
    """The 4-D cache descriptor (all four strides honoured), box [1, 1, BN, D]: one slice of a (page, head)."""
    layout = gl.NVMMASharedLayout.get_default_for([1, 1, BN, D], gl.float8e4nv)
    return TensorDescriptor(kv_cache, list(kv_cache.shape), list(kv_cache.stride()), [1, 1, BN, D], layout)


def out_desc(out):
    assert out.is_contiguous(), "the probe's TMA store needs a contiguous output"
    flat = out.view(-1, out.shape[-1])
    return TensorDescriptor.from_tensor(flat, [GQA, D], gl.NVMMASharedLayout.get_default_for([GQA, D], gl.bfloat16))


def _constexprs(BN, NS, NC, CR, PR, topk=16):
    return dict(BT=BT, GQA=GQA, D=D, BN=BN, NS=NS, NC=NC, CR=min(CR, BN), PLANS=plans_width(topk, BN),
                PRODUCER_REGS=PR, NUM_WARPS=NUM_WARPS, HEAVY_FIRST=True)


def prepare(args, cfg):
    """Everything a timed call needs (plan, descriptors), built once: returns a zero-argument launcher."""
    BN, NS, NC, CR, PR = cfg
    q, kv, out = args["q"], args["kv_cache"], args["output"]
    hq, hkv = q.shape[1], args["num_kv_heads"]
    assert hq // hkv == GQA and q.shape[2] == D and kv.shape[2] == PAGE, "probe: GQA 16, head_dim 128 only"
    assert q.stride(2) == 1
    plan, count, grid = build_plan(args, BN)
    kd, od = kv_desc(kv, BN), out_desc(out)
    consts = _constexprs(BN, NS, NC, CR, PR, args["topk_idx"].shape[2])

    def call():
        _prefill_ws[grid](q, kd, od, plan, count, args["cu_seqlens_q"], args["seq_lens"], args["prefix_lens"],
                          args["k_scale"], args["v_scale"], float(args["sm_scale"]), q.stride(0), q.stride(1), hq,
                          **consts, num_warps=NUM_WARPS)
        return out
    call.plan, call.count = plan, count
    return call


def emulate(args, BN):
    """The kernel's arithmetic from the plan, in float64 torch (CPU is fine): per program, per step, the K/V
    slice the converter fetches (V rows >= n_vis zeroed), scores masked only on partial steps exactly as the
    consumer masks them, softmax over all steps, o = P V * v_scale / l. Asserts that a `whole` step would
    mask nothing. Checks the plan's semantics where no GPU runs the kernel."""
    plan, count, (tiles, reqs, hkv) = build_plan(args, BN)
    q, kv = args["q"].double(), args["kv_cache"]
    cu, pre, seq = args["cu_seqlens_q"].tolist(), args["prefix_lens"].tolist(), args["seq_lens"].tolist()
    qk_scale = float(args["sm_scale"]) * float(args["k_scale"][0])
    out = torch.zeros(q.shape, dtype=torch.float64)
    n = torch.arange(BN)
    for g in range(hkv):
        for r in range(reqs):
            q_len = cu[r + 1] - cu[r]
            for tile in range(tiles):
                p = tile + tiles * (r + reqs * g)
                n_tok = max(0, min(q_len - tile * BT, BT))
                steps = int(count[p])
                if n_tok == 0:
                    assert steps == 0
                    continue
                rows = q[cu[r] + tile * BT: cu[r] + tile * BT + n_tok, g * GQA:(g + 1) * GQA].reshape(-1, D)
                row_t = torch.arange(n_tok * GQA) // GQA
                kv_end = torch.clamp(pre[r] + tile * BT + row_t + 1, max=seq[r])
                scores, values = [], []
                for j in range(steps):
                    page, key0, info = (int(x) for x in plan[p, :, j])
                    n_vis, sub, tokens, whole = info & 0xFF, (info >> 8) & 0xFF, (info >> 16) & 0xFF, info >> 24
                    k = kv[page, g, sub:sub + BN, :D].double()
                    v = kv[page, g, sub:sub + BN, D:].double()
                    v = torch.where((n < n_vis)[:, None], v, 0.0)
                    s = rows @ k.T
                    lim = torch.where(((tokens >> row_t) & 1) != 0, kv_end - key0, 0)
                    seen = n[None, :] < lim[:, None]
                    if whole:
                        assert bool(seen.all()), (p, j)
                    else:
                        s = torch.where(seen, s, float("-inf"))
                    assert n_vis >= int(lim.clamp(0, BN).max()) and n_vis > 0, (p, j)
                    scores.append(s)
                    values.append(v)
                if not scores:
                    continue
                s = torch.cat(scores, 1) * qk_scale
                m = s.max(1, keepdim=True).values
                m = torch.where(m == float("-inf"), 0.0, m)
                e = torch.exp(s - m)
                l = e.sum(1, keepdim=True)
                o = (e @ torch.cat(values, 0)) / torch.where(l > 0, l, 1.0) * float(args["v_scale"][0])
                out[cu[r] + tile * BT: cu[r] + tile * BT + n_tok, g * GQA:(g + 1) * GQA] = o.view(n_tok, GQA, D)
    return out, plan, count


def plan_check():
    """CPU: the plan's emulation (emulate) against codegen's float64 reference, on ragged random inputs with
    junk ids, a NaN tail past seq_len and a duplicate listing, and on a correlated serving-like input."""
    from codegen import cases
    from codegen.accuracy import compare
    from codegen.cases import run_reference
    rows = []
    for name, kw in (("ragged", dict(q_lens=[300, 77, 203, 5], prefix_lens=[0, 200, 1500, 129], pattern="random",
                                     future_prob=0.3, tail="mixed", inner_junk=0.1)),
                     ("correlated", dict(q_lens=[640, 130], prefix_lens=[0, 1000], pattern="correlated",
                                         future_prob=0.0, compact=True))):
        case = cases.prefill_case(arch="sm90", num_q_heads=32, num_kv_heads=2, q_dtype=torch.float32, seed=3, **kw)
        a = case.args
        if name == "ragged":  # one block listed twice in a row: token 150 of request 2 (position 1650, reads 13)
            t = int(a["cu_seqlens_q"][2]) + 150
            a["topk_idx"][:, t, 1] = a["topk_idx"][:, t, 0]
        ref = run_reference(case, torch.float64)
        case.poison_past_the_end()
        for BN in (128, 64):
            t0 = time.perf_counter()
            out, plan, count = emulate(a, BN)
            cmp = compare(out.float(), ref)
            rows.append(dict(case=name, BN=BN, rel_l2=float(f"{cmp.rel_l2:.2e}"), max_abs=float(f"{cmp.max_abs:.2e}"),
                             non_finite=cmp.unwritten, ok=cmp.ok, steps_mean=round(float(count.float().mean()), 2),
                             whole_steps=int(((plan[:, 2] >> 24) & 1).sum()), s=round(time.perf_counter() - t0, 1)))
            print(rows[-1], flush=True)
    return rows


# ----------------------------------------------------------------------------------------------------------
# ahead-of-time compile
def compile_sm90(cfg):
    """sm90 compile here (no GPU); returns (compiled, ptxas log)."""
    BN, NS, NC, CR, PR = cfg
    i32 = lambda n: torch.empty(n, dtype=torch.int32)  # noqa: E731
    kv = torch.empty(8, PAGE, 4, 2 * D, dtype=torch.float8_e4m3fn).permute(0, 2, 1, 3)
    sample = dict(q_ptr=torch.empty(16, dtype=torch.bfloat16), kv_desc=kv_desc(kv, BN),
                  o_desc=out_desc(torch.empty(64, 64, D, dtype=torch.bfloat16)), plan_ptr=i32(16), count_ptr=i32(16),
                  cu_ptr=i32(4), seq_lens_ptr=i32(4), prefix_lens_ptr=i32(4),
                  k_scale_ptr=torch.empty(1), v_scale_ptr=torch.empty(1), sm_scale=D ** -0.5,
                  stride_q_t=64 * D, stride_q_h=D, HQ=64)
    return compile_gluon_sm90(_prefill_ws, sample, _constexprs(*cfg), dict(num_warps=NUM_WARPS))


def label(cfg):
    BN, NS, NC, CR, PR = cfg
    return f"bm{BM} bn{BN} w{NUM_WARPS}+4 st{NS} cr{min(CR, BN)} nc{NC} pr{PR}"


def aot(configs):
    from codegen.static.compile import _sm90_figures
    rows = []
    for cfg in configs:
        try:
            compiled, log = compile_sm90(cfg)
        except Exception as exc:  # report and go on
            rows.append(dict(config=label(cfg), error=f"{type(exc).__name__}: {str(exc)[-2000:]}"))
            print(rows[-1], flush=True)
            continue
        fig = _sm90_figures(compiled, log)
        ptx = compiled.asm["ptx"]
        rows.append(dict(config=label(cfg), registers=fig["registers"], spill_bytes=fig["spill"],
                         shared_bytes=fig["shared_bytes"], wgmma=ptx.count("wgmma.mma_async"),
                         wgmma_wait=sorted(set(ln.strip() for ln in ptx.splitlines() if "wgmma.wait_group" in ln)),
                         cvt_e4m3=ptx.count("cvt.rn.f16x2.e4m3x2"), bar_sync=ptx.count("bar.sync"),
                         tma_load=ptx.count("cp.async.bulk.tensor.4d"), tma_store=ptx.count("cp.async.bulk.tensor.2d"),
                         setmaxnreg=sorted(set(re.findall(r"setmaxnreg\.(\w+)\.sync\.aligned\.u32\s+(\d+)", ptx))),
                         ptxas=[ln for ln in log.splitlines() if "spill" in ln or "serialized" in ln.lower()][:6],
                         notes=fig["notes"]))
        print(rows[-1], flush=True)
    return rows


# ----------------------------------------------------------------------------------------------------------
# GPU: accuracy and timing
def _ragged_checks(configs, rows, dump):
    """Accuracy only, on inputs the timed cases lack: ragged requests with prefixes (tiles with fewer than 8
    tokens, rows past a request's end), pages whose tail past seq_len holds NaN, random selections with junk
    ids inside the read entries and a stale tail, one id listed twice in a row."""
    from codegen import cases
    from codegen.accuracy import compare
    from codegen.cases import run_reference
    for layout, hq, hkv in (("tp1", 64, 4), ("tp4", 16, 1)):
        case = cases.prefill_case(arch="sm90", q_lens=[300, 77, 1000, 5], prefix_lens=[0, 200, 1500, 129],
                                  num_q_heads=hq, num_kv_heads=hkv, q_dtype=torch.bfloat16, device="cuda", seed=1,
                                  pattern="random", future_prob=0.3, tail="mixed", inner_junk=0.1)
        a = case.args
        # one duplicate listing: token 700 of request 2 (position 2200: 18 causal blocks, reads 16) lists its
        # first entry's block again in its second entry.
        tk = a["topk_idx"]
        t = int(a["cu_seqlens_q"][2]) + 700
        tk[:, t, 1] = tk[:, t, 0]
        ref = run_reference(case, torch.float32, on_device=True)
        case.poison_past_the_end()
        for cfg in configs:
            try:
                case.poison()
                prepare(a, cfg)()
                torch.cuda.synchronize()
                cmp = compare(a["output"], ref, torch.float16)
                rows.append(dict(case=f"ragged {layout}", config=label(cfg), rel_l2=float(f"{cmp.rel_l2:.2e}"),
                                 max_abs=float(f"{cmp.max_abs:.2e}"), non_finite=cmp.unwritten, ok=cmp.ok))
            except Exception as exc:
                rows.append(dict(case=f"ragged {layout}", config=label(cfg),
                                 error=f"{type(exc).__name__}: {exc}"[:400]))
            print(rows[-1], flush=True)
            dump()


def time_cases(configs, case_names, result, dump):
    import bench
    from codegen import api
    from codegen.accuracy import compare
    from codegen.cases import run_reference
    from codegen.configs import LaunchConfig
    from codegen.timing import graph_time, matmul_flops
    from codegen.workload import useful_flops
    peak = matmul_flops()
    print(f"bf16 matmul: {peak / 1e12:.0f} TFLOP/s; torch {torch.__version__}, triton {triton.__version__}", flush=True)
    api_cfg = LaunchConfig(block_t=4, block_n=128, num_warps=4, num_stages=2, kv_upcast=3)
    result.update(peak_tflops=round(peak / 1e12, 1), torch=torch.__version__, triton=triton.__version__,
                  device=torch.cuda.get_device_name(), rows=[])
    rows = result["rows"]
    for name in case_names:
        layout, batch, tokens = CASES[name]
        spec = bench.Spec("prefill", layout, "scalar", batch, tokens, 0, "correlated")
        try:
            cases_ = [bench.build(spec, "sm90", seed) for seed in range(3)]
            flops = useful_flops(cases_[0])
            ref = run_reference(cases_[0], torch.float32, on_device=True)
        except Exception as exc:
            rows.append(dict(case=name, error=f"build: {type(exc).__name__}: {exc}"[:400]))
            print(rows[-1], flush=True)
            dump()
            continue
        # the API (Triton-language tile) first, same process, same inputs
        api_us = None
        try:
            calls = [lambda c=c: api.sparse_attn_prefill(**c.args, config=api_cfg, selection="tiled") for c in cases_]
            cases_[0].poison()
            calls[0]()
            err = compare(cases_[0].output, ref).rel_l2
            t = graph_time(calls * 4, replays=10)
            api_us = t.median_us
            rows.append(dict(case=name, kernel="api bt4 bn128 w4 st2 up3", us=round(t.median_us, 1),
                             share=round(flops / t.median_us * 1e6 / peak, 3), rel_l2=float(f"{err:.2e}")))
        except Exception as exc:
            rows.append(dict(case=name, kernel="api", error=f"{type(exc).__name__}: {exc}"[:400]))
        print(rows[-1], flush=True)
        dump()
        for cfg in configs:
            try:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                calls = [prepare(c.args, cfg) for c in cases_]
                torch.cuda.synchronize()
                plan_ms = (time.perf_counter() - t0) * 1e3 / len(cases_)
                steps = calls[0].count.long()
                cases_[0].poison()
                calls[0]()
                torch.cuda.synchronize()
                cmp = compare(cases_[0].output, ref, torch.float16)
                t = graph_time(calls * 4, replays=10)
                row = dict(case=name, kernel="gluon_tile", config=label(cfg), us=round(t.median_us, 1),
                           share=round(flops / t.median_us * 1e6 / peak, 3),
                           tflops=round(flops / t.median_us / 1e6, 1), rel_l2=float(f"{cmp.rel_l2:.2e}"),
                           max_abs=float(f"{cmp.max_abs:.2e}"), non_finite=cmp.unwritten,
                           gate_5e3=cmp.unwritten == 0 and cmp.rel_l2 <= 5e-3, plan_ms=round(plan_ms, 2),
                           steps_mean=round(float(steps.float().mean()), 2), steps_max=int(steps.max()),
                           programs=int(steps.numel()))
                if api_us:
                    row["vs_api"] = round(api_us / t.median_us, 3)
                rows.append(row)
            except Exception as exc:
                rows.append(dict(case=name, kernel="gluon_tile", config=label(cfg),
                                 error=f"{type(exc).__name__}: {exc}"[:400], tb=traceback.format_exc()[-800:]))
            print(rows[-1], flush=True)
            dump()
        del cases_, ref
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--aot", action="store_true", help="compile for sm90 here and print registers/spills")
    parser.add_argument("--time", action="store_true", help="check and time on the GPU")
    parser.add_argument("--plan-check", action="store_true", help="CPU: the plan's emulation against the reference")
    parser.add_argument("--no-ragged", action="store_true", help="skip the ragged accuracy checks (with --time)")
    parser.add_argument("--out", type=pathlib.Path, help="directory for gluon_tile.json")
    parser.add_argument("--configs", type=str, default=None, help="JSON list of [BN, NS, NC, CR, PRODUCER_REGS]")
    parser.add_argument("--cases", type=str, default=",".join(CASES), help="comma list of " + ", ".join(CASES))
    args = parser.parse_args()
    configs = [tuple(c) for c in json.loads(args.configs)] if args.configs else CONFIGS
    result = {}

    def dump():
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "gluon_tile.json").write_text(json.dumps(result, indent=1))
    if args.plan_check:
        result["plan_check"] = plan_check()
        dump()
    if args.aot:
        result["aot"] = aot(configs)
        dump()
    if args.time:
        if not args.no_ragged:  # rows land in the JSON as they come: a hang (killed by `timeout`) keeps them
            result["ragged"] = []
            _ragged_checks(configs, result["ragged"], dump)
        time_cases(configs, [c for c in args.cases.split(",") if c], result, dump)
    dump()


if __name__ == "__main__":
    main()
