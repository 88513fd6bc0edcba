# GENERATED FILE - DO NOT EDIT. Regenerate with `python -m codegen render`.
# template: templates/prefill_ws.py.jinja (with templates/_attend.jinja, templates/_tile_plan.jinja)
# variant: sm90_prefill_ws_per_token_head (arch=sm90, kernel=prefill_ws, scale_mode=per_token_head)
# inputs-sha256: 6b08bf5ad7e46219f07cf7e9daf8b0dd0af6527a112c97ada0fa7c5646ab145c
"""MSA sparse-attention prefill, sm90, the warp-specialized tile (Gluon), KV scale mode `per_token_head`.

The same tile as prefill.py.jinja's (a program = block_t consecutive query tokens of one request x the
GQA query heads of one KV head, walking the union of the tokens' selections, each distinct page loaded
once per listing rank), written in Gluon so that Hopper's pipeline is explicit: 128 rows a program
(block_t = 128 // GQA: 8 tokens at GQA 16, 16 at GQA 8) and one 128-key page a step.

Two launches:
  - `_tile_plan_kernel` (Triton language): each tile's plan, the same code as the Triton tile's
    (templates/_tile_plan.jinja), into an int64 scratch: [programs, 2, PLAN] (a word per step: page,
    block, whether every row sees every key; and its aux: the tokens that get it, the slots any of
    them sees), then a step count per program; under selection 'auto' it also decides tiles or the
    per-token walk from those plans (codegen.selection_kernel.PlanDecision).
  - `_prefill_ws_kernel` (Gluon), two partitions (gl.warp_specialize):
      converter (4 warps): TMA of the fp8 K and V pages into a 2-stage ring, fp8 -> fp16 into a
      2-stage fp16 ring, CONVERT_ROWS rows at a time, V rows past the visible slots zeroed (a page's
      tail may hold NaN, and p = 0 there would still give 0 * NaN), K and V rows multiplied by their
      per-token scale over the page's largest |scale| (fp16 keeps fp8's range; the consumer takes the
      largest scale back); then it signals the consumer;
      consumer (8 warps, two warpgroups of 64 rows in ping-pong): in its turn a warpgroup issues PV(j-1)
      and QK(j) and hands the turn over; one wgmma wait retires both; masks only on partial steps,
      base-2 online softmax on raw scores, run under the other warpgroup's MMAs.
    Triton-language kernels wait for every PV MMA once V passes through registers (an fp8 V always
    does): results/h200/prefill-tile-ladder. Here the MMA warps never convert.
The TMA ring's two mbarriers (count 1, expect-tx) are the converter's; the fp16 ring and the turns use
named barriers (below: results/h200/prefill-ws-pingpong). Programs are launched last tile first (a
request's last tiles see the most pages).
Needs: fp8 e4m3fn K/V through a 4-D TMA descriptor, head_dim 128, GQA 8 or 16 (codegen.api checks).
Both launches, the partitions and their helpers live in one module, so it passes 400 lines.
"""
import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_init, warpgroup_mma_wait)

# Gluon names that differ between Triton 3.6 (the H200 image) and later Tritons (CI's 3.9): the
# partition-wide barrier (thread_barrier / barrier), the TMA load (async_copy_global_to_shared /
# async_load) and a shared buffer's reinterpretation (_reinterpret / reinterpret, below: both helpers
# are compiled only for the Triton that has them).
_cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


@gluon.jit
def _reinterpret_private(buffer, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
    return buffer._reinterpret(dtype, shape, layout)


@gluon.jit
def _reinterpret_public(buffer, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
    return buffer.reinterpret(dtype, shape, layout)


_reinterpret = (_reinterpret_public if hasattr(gl.shared_memory_descriptor, "reinterpret")
                else _reinterpret_private)

# The fp16 ring and the MMA warpgroups' turns synchronize through named hardware barriers (bar.sync /
# bar.arrive on an id, counting threads), not mbarriers: Triton 3.6 puts a barrier across the whole partition
# before an mbarrier arrive (one thread's) or wait in the MMA partition, which would hold its two warpgroups
# in lockstep. Each signal is an arrive of the threads that give it and a sync of the threads that take it;
# a barrier's rounds alternate (a signal is never given twice before it is taken), which the ring's order
# guarantees. Triton's warp_specialize uses ids 0-2 here; these take 6-15 of the 16.
TURN_BAR = gl.constexpr(6)     # + warpgroup: its turn to issue its MMAs (256 = both warpgroups)
KEMPTY_BAR = gl.constexpr(8)   # + stage: both warpgroups' QK of the stage retired (384 = both + the converter)
VEMPTY_BAR = gl.constexpr(10)  # + stage: both warpgroups' PV of the stage retired (384)
READY_BAR = gl.constexpr(12)   # + 2 * stage + warpgroup: the stage's K and V converted (256 = converter + one)
NAMED_BARRIERS = range(6, 16)  # the ids above (tests check that Triton's own stay below)


@gluon.jit
def _gdc_wait():
    """Under programmatic dependent launch: wait for the launch before this one (its writes visible)."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _named_barrier(ids, count: gl.constexpr, SYNC: gl.constexpr, pred):
    """bar.sync (SYNC) or bar.arrive of each thread on barrier ids[thread] for `count` threads, where
    pred[thread] != 0 (ids, pred: int32, one element a thread; pred uniform over a warp)."""
    counts = gl.full(ids.shape, count, gl.int32, ids.type.layout)
    if SYNC:
        gl.inline_asm_elementwise("{ .reg .pred p; setp.ne.s32 p, $3, 0; @p bar.sync $1, $2; mov.u32 $0, 0; }",
                                  "=r,r,r,r", [ids, counts, pred], dtype=gl.int32, is_pure=False, pack=1)
    else:
        gl.inline_asm_elementwise("{ .reg .pred p; setp.ne.s32 p, $3, 0; @p bar.arrive $1, $2; mov.u32 $0, 0; }",
                                  "=r,r,r,r", [ids, counts, pred], dtype=gl.int32, is_pure=False, pack=1)

ARCH = "sm90"
SCALE_MODE = "per_token_head"
PAGE = 128
ROWS = 128  # query rows a program holds: block_t tokens x GQA heads, two warpgroups of 64
HEAD_DIM = 128
BLOCK_N = PAGE  # keys a step: a page (two fp8 and two fp16 stages of K and V fill the shared memory)
STAGES = 2
CONSUMER_WARPS = 8
CONVERTER_WARPS = 4
# Registers of a converter thread (setmaxnreg); the consumer's warps get the rest.
CONVERTER_REGS = 88  # the scales' loads and maxima too (56-80 spilled)
PLAN_WARPS = 4


@triton.jit
def _tile_plan_kernel(
    topk_ptr, block_table_ptr, cu_seqlens_q_ptr, seq_lens_ptr, prefix_lens_ptr, plan_ptr, topk,
    stride_tk_h, stride_tk_t, stride_tk_k, stride_bt_r, stride_bt_b,
    counters_ptr, tiled_cu_ptr, per_token_cu_ptr, inflation_ptr, threshold,
    PAGE: tl.constexpr, TOPK_P2: tl.constexpr, BLOCK_T: tl.constexpr, PLAN: tl.constexpr,
    DECIDE: tl.constexpr, CU_BLOCK: tl.constexpr, USE_PDL: tl.constexpr,
):
    """One tile's plan and step count (grid: tiles, requests, KV heads; programs numbered as the
    Gluon kernel numbers them). DECIDE (selection 'auto'): also `auto`'s decision, exact over every
    tile: the tiles' steps x BLOCK_T over the tokens' picks (what codegen.selection.tile_inflation
    samples); the last program to arrive writes the tiled and per-token launches' cu_seqlens (the
    path not taken gets zeros), the inflation, and puts the counters back to zero."""
    if USE_PDL:  # under PDL: the call's inputs may come from the launch before (no early trigger: prefill.py)
        tl.extra.cuda.gdc_wait()
    i0 = tl.program_id(0) * BLOCK_T
    req = tl.program_id(1)
    g = tl.program_id(2)
    programs = tl.num_programs(0) * tl.num_programs(1) * tl.num_programs(2)
    count_ptr = plan_ptr + programs.to(tl.int64) * (2 * PLAN)
    prog = tl.program_id(0) + tl.num_programs(0) * (req + tl.num_programs(1) * g)
    q_start = tl.load(cu_seqlens_q_ptr + req)
    q_len = tl.load(cu_seqlens_q_ptr + req + 1) - q_start
    if i0 < q_len:
        prefix = tl.load(prefix_lens_ptr + req)
        seq_len = tl.load(seq_lens_ptr + req)
        block_table_row_ptr = block_table_ptr + req.to(tl.int64) * stride_bt_r
        n_tok = tl.minimum(q_len - i0, BLOCK_T)
        # Blocks any token of the tile may see: [0, tile_blocks) (its last token sees the most).
        tile_blocks = tl.cdiv(tl.minimum(prefix + i0 + n_tok, seq_len), PAGE)
        tile_topk_ptr = topk_ptr + g * stride_tk_h + (q_start + i0).to(tl.int64) * stride_tk_t
        offs_k = tl.arange(0, TOPK_P2)
        # The tile's plan, built once: its entries in (token, entry) order, each token's first n_read
        # only. A page is loaded once per listing rank: at the first (block, rank) listing in that
        # order, for every row that lists the block more than `rank` times (a row listing it twice
        # gets it twice, as a per-token walk does, and no other row does). The walk below is then a
        # counted loop that reads each page from the plan's scratch, so its K/V loads can be prefetched.
        pos = tl.arange(0, PLAN)
        te_f = pos // TOPK_P2
        ke_f = pos % TOPK_P2
        n_read_f = tl.minimum(topk, tl.cdiv(tl.minimum(prefix + i0 + te_f + 1, seq_len), PAGE))
        read_f = (te_f < n_tok) & (ke_f < n_read_f)  # never a load past a token's first n_read entries
        blk_f = tl.load(tile_topk_ptr + te_f * stride_tk_t + ke_f * stride_tk_k, mask=read_f, other=-1)
        live_f = read_f & (blk_f >= 0) & (blk_f < tile_blocks)  # block numbers, never positions (no int32 wrap)
        # rank: listings of the same block earlier in the same token's row (L1-resident reloads).
        rank_f = tl.zeros([PLAN], dtype=tl.int32)
        for kk in tl.static_range(TOPK_P2):
            earlier_col = tl.load(tile_topk_ptr + te_f * stride_tk_t + kk * stride_tk_k, mask=read_f & (ke_f > kk),
                                  other=-1)
            rank_f += (earlier_col == blk_f).to(tl.int32)
        # Applied already: an earlier token lists the block more than `rank` times. Per listing, also
        # which tokens get the page (`tokens_f`, a bit per token: a partial step builds the rows' mask
        # from it, so no per-row listing is held through the walk) and what they see of it: `whole`
        # when every token of the tile gets it and sees all PAGE keys (the walk then masks nothing),
        # `n_vis_f` the most keys any of them sees (the slots a load needs).
        applied_f = pos < 0
        whole_f = live_f
        n_vis_f = tl.zeros([PLAN], dtype=tl.int32)
        tokens_f = tl.zeros([PLAN], dtype=tl.int32)
        for tt in tl.static_range(BLOCK_T):
            kv_end_tt = tl.minimum(prefix + i0 + tt + 1, seq_len)
            n_read_tt = tl.minimum(topk, tl.cdiv(kv_end_tt, PAGE))
            row_tt = tl.load(tile_topk_ptr + tt * stride_tk_t + offs_k * stride_tk_k,
                             mask=offs_k < tl.where(tt < n_tok, n_read_tt, 0), other=-1)
            listed = tl.sum((blk_f[:, None] == row_tt[None, :]).to(tl.int32), axis=1)
            applied_f = applied_f | ((te_f > tt) & (listed > rank_f))
            gets = listed > rank_f
            tokens_f = tokens_f | (gets.to(tl.int32) << tt)
            # Read for live listings only, whose blocks are < tile_blocks (no int32 wrap in blk_f * PAGE).
            sees = tl.minimum(tl.maximum(kv_end_tt - blk_f * PAGE, 0), PAGE)
            whole_f = whole_f & ((tt >= n_tok) | (gets & (sees == PAGE)))
            n_vis_f = tl.maximum(n_vis_f, tl.where(gets, sees, 0))
        first_f = live_f & ~applied_f
        plan_f = tl.cumsum(first_f.to(tl.int32), axis=0) - 1  # position in the walk
        n_plan = tl.sum(first_f.to(tl.int32), axis=0)
        pages_f = tl.load(block_table_row_ptr + tl.where(first_f, blk_f, 0) * stride_bt_b, mask=first_f, other=0)
        # One word per listing (page, block, whole), so a step reads its page with one load.
        key_f = (pages_f.to(tl.int64) << 32) | (tl.where(first_f, blk_f, 0).to(tl.int64) << 1) | whole_f.to(tl.int64)
        tl.static_assert(PAGE < 256 and BLOCK_T <= 16, "aux_f holds a visible length in 8 bits, a token mask in 16")
        aux_f = (tokens_f << 8) | n_vis_f  # read only by partial steps; n_vis_f <= PAGE < 256
        # One iteration per BLOCK_N-key slice (SUBTILES a page), not a page with its slices unrolled:
        # an unrolled body keeps two slices' K/V buffers and registers live, and a 128-row tile spills.
        # The plan goes to this program's rows of the scratch (int64 [programs, 2, PLAN]: words, aux), so
        # a step reads its page with one scalar load that the pipeliner prefetches with the K/V
        # slices, not a block-wide reduction (a barrier across the warps) on the critical path.
        prog = tl.program_id(0) + tl.num_programs(0) * (req + tl.num_programs(1) * g)
        plan_row_ptr = plan_ptr + prog.to(tl.int64) * (2 * PLAN)
        tl.store(plan_row_ptr + plan_f, key_f, mask=first_f)
        tl.store(plan_row_ptr + PLAN + plan_f, aux_f.to(tl.int64), mask=first_f)
        # A token's picks: its read entries naming a block it may see (the per-token walk's steps).
        picks = tl.sum((read_f & (blk_f >= 0) & (blk_f <= (prefix + i0 + te_f) // PAGE)).to(tl.int32), axis=0)
    else:  # the grid covers max_query_len: no step for a tile past its request's end
        n_plan = 0
        picks = 0
    tl.store(count_ptr + prog, n_plan)
    if DECIDE:
        tl.atomic_add(counters_ptr, n_plan, sem="relaxed", scope="gpu")
        tl.atomic_add(counters_ptr + 1, picks, sem="relaxed", scope="gpu")
        # The release orders this program's counts before its arrival; the last one to arrive reads
        # every program's counts after its acquire.
        tl.debug_barrier()
        arrived = tl.atomic_add(counters_ptr + 2, 1, sem="acq_rel", scope="gpu")
        if arrived == programs - 1:
            steps = tl.atomic_add(counters_ptr, 0, sem="acquire", scope="gpu").to(tl.float32)
            all_picks = tl.atomic_add(counters_ptr + 1, 0, sem="acquire", scope="gpu").to(tl.float32)
            inflation = steps * BLOCK_T / tl.maximum(all_picks, 1.0)
            tl.store(inflation_ptr, inflation)
            keep = (inflation <= threshold).to(tl.int32)
            num_reqs = tl.num_programs(1)
            for c0 in range(0, num_reqs + 1, CU_BLOCK):
                o = c0 + tl.arange(0, CU_BLOCK)
                m = o <= num_reqs
                cu = tl.load(cu_seqlens_q_ptr + o, mask=m, other=0)
                tl.store(tiled_cu_ptr + o, cu * keep, mask=m)
                tl.store(per_token_cu_ptr + o, cu * (1 - keep), mask=m)
            tl.atomic_xchg(counters_ptr, 0, sem="relaxed", scope="gpu")  # zero for the next call (and replay)
            tl.atomic_xchg(counters_ptr + 1, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(counters_ptr + 2, 0, sem="relaxed", scope="gpu")


@gluon.jit
def _step_words(plan_row, j, n_steps, PLAN: gl.constexpr, PAGE: gl.constexpr):
    """Step j's plan: (page, block, whole, tokens, n_vis); zeros past the last step. `whole`: every row
    sees every key (no mask, all slots visible); else `tokens` (a bit per token of the tile) get it and
    the first `n_vis` slots are seen by one of them."""
    ok = j < n_steps
    key = gl.load(plan_row + j, mask=ok, other=0)
    whole = (key & 1) != 0
    aux = gl.load(plan_row + PLAN + j, mask=ok & ((key & 1) == 0), other=PAGE).to(gl.int32)
    page = (key >> 32).to(gl.int32)
    blk = ((key >> 1) & 0x7FFFFFFF).to(gl.int32)
    return page, blk, whole, aux >> 8, aux & 0xFF


# ----------------------------------------------------------------------------------------------------------
# converter partition
@gluon.jit
def _issue(kv_desc, k8, v8, kbar, vbar, g, page, j, n_steps, BN: gl.constexpr, D: gl.constexpr, NS: gl.constexpr):
    """TMA of step j's fp8 K and V pages into fp8 stage j % NS (nothing past the last step)."""
    s = j % NS
    pred = j < n_steps
    nbytes: gl.constexpr = kv_desc.block_type.nbytes
    mbarrier.expect(kbar.index(s), nbytes, pred)
    mbarrier.expect(vbar.index(s), nbytes, pred)
    box_layout: gl.constexpr = kv_desc.layout
    k_dst = _reinterpret(k8.index(s), gl.float8e4nv, [1, 1, BN, D], box_layout)
    v_dst = _reinterpret(v8.index(s), gl.float8e4nv, [1, 1, BN, D], box_layout)
    _tma_load(kv_desc, [page, g, 0, 0], kbar.index(s), k_dst, pred)
    _tma_load(kv_desc, [page, g, 0, D], vbar.index(s), v_dst, pred)


@gluon.jit
def _convert(src, dst, n_vis, ratio_s, BN: gl.constexpr, CR: gl.constexpr,
             ZERO_PAST: gl.constexpr, cvt_layout: gl.constexpr):
    """fp8 shared tile -> registers -> fp16 shared tile, CR rows at a time, row n multiplied by its
    fp16 ratio (ratio_s[n]: its scale over the page's largest). ZERO_PAST: rows >= n_vis are 0."""
    for c in gl.static_range(BN // CR):
        x = src.slice(c * CR, CR).load(cvt_layout)
        rows = c * CR + gl.arange(0, CR, layout=gl.SliceLayout(1, cvt_layout))
        r = ratio_s.slice(c * CR, CR).load(gl.SliceLayout(1, cvt_layout))
        y = x.to(gl.float16) * r[:, None]
        if ZERO_PAST:
            y = gl.where((rows < n_vis)[:, None], y, 0.0)
        dst.slice(c * CR, CR).store(y)


@gluon.jit
def _page_scales(scale_head, stride_sc_t, page, n_vis, live, BN: gl.constexpr, PAGE: gl.constexpr,
                 layout: gl.constexpr):
    """A page's per-token scales, its visible slots (0 past them, and when not `live`)."""
    offs = gl.arange(0, BN, layout=layout)
    row = scale_head + page.to(gl.int64) * PAGE * stride_sc_t
    return gl.load(row + offs * stride_sc_t, mask=(offs < n_vis) & live, other=0.0)


@gluon.jit
def _top(scales):
    """The largest |scale| (1 when all are 0)."""
    top = gl.max(gl.abs(scales), 0)
    return gl.where(top > 0.0, top, 1.0)


@gluon.jit
def _converter(kv_desc, k8, v8, k16, v16, bars, plan_row, g, n_steps, tops_s, ratios_s, ks_head, vs_head, stride_ks_t,
               stride_vs_t, BN: gl.constexpr, D: gl.constexpr, NS: gl.constexpr, NC: gl.constexpr,
               CR: gl.constexpr, PLAN: gl.constexpr, PAGE: gl.constexpr):
    """Worker partition (4 warps): K/V pages by TMA into the fp8 ring (NS steps ahead), converted into
    the fp16 ring: K waits for the stage's KEMPTY, V for its VEMPTY (QK / PV of the step NC back retired by
    both MMA warpgroups), then READY is given to each warpgroup."""
    kbar, vbar = bars
    one_layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])  # an element a thread
    ones = gl.full([128], 1, gl.int32, one_layout)
    # 8 contiguous elements a thread (one 16-byte fp16 store), a warp's 8 column groups covering 64 of
    # the 128 columns: measured 1-4% faster than 16 a thread (results/h200/prefill-ws-bounds).
    cvt_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    top_layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    tops_layout: gl.constexpr = gl.BlockedLayout([2], [32], [4], [0])
    for i in gl.static_range(NS):
        page, blk, whole, tokens, n_vis = _step_words(plan_row, i, n_steps, PLAN, PAGE)
        _issue(kv_desc, k8, v8, kbar, vbar, g, page, i, n_steps, BN, D, NS)
    # A step's scales are loaded a step ahead: their maxima then wait on no global load.
    page, blk, whole, tokens, n_vis = _step_words(plan_row, 0, n_steps, PLAN, PAGE)
    ks_next = _page_scales(ks_head, stride_ks_t, page, n_vis, n_steps > 0, BN, PAGE, top_layout)
    vs_next = _page_scales(vs_head, stride_vs_t, page, n_vis, n_steps > 0, BN, PAGE, top_layout)
    for j in range(n_steps):
        page, blk, whole, tokens, n_vis = _step_words(plan_row, j, n_steps, PLAN, PAGE)
        page_n, blk_n, whole_n, tokens_n, n_vis_n = _step_words(plan_row, j + NS, n_steps, PLAN, PAGE)
        k_top = _top(ks_next)
        v_top = _top(vs_next)
        # this page's fp16 ratios, once, where every converter warp reads its rows' (the last step's reads
        # of them ended at its closing barrier)
        ratios_s.index(0).store((ks_next * (1.0 / k_top)).to(gl.float16))
        ratios_s.index(1).store((vs_next * (1.0 / v_top)).to(gl.float16))
        page_1, blk_1, whole_1, tokens_1, n_vis_1 = _step_words(plan_row, j + 1, n_steps, PLAN, PAGE)
        ks_next = _page_scales(ks_head, stride_ks_t, page_1, n_vis_1, j + 1 < n_steps, BN, PAGE, top_layout)
        vs_next = _page_scales(vs_head, stride_vs_t, page_1, n_vis_1, j + 1 < n_steps, BN, PAGE, top_layout)
        _cta_barrier()
        s = j % NS
        c = j % NC
        ph = (j // NS) & 1
        refill = ones * (j >= NC).to(gl.int32)  # stage c held step j - NC: wait until both warpgroups are done
        mbarrier.wait(kbar.index(s), ph)
        _named_barrier(ones * (KEMPTY_BAR + c), 384, True, refill)  # QK(j - NC) retired (and its tops read)
        tops_s.index(c).store(gl.where(gl.arange(0, 2, layout=tops_layout) == 0, k_top, v_top))
        _convert(k8.index(s), k16.index(c), n_vis, ratios_s.index(0), BN, CR, False, cvt_layout)
        mbarrier.wait(vbar.index(s), ph)
        _named_barrier(ones * (VEMPTY_BAR + c), 384, True, refill)  # PV(j - NC) retired
        if n_vis < BN:
            _convert(v8.index(s), v16.index(c), n_vis, ratios_s.index(1), BN, CR, True, cvt_layout)
        else:
            _convert(v8.index(s), v16.index(c), n_vis, ratios_s.index(1), BN, CR, False, cvt_layout)
        fence_async_shared()  # generic-proxy stores before the MMA warps' wgmma (async proxy) reads them
        _named_barrier(ones * (READY_BAR + 2 * c), 256, False, ones)
        _named_barrier(ones * (READY_BAR + 2 * c + 1), 256, False, ones)
        _cta_barrier()  # every thread's reads of this fp8 stage done before the TMA below overwrites it
        _issue(kv_desc, k8, v8, kbar, vbar, g, page_n, j + NS, n_steps, BN, D, NS)


# ----------------------------------------------------------------------------------------------------------
# consumer (default partition)
@gluon.jit
def _consumer(q_s, k16, v16, out_ptr, plan_row, n_steps, qk_scale, tops_s, kv_lo, seq_len, n_tok, out_tok0,
              head0, stride_o_t, stride_o_h,
              BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, NC: gl.constexpr, GQA: gl.constexpr,
              PLAN: gl.constexpr, PAGE: gl.constexpr, NUM_WARPS: gl.constexpr):
    """QK, masks, softmax, PV, output. Row r is token r // GQA of the tile, query head head0 + r % GQA;
    token t sees keys < min(kv_lo + t + 1, seq_len)."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                       instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                       instr_shape=[16, D, 16])
    tops_layout: gl.constexpr = gl.BlockedLayout([2], [32], [NUM_WARPS], [0])
    tops_idx = gl.arange(0, 2, layout=tops_layout)
    offs_m = gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
    offs_n = gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
    row_t = offs_m // GQA
    kv_end_row = gl.minimum(kv_lo + row_t + 1, seq_len)
    m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BM, D], gl.float32, o_layout)
    acc_unit = gl.to_tensor(1.0)  # acc is kept in units of the last page's largest |V scale|
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    p16 = gl.zeros([BM, BN], gl.float16, p_layout)  # P of the step before (none before step 0)
    # Ping-pong: a warpgroup issues its step's MMAs (PV of the step before, then QK) in its turn and hands
    # the turn over; its softmax then runs under the other warpgroup's MMAs. Warpgroup 0 goes first.
    one_layout: gl.constexpr = gl.BlockedLayout([1], [32], [NUM_WARPS], [0])  # an element a thread
    wg = gl.arange(0, NUM_WARPS * 32, layout=one_layout) // 128
    ones = gl.full([NUM_WARPS * 32], 1, gl.int32, one_layout)
    my_turn = TURN_BAR + wg
    next_turn = TURN_BAR + 1 - wg
    _named_barrier(ones * TURN_BAR, 256, False, ((wg == 1) & (n_steps > 0)).to(gl.int32))
    page_n, blk_n, whole_n, tokens_n, n_vis_n = _step_words(plan_row, 0, n_steps, PLAN, PAGE)
    for j in range(n_steps):
        page = page_n
        blk = blk_n
        whole = whole_n
        tokens = tokens_n
        n_vis = n_vis_n
        page_n, blk_n, whole_n, tokens_n, n_vis_n = _step_words(plan_row, j + 1, n_steps, PLAN, PAGE)
        c = j % NC
        c_prev = (j + NC - 1) % NC
        _named_barrier(READY_BAR + 2 * c + wg, 256, True, ones)  # K(j) and V(j) converted
        # the page's largest |K| and |V| scales, from the converter (read before KEMPTY is arrived)
        tops = tops_s.index(c).load(tops_layout)
        s_scale = qk_scale * gl.sum(gl.where(tops_idx == 0, tops, 0.0), 0)
        v_top = gl.sum(gl.where(tops_idx == 1, tops, 0.0), 0)
        _named_barrier(my_turn, 256, True, ones)
        if j > 0:
            pv = warpgroup_mma(p16, v16.index(c_prev), acc, is_async=True)  # PV(j-1)
        else:
            pv = warpgroup_mma_init(acc)
        qk = warpgroup_mma(q_s, k16.index(c).permute((1, 0)), gl.zeros([BM, BN], gl.float32, s_layout),
                           use_acc=False, is_async=True)
        _named_barrier(next_turn, 256, False, ones)
        qk, acc = warpgroup_mma_wait(0, deps=[qk, pv])  # retires PV(j-1) and QK(j)
        # stages the converter refills (the last NC steps' are not)
        _named_barrier(ones * (KEMPTY_BAR + c), 384, False, ones * (j + NC < n_steps).to(gl.int32))
        _named_barrier(ones * (VEMPTY_BAR + c_prev), 384, False, ones * ((j > 0) & (j + NC - 1 < n_steps)).to(gl.int32))
        if not whole:  # a row sees the keys of its token's steps, before its kv_end
            lim = gl.where(((tokens >> row_t) & 1) != 0, kv_end_row - blk * PAGE, 0)
            qk = gl.where(offs_n[None, :] < lim[:, None], qk, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(qk, 1) * s_scale)
        m_shift = gl.where(m_new == float("-inf"), 0.0, m_new)  # no visible key yet: exp2 gives 0, not NaN
        alpha = gl.exp2(m_i - m_shift)
        p = gl.exp2(qk * s_scale - m_shift[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        alpha = alpha * (acc_unit / v_top)
        acc_unit = v_top
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p16 = gl.convert_layout(p.to(gl.float16), p_layout)
        m_i = m_new
    if n_steps > 0:  # PV of the last step; warpgroup 1's hand-over after it would have no taker
        _named_barrier(my_turn, 256, True, ones)
        pv = warpgroup_mma(p16, v16.index((n_steps - 1) % NC), acc, is_async=True)
        _named_barrier(next_turn, 256, False, (wg == 0).to(gl.int32))
    else:
        pv = warpgroup_mma_init(acc)
    acc = warpgroup_mma_wait(0, deps=[pv])
    l_safe = gl.where(l_i > 0.0, l_i, 1.0)  # a row that saw no visible key comes out as zeros
    o = (acc * gl.convert_layout(acc_unit / l_safe, gl.SliceLayout(1, o_layout))[:, None])
    o = o.to(out_ptr.dtype.element_ty)
    # Stored from a blocked layout (16-byte stores along a row): a 16-bit tile goes through q's shared
    # buffer (free: every QK retired), the layout change of another width through the compiler's scratch.
    st_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NUM_WARPS, 1], [1, 0])
    if out_ptr.dtype.element_ty.primitive_bitwidth == 16:
        out_ty: gl.constexpr = out_ptr.dtype.element_ty
        q_s_layout: gl.constexpr = q_s.layout
        o_s = _reinterpret(q_s, out_ty, [BM, D], q_s_layout)
        o_s.store(o)
        _cta_barrier()
        o = o_s.load(st_layout)
    else:
        o = gl.convert_layout(o, st_layout)
    offs_om = gl.arange(0, BM, layout=gl.SliceLayout(1, st_layout))
    offs_od = gl.arange(0, D, layout=gl.SliceLayout(0, st_layout))
    tok = offs_om // GQA
    o_rows = (out_tok0 + tok).to(gl.int64) * stride_o_t + (head0 + offs_om % GQA).to(gl.int64) * stride_o_h
    gl.store(out_ptr + o_rows[:, None] + offs_od[None, :], o, mask=(tok < n_tok)[:, None])


# ----------------------------------------------------------------------------------------------------------
@gluon.jit
def _alloc_rings(BN: gl.constexpr, D: gl.constexpr, NS: gl.constexpr, NC: gl.constexpr):
    """The fp8 ring (NS TMA stages, kbar / vbar with expect-tx, count 1) and the fp16 ring (NC stages,
    signalled through named barriers). Returns (k8, v8, k16, v16, (kbar, vbar))."""
    f8_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D], gl.float8e4nv)
    f16_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D], gl.float16)
    k8 = gl.allocate_shared_memory(gl.float8e4nv, [NS, BN, D], f8_layout)
    v8 = gl.allocate_shared_memory(gl.float8e4nv, [NS, BN, D], f8_layout)
    k16 = gl.allocate_shared_memory(gl.float16, [NC, BN, D], f16_layout)
    v16 = gl.allocate_shared_memory(gl.float16, [NC, BN, D], f16_layout)
    kbar = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    vbar = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NS):
        mbarrier.init(kbar.index(i), count=1)
        mbarrier.init(vbar.index(i), count=1)
    return k8, v8, k16, v16, (kbar, vbar)


@gluon.jit
def _prefill_ws_kernel(
    # tensors
    q_ptr, kv_desc, plan_ptr, cu_seqlens_q_ptr, seq_lens_ptr, prefix_lens_ptr, out_ptr, k_scale_ptr, v_scale_ptr,
    # scalars
    sm_scale,
    # strides
    stride_q_t, stride_q_h, stride_o_t, stride_o_h,
    stride_ks_h, stride_ks_t, stride_vs_h, stride_vs_t,
    # shapes and launch parameters
    GQA: gl.constexpr, HEAD_DIM: gl.constexpr, PAGE: gl.constexpr, BLOCK_T: gl.constexpr, BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr, CONVERT_ROWS: gl.constexpr, PLAN: gl.constexpr, CONVERTER_REGS: gl.constexpr,
    NUM_WARPS: gl.constexpr, CONVERTER_WARPS: gl.constexpr, USE_PDL: gl.constexpr,
):
    if USE_PDL:  # the plan launch's words and offsets are complete after this
        _gdc_wait()
    BM: gl.constexpr = BLOCK_T * GQA
    gl.static_assert(BM == 128)
    gl.static_assert(BLOCK_N == PAGE)
    gl.static_assert(BLOCK_N % CONVERT_ROWS == 0)
    tile = gl.num_programs(0) - 1 - gl.program_id(0)  # last tiles first: they see the most pages
    req = gl.program_id(1)
    g = gl.program_id(2)
    prog = tile + gl.num_programs(0) * (req + gl.num_programs(1) * g)
    plan_row = plan_ptr + prog.to(gl.int64) * (2 * PLAN)
    programs = gl.num_programs(0) * gl.num_programs(1) * gl.num_programs(2)
    n_steps = gl.load(plan_ptr + programs.to(gl.int64) * (2 * PLAN) + prog).to(gl.int32)
    q_start = gl.load(cu_seqlens_q_ptr + req)
    q_len = gl.load(cu_seqlens_q_ptr + req + 1) - q_start
    i0 = tile * BLOCK_T
    if i0 >= q_len:  # past its request's end (the grid covers max_query_len; 'auto' empties whole launches)
        return
    n_tok = gl.minimum(q_len - i0, BLOCK_T)
    kv_lo = gl.load(prefix_lens_ptr + req) + i0
    seq_len = gl.load(seq_lens_ptr + req)

    # q -> fp16 once, into fp16's range: divided by max(|q|max / 2^15, 1) over the tile, the score scale
    # takes it back.
    q_ld_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [NUM_WARPS, 1], [1, 0])
    offs_qm = gl.arange(0, BM, layout=gl.SliceLayout(1, q_ld_layout))
    offs_qd = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, q_ld_layout))
    tok = offs_qm // GQA
    q_rows = (q_start + i0 + tok).to(gl.int64) * stride_q_t + (g * GQA + offs_qm % GQA).to(gl.int64) * stride_q_h
    q = gl.load(q_ptr + q_rows[:, None] + offs_qd[None, :], mask=(tok < n_tok)[:, None],
                other=0.0)
    qf = q.to(gl.float32)
    q_div = gl.maximum(gl.max(gl.max(gl.abs(qf), 1), 0) / 32768.0, 1.0)
    qk_scale = sm_scale * 1.4426950408889634  # per-token scales: the converter's, page by page
    q_mul = gl.where(qk_scale < 0.0, -1.0, 1.0) / q_div
    qk_scale = gl.abs(qk_scale) * q_div
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, HEAD_DIM], gl.float16)
    q_s = gl.allocate_shared_memory(gl.float16, [BM, HEAD_DIM], q_layout, (qf * q_mul).to(gl.float16))
    k8, v8, k16, v16, bars = _alloc_rings(BLOCK_N, HEAD_DIM, STAGES, STAGES)
    # each fp16 stage's largest |K| and |V| scales, converter -> consumer
    tops_s = gl.allocate_shared_memory(gl.float32, [STAGES, 2], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    ratios_s = gl.allocate_shared_memory(gl.float16, [2, BLOCK_N], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    fence_async_shared()  # barrier inits and q visible to the TMA unit / wgmma
    _cta_barrier()
    ks_head = k_scale_ptr + g.to(gl.int64) * stride_ks_h
    vs_head = v_scale_ptr + g.to(gl.int64) * stride_vs_h
    gl.warp_specialize([
        (_consumer, (q_s, k16, v16, out_ptr, plan_row, n_steps, qk_scale, tops_s, kv_lo, seq_len,
                     n_tok, q_start + i0, g * GQA, stride_o_t, stride_o_h, BM, BLOCK_N, HEAD_DIM, STAGES, GQA, PLAN,
                     PAGE, NUM_WARPS)),
        (_converter, (kv_desc, k8, v8, k16, v16, bars, plan_row, g, n_steps, tops_s, ratios_s, ks_head, vs_head, stride_ks_t, stride_vs_t,
                      BLOCK_N, HEAD_DIM, STAGES, STAGES, CONVERT_ROWS, PLAN, PAGE)),
    ], [CONVERTER_WARPS], [CONVERTER_REGS])


KERNEL = _prefill_ws_kernel
PLAN_KERNEL = _tile_plan_kernel


def block_t_for(num_q_heads, num_kv_heads):
    """Tokens a program holds: ROWS // GQA."""
    return ROWS // (num_q_heads // num_kv_heads)


def unsupported(*, q, kv_cache, num_kv_heads, output, config):
    """Why these arguments cannot run this kernel with `config` (None when they can): the shapes it is
    written for, and a cache a TMA descriptor can read."""
    gqa = q.shape[1] // num_kv_heads
    if gqa not in (8, 16):
        return f"GQA 8 or 16 (query heads per KV head), got {gqa}"
    if q.shape[2] != HEAD_DIM:
        return f"head_dim {HEAD_DIM}, got {q.shape[2]}"
    if q.stride(2) != 1 or output.stride(2) != 1:
        return f"q and output with a unit last stride, got {q.stride(2)} and {output.stride(2)}"
    if kv_cache.dtype != torch.float8_e4m3fn:
        return f"an fp8 e4m3fn cache, got {str(kv_cache.dtype).removeprefix('torch.')}"
    if config.block_t != ROWS // gqa:
        return f"config.block_t {ROWS // gqa} (= {ROWS} rows // GQA {gqa}), got {config.block_t}"
    if not kv_tma_ok(kv_cache, HEAD_DIM):
        return "a cache a TMA descriptor can read (unit last stride, 16-byte-aligned base and strides)"
    return None


def kv_rows_aligned(kv_cache):
    """Whether Triton's JIT specializes the cache's loads as 16-byte aligned: a unit last stride, and
    the base address and the other strides (in elements) multiples of 16, its divisibility hints.
    Plain loads then give a thread 16 neighbouring bytes of one key (fp8); else one, the next of its
    values belonging to another key (a [pages, Hkv, 128, 2D + 8] buffer's [..., :2D] view, say)."""
    return (kv_cache.stride(3) == 1 and kv_cache.data_ptr() % 16 == 0
            and all(stride % 16 == 0 for stride in kv_cache.stride()[:3]))


def kv_tma_ok(kv_cache, head_dim):
    """Whether the cache can be read through a TMA descriptor: unit stride on the last axis,
    16-byte-aligned base and strides, a row of at least 16 bytes (else plain loads)."""
    size = kv_cache.element_size()
    return (kv_cache.stride(3) == 1 and kv_cache.data_ptr() % 16 == 0
            and all(stride * size % 16 == 0 for stride in kv_cache.stride()[:3]) and head_dim * size >= 16)


def kv_descriptor(kv_cache):
    """The 4-D TMA descriptor over the cache (all four strides honoured), box [1, 1, 128, HEAD_DIM]: one
    K or V page of one KV head."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    layout = gl.NVMMASharedLayout.get_default_for([1, 1, BLOCK_N, HEAD_DIM], gl.float8e4nv)
    return TensorDescriptor(kv_cache, list(kv_cache.shape), list(kv_cache.stride()), [1, 1, BLOCK_N, HEAD_DIM],
                            layout)


def constexprs(*, num_q_heads, num_kv_heads, head_dim, topk, config, use_pdl=False, **_):
    """The Gluon kernel's compile-time parameters for a shape and config (shared with the static checks)."""
    gqa = num_q_heads // num_kv_heads
    return dict(GQA=gqa, HEAD_DIM=head_dim, PAGE=PAGE, BLOCK_T=config.block_t, BLOCK_N=BLOCK_N, STAGES=STAGES,
                CONVERT_ROWS=config.convert_rows, PLAN=plan_constexprs(topk=topk, config=config)["PLAN"],
                CONVERTER_REGS=CONVERTER_REGS, NUM_WARPS=CONSUMER_WARPS, CONVERTER_WARPS=CONVERTER_WARPS,
                USE_PDL=use_pdl)


def plan_constexprs(*, topk, config, use_pdl=False, **_):
    return dict(PAGE=PAGE, TOPK_P2=triton.next_power_of_2(topk), BLOCK_T=config.block_t,
                PLAN=config.block_t * triton.next_power_of_2(topk), USE_PDL=use_pdl)


def options(config):
    """Compiler/launch options of the Gluon kernel (the consumer's warps; the converter's come on top)."""
    return dict(num_warps=CONSUMER_WARPS)


def launch(q, kv_cache, topk_idx, block_table, cu_seqlens_q, seq_lens, prefix_lens,
           max_query_len, num_kv_heads, sm_scale, output, k_scale, v_scale, config, use_pdl=False, record=None,
           decide=None):
    """The plan launch, then the tile's, on validated arguments (codegen.api checks them, `unsupported`
    included); use_pdl: both under programmatic dependent launch (each waits for the launch before it).
    `record`: a list that receives the launches as (kernel, grid, args, kwargs) instead of
    running them (codegen.plan binds them). `decide`: selection 'auto' decided by the plan launch (a
    codegen.selection_kernel.PlanDecision: the tiles run on its tiled_cu, the per-token launch takes
    its per_token_cu)."""
    num_reqs = seq_lens.shape[0]
    topk = topk_idx.shape[2]
    if max_query_len == 0 or num_reqs == 0:
        if decide is not None:  # nothing to plan: the tiles' 'auto' verdict, as tile_inflation's 1.0
            decide.tiled_cu.copy_(cu_seqlens_q)
            decide.per_token_cu.zero_()
            decide.inflation.fill_(1.0)
        return output
    grid = (triton.cdiv(max_query_len, config.block_t), num_reqs, num_kv_heads)
    plan_consts = plan_constexprs(topk=topk, config=config, use_pdl=use_pdl)
    programs = grid[0] * grid[1] * grid[2]
    plan = torch.empty(programs * (2 * plan_consts["PLAN"] + 1), dtype=torch.int64, device=q.device)
    if decide is None:
        outputs, tiled_cu = (plan, plan, plan, plan, 0.0), cu_seqlens_q  # not read (DECIDE off)
    else:
        outputs, tiled_cu = (decide.counters, decide.tiled_cu, decide.per_token_cu, decide.inflation,
                             float(decide.threshold)), decide.tiled_cu
    plan_args = (topk_idx, block_table, cu_seqlens_q, seq_lens, prefix_lens, plan, topk, *topk_idx.stride(),
                 *block_table.stride(), *outputs)
    args = (
        q, kv_descriptor(kv_cache), plan, tiled_cu, seq_lens, prefix_lens, output, k_scale, v_scale,
        float(sm_scale), q.stride(0), q.stride(1), output.stride(0), output.stride(1),
        *k_scale.stride(), *v_scale.stride(),
    )
    kwargs = dict(**constexprs(num_q_heads=q.shape[1], num_kv_heads=num_kv_heads, head_dim=q.shape[2], topk=topk,
                               config=config, use_pdl=use_pdl), **options(config), launch_pdl=use_pdl)
    launches = [(_tile_plan_kernel, grid, plan_args, dict(**plan_consts, DECIDE=decide is not None, CU_BLOCK=256,
                                                          num_warps=PLAN_WARPS, launch_pdl=use_pdl)),
                (_prefill_ws_kernel, grid, args, kwargs)]
    for kernel, kernel_grid, kernel_args, kernel_kwargs in launches:
        if record is not None:
            record.append((kernel, kernel_grid, kernel_args, kernel_kwargs))
        else:
            kernel[kernel_grid](*kernel_args, **kernel_kwargs)
    return output

INPUTS_SHA256 = '6b08bf5ad7e46219f07cf7e9daf8b0dd0af6527a112c97ada0fa7c5646ab145c'
