# GENERATED FILE - DO NOT EDIT. Regenerate with `python -m codegen render`.
# template: templates/decode_split.py.jinja (with templates/_attend.jinja, templates/_merge.jinja)
# variant: gfx942_decode_split_scalar (arch=gfx942, kernel=decode_split, scale_mode=scalar)
# inputs-sha256: 2d44af992d439d5c0773f054119ab2dce3ab8710ac515ab08a39aa117b41e138
"""MSA sparse-attention decode, split-K part, gfx942, KV scale mode `scalar`.

One program = one query token x one KV head x one split of its top-k pages. With one split the
program writes the final output itself (one launch); with more it writes each split's normalized
partial (fp16 where partial_dtype allows it: fp8 cache, folded scalar scales, 16-bit output; else
fp32) and its base-2 log-sum-exp, which the merge kernel reduces (a second launch) or, with
FUSED_MERGE, the last split program of the (token, KV head) to finish: it counts arrivals on an
int32 counter and resets it after merging, so the counters are zero again for the next call.
Grid and buffers depend only on shapes and the config, so the launch can be captured in a CUDA graph.
A rendering may pass 400 lines (per_token_head: its column scales are loaded at either of v_early's
two places): it is written by `python -m codegen render` from the templates, never edited.
"""
import torch
import triton
import triton.language as tl

ARCH = "gfx942"
SCALE_MODE = "scalar"
PAGE = 128


@triton.jit
def _msa_decode_split_kernel(
    # tensors
    q_ptr, kv_ptr, kv_desc, topk_ptr, block_table_ptr, seq_lens_ptr, query_start_loc_ptr, token_to_req_ptr,
    out_ptr, part_o_ptr, part_lse_ptr, counter_ptr,
    k_scale_ptr, v_scale_ptr,  # one fp32 element each, read on the device (graph-capturable)
    # scalars
    sm_scale, topk, num_reqs, decode_query_len, blocks_per_split,
    # strides
    stride_q_t, stride_q_h, stride_q_d,
    stride_kv_b, stride_kv_h, stride_kv_t, stride_kv_d,
    stride_tk_h, stride_tk_t, stride_tk_k,
    stride_bt_r, stride_bt_b,
    stride_o_t, stride_o_h, stride_o_d,
    # shapes and launch parameters
    GQA: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, TOPK_P2: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr, MERGE_CHUNK: tl.constexpr,
    FUSED_MERGE: tl.constexpr, KV_UPCAST: tl.constexpr, VARLEN: tl.constexpr, USE_PDL: tl.constexpr,
    KV_TMA: tl.constexpr, MASK_ALL_SLICES: tl.constexpr,
    V_EARLY: tl.constexpr,
):
    SUBTILES: tl.constexpr = PAGE // BLOCK_N
    t = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    split = tl.program_id(2)
    if VARLEN:
        row_live = t < tl.load(query_start_loc_ptr + num_reqs)  # rows past the end are padding
        req = tl.load(token_to_req_ptr + t, mask=row_live, other=0)
        q_first = tl.load(query_start_loc_ptr + req, mask=row_live, other=0)
        q_len = tl.load(query_start_loc_ptr + req + 1, mask=row_live, other=0) - q_first
        j = t - q_first
    else:
        row_live = t < num_reqs * decode_query_len
        req = t // decode_query_len
        q_len = decode_query_len
        j = t % decode_query_len
    seq_len = tl.load(seq_lens_ptr + req, mask=row_live, other=0)
    q_pos = seq_len - q_len + j
    kv_end = tl.where(row_live, tl.minimum(q_pos + 1, seq_len), 0)
    block_table_row_ptr = block_table_ptr + req.to(tl.int64) * stride_bt_r
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    heads = g * GQA + offs_m  # the rows are the token's GQA heads, padded to BLOCK_M
    row_ok = offs_m < GQA
    row_tok = tl.full([BLOCK_M], 0, tl.int64) + t
    q = tl.load(
        q_ptr + row_tok[:, None] * stride_q_t + heads[:, None] * stride_q_h + offs_d[None, :] * stride_q_d,
        mask=row_ok[:, None],
        other=0.0,
    )
    # Folded K scale: K is only upcast in the loop, its scale rides on the score scale.
    qk_scale = sm_scale * 1.4426950408889634 * tl.load(k_scale_ptr)
    if KV_UPCAST == 2:
        # fp16 MMAs (fp8 cache; products and sums are fp32 inside the MMA): a query beyond 2^15
        # is divided into fp16's range and the score scale takes the divisor back; 1.0 otherwise.
        q_amax = tl.max(tl.max(tl.abs(q.to(tl.float32)), axis=1), axis=0)
        q_div = tl.maximum(q_amax / 32768.0, 1.0)
        q = (q.to(tl.float32) / q_div).to(tl.float16)
        qk_scale = qk_scale * q_div
    if qk_scale < 0.0:
        # The loop takes row maxima of unscaled scores, which needs a scale >= 0: a negative
        # k_scale flips the query instead (same products, exactly).
        q = -q
        qk_scale = -qk_scale
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    kv_head_ptr = kv_ptr + g * stride_kv_h
    topk_row_ptr = topk_ptr + g * stride_tk_h + t * stride_tk_t
    n_causal = tl.cdiv(tl.maximum(kv_end, 0), PAGE)
    n_read = tl.minimum(topk, n_causal)
    blk_lo = tl.minimum(split * blocks_per_split, n_read)
    blk_hi = tl.minimum(blk_lo + blocks_per_split, n_read)
    offs_k = tl.arange(0, TOPK_P2)
    mine = (offs_k >= blk_lo) & (offs_k < blk_hi)
    ids = tl.load(topk_row_ptr + offs_k * stride_tk_k, mask=mine, other=-1)
    # Block numbers are compared, never positions: id * PAGE wraps int32 for ids near 2**31.
    # An id outside the causal blocks reads block-table entry 0 under a false mask: nothing.
    live_k = mine & (ids >= 0) & (ids < n_causal)
    ids = tl.where(live_k, ids, 0)
    pages_k = tl.load(block_table_row_ptr + ids * stride_bt_b, mask=live_k, other=0)
    n_visible_k = tl.where(live_k, kv_end - ids.to(tl.int64) * PAGE, 0)
    for it in range(blk_lo * SUBTILES, blk_hi * SUBTILES):
        entry = offs_k == it // SUBTILES
        page = tl.sum(tl.where(entry, pages_k, 0), axis=0)
        n_visible = tl.sum(tl.where(entry, n_visible_k, 0), axis=0)
        sub = (it % SUBTILES) * BLOCK_N  # first slot of this slice inside the page
        visible = sub + offs_n < n_visible
        k = tl.load(
            kv_head_ptr + page.to(tl.int64) * stride_kv_b + (sub + offs_n)[:, None] * stride_kv_t
            + (0 + offs_d[None, :]) * stride_kv_d, mask=visible[:, None], other=0.0)
        if V_EARLY:
            v = tl.load(
                kv_head_ptr + page.to(tl.int64) * stride_kv_b + (sub + offs_n)[:, None] * stride_kv_t
                + (HEAD_DIM + offs_d[None, :]) * stride_kv_d, mask=visible[:, None], other=0.0)
        if KV_UPCAST == 1:
            k = k.to(tl.float32)  # fp8 -> fp32 -> MMA dtype: other instructions than fp8 -> bf16
        s = tl.dot(q, tl.trans(k.to(q.dtype)))
        if MASK_ALL_SLICES:
            s = tl.where(visible[None, :], s, float("-inf"))
        elif sub + BLOCK_N > n_visible:
            s = tl.where(visible[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
        # A row that has seen no visible key yet keeps m == -inf; shift by 0 so exp2 gives 0, not NaN.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_shift)
        p = tl.exp2(s * qk_scale - m_shift[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if not V_EARLY:
            v = tl.load(
                kv_head_ptr + page.to(tl.int64) * stride_kv_b + (sub + offs_n)[:, None] * stride_kv_t
                + (HEAD_DIM + offs_d[None, :]) * stride_kv_d, mask=visible[:, None], other=0.0)
        if KV_UPCAST == 1:
            v = v.to(tl.float32)
        v = v.to(q.dtype)
        pv = tl.dot(p.to(q.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    if NUM_SPLITS == 1:
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        o = acc / l_safe[:, None]
        o = o * tl.load(v_scale_ptr)  # folded V scale: once on the normalized fp32 accumulator
        tl.store(
            out_ptr + row_tok[:, None] * stride_o_t + heads[:, None] * stride_o_h + offs_d[None, :] * stride_o_d,
            o.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None],
        )
    else:
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        o = acc / l_safe[:, None]
        # Partials are [total_q, Hq, NUM_SPLITS, HEAD_DIM] of partial_dtype (fp16 or fp32: the
        # buffer's own type) and lse [total_q, Hq, NUM_SPLITS] fp32.
        row = (t * (tl.num_programs(1) * GQA) + heads) * NUM_SPLITS + split
        tl.store(part_o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], o.to(part_o_ptr.dtype.element_ty),
                 mask=row_ok[:, None])
        lse = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(part_lse_ptr + row, lse, mask=row_ok)
        if FUSED_MERGE:
            # The barrier puts every thread's partial stores before the counter's release (acq_rel
            # at GPU scope); the last to arrive sees all splits' partials after its acquire.
            tl.debug_barrier()
            counter = counter_ptr + t * tl.num_programs(1) + g
            arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if arrived == NUM_SPLITS - 1:
                row = row - split
                offs_s = tl.arange(0, SPLITS_P2)
                mg_lse = tl.load(
                    part_lse_ptr + row[:, None] + offs_s[None, :],
                    mask=row_ok[:, None] & (offs_s[None, :] < NUM_SPLITS),
                    other=float("-inf"), cache_modifier=".cg",
                )
                mg_max = tl.max(mg_lse, axis=1)
                mg_shift = tl.where(mg_max == float("-inf"), 0.0, mg_max)
                mg_den = tl.sum(tl.exp2(mg_lse - mg_shift[:, None]), axis=1)  # an empty split has lse -inf: weight 0
                mg_acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
                # MERGE_CHUNK splits' partials per load, all in flight at once: the merge costs a few L2 round
                # trips, not one per split.
                for c in tl.static_range(0, SPLITS_P2, MERGE_CHUNK):
                    offs_c = c + tl.arange(0, MERGE_CHUNK)
                    mg_ok = row_ok[:, None] & (offs_c[None, :] < NUM_SPLITS)
                    mg_w = tl.exp2(tl.load(part_lse_ptr + row[:, None] + offs_c[None, :], mask=mg_ok,
                                           other=float("-inf"), cache_modifier=".cg") - mg_shift[:, None])
                    mg_o = tl.load(part_o_ptr + (row[:, None, None] + offs_c[None, :, None]) * HEAD_DIM + offs_d[None, None, :],
                                   mask=mg_ok[:, :, None], other=0.0, cache_modifier=".cg").to(tl.float32)  # fp16 or fp32 partials
                    mg_acc += tl.sum(mg_w[:, :, None] * mg_o, axis=1)
                o = mg_acc / tl.where(mg_den > 0.0, mg_den, 1.0)[:, None]
                o = o * tl.load(v_scale_ptr)  # folded V scale: once, on the merged result
                tl.store(
                    out_ptr + row_tok[:, None] * stride_o_t + heads[:, None] * stride_o_h + offs_d[None, :] * stride_o_d,
                    o.to(out_ptr.dtype.element_ty),
                    mask=row_ok[:, None],
                )
                tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")  # zero again for the next call


KERNEL = _msa_decode_split_kernel



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
    return False  # gfx942 has no TMA


def reads_through_tma(kv_cache, head_dim, config):
    """Whether a launch reads K/V through TMA: the config asks for it (kv_tma 1, else plain
    loads) and the cache allows it (kv_tma_ok)."""
    return config.kv_tma == 1 and kv_tma_ok(kv_cache, head_dim)


def kv_descriptor(kv_cache, head_dim, block_n):
    """The TMA descriptor over the 4-D cache (all four strides honoured) whose box is one
    BLOCK_N x HEAD_DIM slice of a (page, KV head)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(kv_cache, list(kv_cache.shape), list(kv_cache.stride()), [1, 1, block_n, head_dim])


def partial_dtype(kv_dtype, out_dtype):
    """Element type of the split-K partial outputs for a cache of `kv_dtype` and an output of
    `out_dtype` (the log-sum-exps are always fp32).

    fp16 for an fp8 cache and a 16-bit output. Range: with folded scalar scales a partial is a
    convex combination of unscaled fp8 V values (|o| <= 448 for e4m3, 240 for e4m3fnuz, 57344 for
    e5m2, all below fp16's 65504; V's scale is applied after the merge), so fp16 cannot overflow.
    Precision: fp16 rounds to 2^-11 relative, no coarser than a bf16 or fp16 output; an fp32
    output keeps fp32 partials. Halves the bytes the merge reads. fp32 otherwise.
    """
    fp8_cache = kv_dtype.is_floating_point and kv_dtype.itemsize == 1
    return torch.float16 if fp8_cache and out_dtype.itemsize <= 2 else torch.float32


def constexprs(*, num_q_heads, num_kv_heads, head_dim, topk, config, varlen=False, use_pdl=False, kv_tma=False,
               decode_query_len=1, **_):
    """The kernel's compile-time parameters for a shape and config (shared with the static checks).

    MASK_ALL_SLICES: plain loads of uniform multi-token queries (decode_query_len > 1, not varlen), but
    for kv_upcast 3, mask every slice's scores: the partial-slice gate's branch tipped ptxas into 172
    registers (TP8 per_token_head `bn128 w8 sp8 up0`, 4 tokens; 128 at 1), x0.65 (results/h100/
    decode-multitoken). kv_upcast 3 and every other launch keep the gate: 0.4-3.8% faster on all six
    4-token plain-load up3 rows measured (results/h100/decode-multitoken-check)."""
    gqa = num_q_heads // num_kv_heads
    return dict(GQA=gqa, HEAD_DIM=head_dim, PAGE=PAGE, TOPK_P2=triton.next_power_of_2(topk),
                BLOCK_M=max(16, triton.next_power_of_2(gqa)), BLOCK_N=config.block_n,
                NUM_SPLITS=config.num_splits, SPLITS_P2=triton.next_power_of_2(config.num_splits),
                MERGE_CHUNK=min(4, triton.next_power_of_2(config.num_splits)),
                FUSED_MERGE=bool(config.fused_merge and config.num_splits > 1),
                KV_UPCAST=config.kv_upcast,
                VARLEN=varlen, USE_PDL=False, KV_TMA=kv_tma,
                MASK_ALL_SLICES=(not kv_tma and not varlen and decode_query_len > 1
                                 and config.kv_upcast != 3),
                V_EARLY=bool(config.v_early))


def options(config):
    """Compiler/launch options of `config` on gfx942."""
    return dict(num_warps=config.num_warps, num_stages=config.num_stages, waves_per_eu=config.waves_per_eu,
                matrix_instr_nonkdim=config.matrix_instr_nonkdim, kpack=config.kpack)


def launch(q, kv_cache, topk_idx, block_table, seq_lens, num_kv_heads, sm_scale, output,
           decode_query_len, k_scale, v_scale, query_start_loc, token_to_req_indices, config,
           use_pdl, counters=None, record=None):
    """Launches on validated arguments (codegen.api checks them). `counters`: zeroed int32, at
    least total_q x num_kv_heads, needed for a fused merge (codegen.plan owns them). `record`: a
    list that receives the launch as (kernel, grid, args, kwargs) instead of running it
    (codegen.plan binds it; the partial buffers allocated here go with it).

    Returns None when the output is complete (one split, or a fused merge), else the
    (partial_o, partial_lse) buffers the merge kernel reduces.
    """
    total_q, num_q_heads, head_dim = q.shape
    topk = topk_idx.shape[2]
    num_splits = config.num_splits
    if total_q == 0:
        return None
    if num_splits == 1:
        part_o = part_lse = output  # never written: the kernel's one-split branch stores the output
    else:
        part_o = torch.empty((total_q, num_q_heads, num_splits, head_dim),
                             dtype=partial_dtype(kv_cache.dtype, output.dtype), device=q.device)
        part_lse = torch.empty((total_q, num_q_heads, num_splits), dtype=torch.float32, device=q.device)
    fused = num_splits > 1 and bool(config.fused_merge)
    if fused and (counters is None or counters.numel() < total_q * num_kv_heads):
        raise ValueError(f"counters: a fused merge needs >= {total_q * num_kv_heads} zeroed int32 arrival counters")
    varlen = query_start_loc is not None
    grid = (total_q, num_kv_heads, num_splits)
    kv_tma = reads_through_tma(kv_cache, head_dim, config)
    args = (
        q, kv_cache, kv_descriptor(kv_cache, head_dim, config.block_n) if kv_tma else kv_cache, topk_idx, block_table, seq_lens,
        query_start_loc if varlen else seq_lens, token_to_req_indices if varlen else seq_lens,
        output, part_o, part_lse, counters if fused else seq_lens,
        k_scale, v_scale,
        float(sm_scale), topk, seq_lens.shape[0], decode_query_len if not varlen else 1,
        triton.cdiv(topk, num_splits),
        *q.stride(), *kv_cache.stride(), *topk_idx.stride(), *block_table.stride(), *output.stride(),
    )
    kwargs = dict(**constexprs(num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, topk=topk,
                               config=config, varlen=varlen, use_pdl=use_pdl, kv_tma=kv_tma,
                               decode_query_len=decode_query_len),
                  **options(config))
    if record is not None:
        record.append((_msa_decode_split_kernel, grid, args, kwargs))
    else:
        _msa_decode_split_kernel[grid](*args, **kwargs)
    return None if num_splits == 1 or fused else (part_o, part_lse)

INPUTS_SHA256 = '2d44af992d439d5c0773f054119ab2dce3ab8710ac515ab08a39aa117b41e138'
