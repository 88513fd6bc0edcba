# GENERATED FILE - DO NOT EDIT. Regenerate with `python -m codegen render`.
# template: templates/prefill.py.jinja (with templates/_attend.jinja, templates/_tile_plan.jinja)
# variant: sm90_prefill_scalar_unfolded (arch=sm90, kernel=prefill, scale_mode=scalar, unfolded baseline)
# inputs-sha256: fa8606ce5a0cab2fecb418256c5e3ee21aa0c82e5253baa91ab881ee42076a93
"""MSA sparse-attention prefill, sm90, KV scale mode `scalar`.

One program = BLOCK_T consecutive query tokens of one request x one KV head; the rows of the tile
are (token, GQA head) pairs. With BLOCK_T == 1 the program walks the token's top-k pages BLOCK_N
keys at a time. With BLOCK_T > 1 it walks the union of the tile's selections: each distinct page
is loaded once and scored against every row, rows whose token did not pick it (or may not see a
key) masked out, so neighbouring tokens that share blocks share the loads and fill the MMA rows.
Either way a token reads only the first min(topk, causal blocks) entries of its own top-k row.
The slice step (templates/_attend.jinja) is inlined in both walks, so a generated module may pass
400 lines.
"""
import torch
import triton
import triton.language as tl

ARCH = "sm90"
SCALE_MODE = "scalar"
PAGE = 128


@triton.jit
def _msa_prefill_kernel(
    # tensors
    q_ptr, kv_ptr, kv_desc, topk_ptr, block_table_ptr, cu_seqlens_q_ptr, seq_lens_ptr, prefix_lens_ptr,
    out_ptr, plan_ptr,
    k_scale_ptr, v_scale_ptr,  # one fp32 element each, read on the device (graph-capturable)
    # scalars
    sm_scale, topk,
    # strides
    stride_q_t, stride_q_h, stride_q_d,
    stride_kv_b, stride_kv_h, stride_kv_t, stride_kv_d,
    stride_tk_h, stride_tk_t, stride_tk_k,
    stride_bt_r, stride_bt_b,
    stride_o_t, stride_o_h, stride_o_d,
    # shapes and launch parameters
    GQA: tl.constexpr, GQA_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
    TOPK_P2: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    KV_UPCAST: tl.constexpr, KV_TMA: tl.constexpr, PLAN: tl.constexpr, V_CVT_ASM: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    SUBTILES: tl.constexpr = PAGE // BLOCK_N
    if USE_PDL:
        # Launched under PDL: the offsets may come from `auto`'s decision (or plan) launch just before.
        # No early trigger: the next launch's programs would wait beside this one's and slow it (auto
        # on short calls whose tiles won: +12-20 us with the trigger at the start, H200); each program
        # lets it go as it exits.
        tl.extra.cuda.gdc_wait()
    i0 = tl.program_id(0) * BLOCK_T  # first query of the tile inside its request
    req = tl.program_id(1)
    g = tl.program_id(2)  # KV head
    q_start = tl.load(cu_seqlens_q_ptr + req)
    q_len = tl.load(cu_seqlens_q_ptr + req + 1) - q_start
    if i0 >= q_len:  # the grid covers max_query_len; shorter requests end here
        return
    prefix = tl.load(prefix_lens_ptr + req)
    seq_len = tl.load(seq_lens_ptr + req)
    block_table_row_ptr = block_table_ptr + req.to(tl.int64) * stride_bt_r
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    row_t = offs_m // GQA_PAD  # token of the row inside the tile
    heads = g * GQA + offs_m % GQA_PAD
    row_ok = (offs_m % GQA_PAD < GQA) & (row_t < BLOCK_T) & (i0 + row_t < q_len)
    row_tok = (q_start + i0 + row_t).to(tl.int64)
    q = tl.load(
        q_ptr + row_tok[:, None] * stride_q_t + heads[:, None] * stride_q_h + offs_d[None, :] * stride_q_d,
        mask=row_ok[:, None],
        other=0.0,
    )
    # Unfolded (the seed's baseline, kept for benchmarks): every K and V element is scaled in the loop.
    k_scale = tl.load(k_scale_ptr)
    v_scale = tl.load(v_scale_ptr)
    qk_scale = sm_scale * 1.4426950408889634
    if KV_UPCAST == 2:
        # fp16 MMAs (fp8 cache; products and sums are fp32 inside the MMA): a query beyond 2^15
        # is divided into fp16's range and the score scale takes the divisor back; 1.0 otherwise.
        q_amax = tl.max(tl.max(tl.abs(q.to(tl.float32)), axis=1), axis=0)
        q_div = tl.maximum(q_amax / 32768.0, 1.0)
        q = (q.to(tl.float32) / q_div).to(tl.float16)
        qk_scale = qk_scale * q_div
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    kv_head_ptr = kv_ptr + g * stride_kv_h
    if BLOCK_T == 1:
        t = (q_start + i0).to(tl.int64)
        kv_end = tl.minimum(prefix + i0 + 1, seq_len)  # causal and in-sequence
        topk_row_ptr = topk_ptr + g * stride_tk_h + t * stride_tk_t
        n_causal = tl.cdiv(tl.maximum(kv_end, 0), PAGE)
        n_read = tl.minimum(topk, n_causal)
        offs_k = tl.arange(0, TOPK_P2)
        mine = (offs_k >= 0) & (offs_k < n_read)
        ids = tl.load(topk_row_ptr + offs_k * stride_tk_k, mask=mine, other=-1)
        # Block numbers are compared, never positions: id * PAGE wraps int32 for ids near 2**31.
        # An id outside the causal blocks reads block-table entry 0 under a false mask: nothing.
        live_k = mine & (ids >= 0) & (ids < n_causal)
        ids = tl.where(live_k, ids, 0)
        pages_k = tl.load(block_table_row_ptr + ids * stride_bt_b, mask=live_k, other=0)
        n_visible_k = tl.where(live_k, kv_end - ids.to(tl.int64) * PAGE, 0)
        for it in range(0 * SUBTILES, n_read * SUBTILES):
            entry = offs_k == it // SUBTILES
            page = tl.sum(tl.where(entry, pages_k, 0), axis=0)
            n_visible = tl.sum(tl.where(entry, n_visible_k, 0), axis=0)
            sub = (it % SUBTILES) * BLOCK_N  # first slot of this slice inside the page
            visible = sub + offs_n < n_visible
            if KV_TMA:
                k = kv_desc.load([page.to(tl.int32), g, sub.to(tl.int32), 0]).reshape(BLOCK_N, HEAD_DIM)
            else:
                k = tl.load(
                    kv_head_ptr + page.to(tl.int64) * stride_kv_b + (sub + offs_n)[:, None] * stride_kv_t
                    + (0 + offs_d[None, :]) * stride_kv_d, mask=visible[:, None], other=0.0)
            k = (k.to(tl.float32) * k_scale).to(q.dtype)  # unfolded baseline: every K element scaled
            if KV_UPCAST == 1:
                k = k.to(tl.float32)  # fp8 -> fp32 -> MMA dtype: other instructions than fp8 -> bf16
            s = tl.dot(q, tl.trans(k.to(q.dtype)))
            if sub + BLOCK_N > n_visible:
                s = tl.where(visible[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
            # A row that has seen no visible key yet keeps m == -inf; shift by 0 so exp2 gives 0, not NaN.
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_shift)
            p = tl.exp2(s * qk_scale - m_shift[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if KV_TMA:
                v = kv_desc.load([page.to(tl.int32), g, sub.to(tl.int32), HEAD_DIM]).reshape(BLOCK_N, HEAD_DIM)
            else:
                v = tl.load(
                    kv_head_ptr + page.to(tl.int64) * stride_kv_b + (sub + offs_n)[:, None] * stride_kv_t
                    + (HEAD_DIM + offs_d[None, :]) * stride_kv_d, mask=visible[:, None], other=0.0)
            if V_CVT_ASM:
                # Converted where it was loaded, so the transpose moves fp16; the slots no row sees are
                # zeroed by the same asm (one AND a 4 keys' word), for a TMA box's sake (below).
                v = _e4m3_to_fp16_keep(v, visible)
            v = (v.to(tl.float32) * v_scale).to(q.dtype)
            if KV_UPCAST == 1:
                v = v.to(tl.float32)
            v = v.to(q.dtype)
            if KV_TMA and not V_CVT_ASM:
                # A TMA box also reads slots no row sees, which may hold anything, NaN included:
                # p = 0 there, but 0 * NaN would reach the accumulator.
                if sub + BLOCK_N > n_visible:
                    v = tl.where(visible[:, None], v, 0.0)
            pv = tl.dot(p.to(q.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
    else:
        kv_end_row = tl.minimum(prefix + i0 + row_t + 1, seq_len)  # [BLOCK_M]
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
        tl.debug_barrier()  # the plan's words are written by every thread and read by all
        for it in range(0, n_plan * SUBTILES):
            step = it // SUBTILES
            key = tl.load(plan_row_ptr + step)
            page = (key >> 32).to(tl.int32)
            blk = ((key >> 1) & 0x7FFFFFFF).to(tl.int32)
            partial = (key & 1) == 0
            tokens = (1 << BLOCK_T) - 1
            n_visible = PAGE
            if partial:
                aux = tl.load(plan_row_ptr + PLAN + step).to(tl.int32)
                tokens = aux >> 8
                n_visible = aux & 0xFF
            sub = (it % SUBTILES) * BLOCK_N  # first slot of the slice
            slot = sub + offs_n
            cols = slot < n_visible
            if KV_TMA:
                k = kv_desc.load([page.to(tl.int32), g, sub.to(tl.int32), 0]).reshape(BLOCK_N, HEAD_DIM)
            else:
                k = tl.load(
                    kv_head_ptr + page.to(tl.int64) * stride_kv_b + (sub + offs_n)[:, None] * stride_kv_t
                    + (0 + offs_d[None, :]) * stride_kv_d, mask=cols[:, None], other=0.0)
            k = (k.to(tl.float32) * k_scale).to(q.dtype)  # unfolded baseline: every K element scaled
            if KV_UPCAST == 1:
                k = k.to(tl.float32)  # fp8 -> fp32 -> MMA dtype: other instructions than fp8 -> bf16
            s = tl.dot(q, tl.trans(k.to(q.dtype)))
            if partial:
                s = tl.where(((tokens >> row_t) & 1 != 0)[:, None] & (slot[None, :] < kv_end_row[:, None] - blk * PAGE), s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
            # A row that has seen no visible key yet keeps m == -inf; shift by 0 so exp2 gives 0, not NaN.
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_shift)
            p = tl.exp2(s * qk_scale - m_shift[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if KV_TMA:
                v = kv_desc.load([page.to(tl.int32), g, sub.to(tl.int32), HEAD_DIM]).reshape(BLOCK_N, HEAD_DIM)
            else:
                v = tl.load(
                    kv_head_ptr + page.to(tl.int64) * stride_kv_b + (sub + offs_n)[:, None] * stride_kv_t
                    + (HEAD_DIM + offs_d[None, :]) * stride_kv_d, mask=cols[:, None], other=0.0)
            if V_CVT_ASM:
                # Converted where it was loaded, so the transpose moves fp16; the slots no row sees are
                # zeroed by the same asm (one AND a 4 keys' word), for a TMA box's sake (below).
                v = _e4m3_to_fp16_keep(v, cols)
            v = (v.to(tl.float32) * v_scale).to(q.dtype)
            if KV_UPCAST == 1:
                v = v.to(tl.float32)
            v = v.to(q.dtype)
            if KV_TMA and not V_CVT_ASM:
                # A TMA box also reads slots no row sees, which may hold anything, NaN included:
                # p = 0 there, but 0 * NaN would reach the accumulator.
                if partial:
                    v = tl.where(cols[:, None], v, 0.0)
            pv = tl.dot(p.to(q.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc / l_safe[:, None]

    tl.store(
        out_ptr + row_tok[:, None] * stride_o_t + heads[:, None] * stride_o_h + offs_d[None, :] * stride_o_d,
        o.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )

KERNEL = _msa_prefill_kernel


# The interpreter runs no PTX: it takes the exact `.to()` conversion instead.
_INTERPRETED = tl.constexpr(triton.knobs.runtime.interpret)


@triton.jit
def _e4m3_to_fp16(x):
    """fp8 e4m3 -> fp16 (exact), two values per cvt. Not `.to()`: Triton would move the PV MMA's
    operand layout above a `.to()` and read the fp8 V tile from shared memory one byte at a time
    (its transpose has no 8-bit ldmatrix). An asm block with side effects stays where it is: V is
    converted in its load layout, and the transpose moves fp16 through ldmatrix."""
    if _INTERPRETED:
        return x.to(tl.float16)
    return tl.inline_asm_elementwise(
        asm="{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
        constraints="=r,=r,r", args=[x.to(tl.uint8, bitcast=True)], dtype=tl.float16, is_pure=False, pack=4)


@triton.jit
def _e4m3_to_fp16_keep(x, keep):
    """_e4m3_to_fp16 of a [keys, dims] tile, with the keys where `keep` [keys] is false set to 0: the
    fp8 word is ANDed with the key's mask first, one instruction for four values instead of a select
    per value. The four values of a word are neighbours along dims in the load layout (Triton keeps
    the contiguous axis in a thread; tests/gpu's NaN-past-the-end test fails if that ever changes)."""
    if _INTERPRETED:
        return tl.where(keep[:, None], x.to(tl.float16), 0.0)
    mask = tl.broadcast_to(tl.where(keep, -1, 0)[:, None], x.shape)
    return tl.inline_asm_elementwise(
        asm="{ .reg .b32 w; .reg .b16 lo, hi; and.b32 w, $2, $3; mov.b32 {lo, hi}, w; "
            "cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
        constraints="=r,=r,r,r,r,r,r", args=[x.to(tl.uint8, bitcast=True), mask], dtype=tl.float16, is_pure=False,
        pack=4)


@triton.jit
def _e4m3_to_fp16_scaled(x, keep, scale):
    """_e4m3_to_fp16_keep with each key's values also multiplied by its fp16 `scale` [keys], as
    f16x2 pairs (one rounding: the conversion itself is exact)."""
    if _INTERPRETED:
        return tl.where(keep[:, None], x.to(tl.float16) * scale[:, None], 0.0)
    mask = tl.broadcast_to(tl.where(keep, -1, 0)[:, None], x.shape)
    bits = scale.to(tl.uint16, bitcast=True).to(tl.uint32)
    pair = tl.broadcast_to((bits | (bits << 16)).to(tl.int32, bitcast=True)[:, None], x.shape)
    return tl.inline_asm_elementwise(
        asm="{ .reg .b32 w; .reg .b16 lo, hi; and.b32 w, $2, $3; mov.b32 {lo, hi}, w; "
            "cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; mul.rn.f16x2 $0, $0, $7; mul.rn.f16x2 $1, $1, $7; }",
        constraints="=r,=r,r,r,r,r,r,r,r,r,r", args=[x.to(tl.uint8, bitcast=True), mask, pair], dtype=tl.float16,
        is_pure=False, pack=4)



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


def reads_through_tma(kv_cache, head_dim, config):
    """Whether a launch reads K/V through TMA: the config asks for it (kv_tma 1, else plain
    loads) and the cache allows it (kv_tma_ok)."""
    return config.kv_tma == 1 and kv_tma_ok(kv_cache, head_dim)


def kv_descriptor(kv_cache, head_dim, block_n):
    """The TMA descriptor over the 4-D cache (all four strides honoured) whose box is one
    BLOCK_N x HEAD_DIM slice of a (page, KV head)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(kv_cache, list(kv_cache.shape), list(kv_cache.stride()), [1, 1, block_n, head_dim])


def constexprs(*, num_q_heads, num_kv_heads, head_dim, topk, config, kv_tma=False, kv_rows_aligned=True,
               use_pdl=False, **_):
    """The kernel's compile-time parameters for a shape and config (shared with the static checks).
    kv_rows_aligned: the cache's (the function of that name); the V conversions of kv_upcast 3 take
    an operand per key and need its load layout."""
    gqa = num_q_heads // num_kv_heads
    gqa_pad = triton.next_power_of_2(gqa)
    return dict(GQA=gqa, GQA_PAD=gqa_pad, HEAD_DIM=head_dim, PAGE=PAGE, TOPK_P2=triton.next_power_of_2(topk),
                BLOCK_T=config.block_t, BLOCK_M=max(16, config.block_t * gqa_pad), BLOCK_N=config.block_n,
                KV_UPCAST=2 if config.kv_upcast == 3 else config.kv_upcast,
                V_CVT_ASM=config.kv_upcast == 3 and kv_rows_aligned,
                KV_TMA=kv_tma, PLAN=config.block_t * triton.next_power_of_2(topk),
                USE_PDL=use_pdl)


def options(config):
    """Compiler/launch options of `config` on sm90."""
    return dict(num_warps=config.num_warps, num_stages=config.num_stages)


def launch(q, kv_cache, topk_idx, block_table, cu_seqlens_q, seq_lens, prefix_lens,
           max_query_len, num_kv_heads, sm_scale, output, k_scale, v_scale, config, use_pdl=False, record=None):
    """Launches on validated arguments (codegen.api checks them). use_pdl: launch under programmatic
    dependent launch (Hopper; the kernel waits for the launch before it). `record`: a list that receives
    the launch as (kernel, grid, args, kwargs) instead of running it (codegen.plan binds it)."""
    num_reqs = seq_lens.shape[0]
    topk = topk_idx.shape[2]
    if max_query_len == 0 or num_reqs == 0:
        return output
    grid = (triton.cdiv(max_query_len, config.block_t), num_reqs, num_kv_heads)
    kv_tma = reads_through_tma(kv_cache, q.shape[2], config)
    consts = constexprs(num_q_heads=q.shape[1], num_kv_heads=num_kv_heads, head_dim=q.shape[2], topk=topk,
                        config=config, kv_tma=kv_tma, kv_rows_aligned=kv_rows_aligned(kv_cache), use_pdl=use_pdl)
    # The tile plans' scratch, [programs, 2, PLAN] (the per-token walk has none: the output stands in, never read).
    plan = (torch.empty(grid[0] * grid[1] * grid[2] * 2 * consts["PLAN"], dtype=torch.int64, device=q.device)
            if config.block_t > 1 else output)
    args = (
        q, kv_cache, kv_descriptor(kv_cache, q.shape[2], config.block_n) if kv_tma else kv_cache, topk_idx, block_table, cu_seqlens_q, seq_lens, prefix_lens,
        output, plan,
        k_scale, v_scale,
        float(sm_scale), topk,
        *q.stride(), *kv_cache.stride(), *topk_idx.stride(), *block_table.stride(), *output.stride(),
    )
    kwargs = dict(**consts, **options(config), launch_pdl=use_pdl)
    if record is not None:
        record.append((_msa_prefill_kernel, grid, args, kwargs))
    else:
        _msa_prefill_kernel[grid](*args, **kwargs)
    return output

INPUTS_SHA256 = 'fa8606ce5a0cab2fecb418256c5e3ee21aa0c82e5253baa91ab881ee42076a93'
