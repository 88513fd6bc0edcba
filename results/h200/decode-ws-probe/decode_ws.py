"""Probe (issue 36): a warp-specialized Gluon decode. Does a producer/converter partition ahead of the MMA
warps break the single-partition kernel's ~2.2 us-a-page serial chain (results/h200/decode-gluon-probe)?

One program = (token, KV head, split), its split's entries of the token's top-k row. The prefill Gluon
tile's machinery at 64 rows and one consumer warpgroup:
  converter (4 warps): TMA of the fp8 K and V pages into an NS-stage ring, fp8 -> fp16 into an NC-stage
    ring (V rows past the visible slots zeroed), then READY for the consumer;
  consumer (4 warps, one warpgroup): S = q K^T (q: the GQA heads in rows 0..GQA-1 of 64, zeros below),
    row softmax, O += P V (P from registers, V from shared memory as is: no transpose).
Scalar (folded) scales, fp8 e4m3fn, D 128. Splits: fp32 partials + base-2 lse, merged by the shipped
merge kernel (a second launch); one split writes the output itself.
"""
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, warpgroup_mma

from codegen.configs import LaunchConfig
from codegen.generated import sm90_decode_merge_scalar as merge_module
from codegen.generated.sm90_prefill_ws_scalar import (  # the prefill tile's helpers, as they ship
    _convert, _cta_barrier, _issue, _named_barrier, _reinterpret)

PAGE = 128
HEAD_DIM = 128
BM = 64
KEMPTY = gl.constexpr(8)   # + stage: the consumer's QK of the stage retired (256: consumer + converter)
VEMPTY = gl.constexpr(10)  # + stage: the consumer's PV of the stage retired (256)
READY = gl.constexpr(12)   # + stage: the stage's K and V converted (256)


@gluon.jit
def _pick(vec, offs, j):
    """Element j of a per-thread-replicated vector (a scalar)."""
    return gl.sum(gl.where(offs == j, vec, 0), 0)


@gluon.jit
def _entries(topk_ptr, block_table_ptr, t, g, req, kv_end, topk, blk_lo, blk_hi, stride_tk_h, stride_tk_t,
             stride_tk_k, stride_bt_r, stride_bt_b, TOPK_P2: gl.constexpr, PAGE: gl.constexpr,
             NUM_WARPS: gl.constexpr):
    """The split's pages and visible slots, every thread holding all (a dead entry: page 0, 0 slots)."""
    ent_layout: gl.constexpr = gl.BlockedLayout([TOPK_P2], [32], [NUM_WARPS], [0])
    offs_k = gl.arange(0, TOPK_P2, layout=ent_layout)
    n_causal = gl.cdiv(gl.maximum(kv_end, 0), PAGE)
    mine = (offs_k >= blk_lo) & (offs_k < blk_hi)
    topk_row = topk_ptr + g.to(gl.int64) * stride_tk_h + t.to(gl.int64) * stride_tk_t
    ids = gl.load(topk_row + offs_k * stride_tk_k, mask=mine, other=-1)
    live = mine & (ids >= 0) & (ids < n_causal)
    ids = gl.where(live, ids, 0)
    pages = gl.load(block_table_ptr + req.to(gl.int64) * stride_bt_r + ids * stride_bt_b, mask=live, other=0)
    n_vis = gl.where(live, gl.minimum(kv_end - ids * PAGE, PAGE), 0)
    return offs_k, pages, n_vis


@gluon.jit
def _converter(kv_desc, k8, v8, k16, v16, kbar, vbar, topk_ptr, block_table_ptr, t, g, req, kv_end, topk, blk_lo,
               blk_hi, n_steps, stride_tk_h, stride_tk_t, stride_tk_k, stride_bt_r, stride_bt_b,
               TOPK_P2: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, NS: gl.constexpr, NC: gl.constexpr,
               CR: gl.constexpr, PAGE: gl.constexpr, EARLY: gl.constexpr):
    offs_k, pages, n_vis_k = _entries(topk_ptr, block_table_ptr, t, g, req, kv_end, topk, blk_lo, blk_hi,
                                      stride_tk_h, stride_tk_t, stride_tk_k, stride_bt_r, stride_bt_b, TOPK_P2, PAGE,
                                      4)
    one_layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    ones = gl.full([128], 1, gl.int32, one_layout)
    cvt_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    if not EARLY:  # else the prologue issued them, before q's load and the partitions
        for i in gl.static_range(NS):
            _issue(kv_desc, k8, v8, kbar, vbar, g, _pick(pages, offs_k, blk_lo + i), i, n_steps, BN, D, NS)
    for j in range(n_steps):
        n_vis = _pick(n_vis_k, offs_k, blk_lo + j)
        page_n = _pick(pages, offs_k, blk_lo + j + NS)
        s = j % NS
        c = j % NC
        ph = (j // NS) & 1
        refill = ones * (j >= NC).to(gl.int32)
        mbarrier.wait(kbar.index(s), ph)
        _named_barrier(ones * (KEMPTY + c), 256, True, refill)  # QK(j - NC) retired
        _convert(k8.index(s), k16.index(c), n_vis, BN, CR, False, cvt_layout)
        mbarrier.wait(vbar.index(s), ph)
        _named_barrier(ones * (VEMPTY + c), 256, True, refill)  # PV(j - NC) retired
        if n_vis < BN:
            _convert(v8.index(s), v16.index(c), n_vis, BN, CR, True, cvt_layout)
        else:
            _convert(v8.index(s), v16.index(c), n_vis, BN, CR, False, cvt_layout)
        fence_async_shared()
        _named_barrier(ones * (READY + c), 256, False, ones)
        _cta_barrier()  # every thread's reads of this fp8 stage done before the TMA refills it
        _issue(kv_desc, k8, v8, kbar, vbar, g, page_n, j + NS, n_steps, BN, D, NS)


@gluon.jit
def _consumer(q_s, k16, v16, topk_ptr, block_table_ptr, t, g, req, kv_end, topk, blk_lo, blk_hi, n_steps, qk_scale,
              v_scale_ptr, out_ptr, part_o_ptr, part_lse_ptr, counter_ptr, split, stride_tk_h, stride_tk_t, stride_tk_k,
              stride_bt_r, stride_bt_b, stride_o_t, stride_o_h,
              GQA: gl.constexpr, TOPK_P2: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr,
              NC: gl.constexpr, NUM_SPLITS: gl.constexpr, SPLITS_P2: gl.constexpr, FUSED: gl.constexpr,
              PAGE: gl.constexpr):
    offs_k, pages, n_vis_k = _entries(topk_ptr, block_table_ptr, t, g, req, kv_end, topk, blk_lo, blk_hi,
                                      stride_tk_h, stride_tk_t, stride_tk_k, stride_bt_r, stride_bt_b, TOPK_P2, PAGE,
                                      4)
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    one_layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    ones = gl.full([128], 1, gl.int32, one_layout)
    offs_n = gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
    m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BM, D], gl.float32, o_layout)
    for j in range(n_steps):
        c = j % NC
        n_vis = _pick(n_vis_k, offs_k, blk_lo + j)
        _named_barrier(ones * (READY + c), 256, True, ones)  # K(j), V(j) converted
        qk = warpgroup_mma(q_s, k16.index(c).permute((1, 0)), gl.zeros([BM, BN], gl.float32, s_layout),
                           use_acc=False)
        _named_barrier(ones * (KEMPTY + c), 256, False, ones * (j + NC < n_steps).to(gl.int32))
        qk = gl.where((offs_n < n_vis)[None, :], qk, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(qk, 1) * qk_scale)
        m_shift = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_shift)
        p = gl.exp2(qk * qk_scale - m_shift[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p16 = gl.convert_layout(p.to(gl.float16), p_layout)
        acc = warpgroup_mma(p16, v16.index(c), acc)
        _named_barrier(ones * (VEMPTY + c), 256, False, ones * (j + NC < n_steps).to(gl.int32))
        m_i = m_new
    l_safe = gl.where(l_i > 0.0, l_i, 1.0)
    o = acc * gl.convert_layout(1.0 / l_safe, gl.SliceLayout(1, o_layout))[:, None]
    st_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    o = gl.convert_layout(o, st_layout)
    offs_om = gl.arange(0, BM, layout=gl.SliceLayout(1, st_layout))
    offs_od = gl.arange(0, D, layout=gl.SliceLayout(0, st_layout))
    heads = g * GQA + offs_om
    row_ok = offs_om < GQA
    if NUM_SPLITS == 1:
        o = o * gl.load(v_scale_ptr)
        o_rows = t.to(gl.int64) * stride_o_t + heads.to(gl.int64) * stride_o_h
        gl.store(out_ptr + o_rows[:, None] + offs_od[None, :], o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        hq = gl.num_programs(1) * GQA
        prow = (t.to(gl.int64) * hq + heads) * NUM_SPLITS + split
        gl.store(part_o_ptr + prow[:, None] * D + offs_od[None, :], o.to(part_o_ptr.dtype.element_ty),
                 mask=row_ok[:, None])
        lse = gl.where(l_i > 0.0, m_i + gl.log2(l_safe), float("-inf"))
        offs_lm = gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
        lrow = (t.to(gl.int64) * hq + g * GQA + offs_lm) * NUM_SPLITS + split
        gl.store(part_lse_ptr + lrow, lse, mask=offs_lm < GQA)
        if FUSED:
            # The last split program of the (token, KV head) to arrive merges (acq_rel counter, reset after).
            _cta_barrier()
            counter = counter_ptr + t * gl.num_programs(1) + g
            arrived = gl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if arrived == NUM_SPLITS - 1:
                mg: gl.constexpr = gl.BlockedLayout([1, 1, 8], [2, 1, 16], [4, 1, 1], [2, 1, 0])
                w_layout: gl.constexpr = gl.SliceLayout(2, mg)
                o3_layout: gl.constexpr = gl.SliceLayout(1, mg)
                mh = gl.arange(0, GQA, layout=gl.SliceLayout(1, w_layout))
                ms = gl.arange(0, SPLITS_P2, layout=gl.SliceLayout(0, w_layout))
                base = (t.to(gl.int64) * hq + g * GQA + mh) * NUM_SPLITS
                lses = gl.load(part_lse_ptr + base[:, None] + ms[None, :], mask=(ms < NUM_SPLITS)[None, :],
                               other=float("-inf"), cache_modifier=".cg")
                mx = gl.max(lses, 1)
                mx = gl.where(mx == float("-inf"), 0.0, mx)
                w = gl.exp2(lses - mx[:, None])
                den = gl.sum(w, 1)
                w = w / gl.where(den > 0.0, den, 1.0)[:, None]
                md = gl.arange(0, D, layout=gl.SliceLayout(0, o3_layout))
                md3 = gl.expand_dims(gl.expand_dims(md, 0), 1)
                rows3 = gl.expand_dims(base[:, None] + ms[None, :], 2)
                parts = gl.load(part_o_ptr + rows3 * D + md3, mask=gl.expand_dims((ms < NUM_SPLITS)[None, :], 2),
                                other=0.0, cache_modifier=".cg").to(gl.float32)
                om = gl.sum(gl.expand_dims(w, 2) * parts, 1) * gl.load(v_scale_ptr)
                oh = gl.arange(0, GQA, layout=gl.SliceLayout(1, o3_layout))
                o_rows = t.to(gl.int64) * stride_o_t + (g * GQA + oh).to(gl.int64) * stride_o_h
                gl.store(out_ptr + o_rows[:, None] + md[None, :], om.to(out_ptr.dtype.element_ty))
                gl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")


@gluon.jit
def _decode_ws_kernel(
    q_ptr, kv_desc, topk_ptr, block_table_ptr, seq_lens_ptr, out_ptr, part_o_ptr, part_lse_ptr, counter_ptr,
    k_scale_ptr, v_scale_ptr,
    sm_scale, topk, num_reqs, decode_query_len, blocks_per_split,
    stride_q_t, stride_q_h, stride_tk_h, stride_tk_t, stride_tk_k, stride_bt_r, stride_bt_b, stride_o_t, stride_o_h,
    GQA: gl.constexpr, HEAD_DIM: gl.constexpr, PAGE: gl.constexpr, TOPK_P2: gl.constexpr, BM: gl.constexpr,
    NUM_SPLITS: gl.constexpr, SPLITS_P2: gl.constexpr, NS: gl.constexpr, NC: gl.constexpr, CONVERT_ROWS: gl.constexpr,
    CONVERTER_REGS: gl.constexpr, EARLY: gl.constexpr, FUSED: gl.constexpr,
):
    BN: gl.constexpr = PAGE
    D: gl.constexpr = HEAD_DIM
    t = gl.program_id(0)
    g = gl.program_id(1)
    split = gl.program_id(2)
    row_live = t < num_reqs * decode_query_len
    req = t // decode_query_len
    jq = t % decode_query_len
    seq_len = gl.load(seq_lens_ptr + req, mask=row_live, other=0)
    kv_end = gl.where(row_live, gl.minimum(seq_len - decode_query_len + jq + 1, seq_len), 0)
    n_read = gl.minimum(topk, gl.cdiv(gl.maximum(kv_end, 0), PAGE))
    blk_lo = gl.minimum(split * blocks_per_split, n_read)
    blk_hi = gl.minimum(blk_lo + blocks_per_split, n_read)
    n_steps = blk_hi - blk_lo
    f8_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D], gl.float8e4nv)
    k8 = gl.allocate_shared_memory(gl.float8e4nv, [NS, BN, D], f8_layout)
    v8 = gl.allocate_shared_memory(gl.float8e4nv, [NS, BN, D], f8_layout)
    kbar = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    vbar = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NS):
        mbarrier.init(kbar.index(i), count=1)
        mbarrier.init(vbar.index(i), count=1)
    fence_async_shared()
    if EARLY:  # the first pages in flight before q's load and the partitions' set-up
        _cta_barrier()
        offs_k, pages, n_vis_k = _entries(topk_ptr, block_table_ptr, t, g, req, kv_end, topk, blk_lo, blk_hi,
                                          stride_tk_h, stride_tk_t, stride_tk_k, stride_bt_r, stride_bt_b, TOPK_P2,
                                          PAGE, 4)
        for i in gl.static_range(NS):
            _issue(kv_desc, k8, v8, kbar, vbar, g, _pick(pages, offs_k, blk_lo + i), i, n_steps, BN, D, NS)

    # q -> fp16 in rows 0..GQA-1 (divided into fp16's range; a negative k_scale flips q).
    q_ld: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    offs_qm = gl.arange(0, BM, layout=gl.SliceLayout(1, q_ld))
    offs_qd = gl.arange(0, D, layout=gl.SliceLayout(0, q_ld))
    q_rows = t.to(gl.int64) * stride_q_t + (g * GQA + offs_qm).to(gl.int64) * stride_q_h
    qf = gl.load(q_ptr + q_rows[:, None] + offs_qd[None, :], mask=(offs_qm < GQA)[:, None], other=0.0).to(gl.float32)
    q_div = gl.maximum(gl.max(gl.max(gl.abs(qf), 1), 0) / 32768.0, 1.0)
    qk_scale = sm_scale * 1.4426950408889634 * gl.load(k_scale_ptr)
    q_mul = gl.where(qk_scale < 0.0, -1.0, 1.0) / q_div
    qk_scale = gl.abs(qk_scale) * q_div
    q_s = gl.allocate_shared_memory(gl.float16, [BM, D], gl.NVMMASharedLayout.get_default_for([BM, D], gl.float16),
                                    (qf * q_mul).to(gl.float16))
    f16_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D], gl.float16)
    k16 = gl.allocate_shared_memory(gl.float16, [NC, BN, D], f16_layout)
    v16 = gl.allocate_shared_memory(gl.float16, [NC, BN, D], f16_layout)
    fence_async_shared()
    _cta_barrier()
    gl.warp_specialize([
        (_consumer, (q_s, k16, v16, topk_ptr, block_table_ptr, t, g, req, kv_end, topk, blk_lo, blk_hi, n_steps,
                     qk_scale, v_scale_ptr, out_ptr, part_o_ptr, part_lse_ptr, counter_ptr, split, stride_tk_h,
                     stride_tk_t, stride_tk_k, stride_bt_r, stride_bt_b, stride_o_t, stride_o_h, GQA, TOPK_P2, BM, BN,
                     D, NC, NUM_SPLITS, SPLITS_P2, FUSED, PAGE)),
        (_converter, (kv_desc, k8, v8, k16, v16, kbar, vbar, topk_ptr, block_table_ptr, t, g, req, kv_end, topk,
                      blk_lo, blk_hi, n_steps, stride_tk_h, stride_tk_t, stride_tk_k, stride_bt_r, stride_bt_b,
                      TOPK_P2, BN, D, NS, NC, CONVERT_ROWS, PAGE, EARLY)),
    ], [4], [CONVERTER_REGS])


def kv_descriptor(kv_cache):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    layout = gl.NVMMASharedLayout.get_default_for([1, 1, PAGE, HEAD_DIM], gl.float8e4nv)
    return TensorDescriptor(kv_cache, list(kv_cache.shape), list(kv_cache.stride()), [1, 1, PAGE, HEAD_DIM], layout)


def launch(q, kv_cache, topk_idx, block_table, seq_lens, num_kv_heads, sm_scale, output, decode_query_len,
           k_scale, v_scale, *, num_splits=1, ns=2, nc=2, convert_rows=32, converter_regs=120, early=False,
           fused=False, counters=None):
    total_q, hq, d = q.shape
    topk = topk_idx.shape[2]
    gqa = hq // num_kv_heads
    if num_splits > 1:
        part_o = torch.empty((total_q, hq, num_splits, d), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((total_q, hq, num_splits), dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = output
    fused = fused and num_splits > 1
    if fused and counters is None:
        raise ValueError("counters: a fused merge needs total_q x num_kv_heads zeroed int32 counters")
    grid = (total_q, num_kv_heads, num_splits)
    _decode_ws_kernel[grid](
        q, kv_descriptor(kv_cache), topk_idx, block_table, seq_lens, output, part_o, part_lse,
        counters if fused else seq_lens, k_scale, v_scale,
        float(sm_scale), topk, seq_lens.shape[0], decode_query_len, triton.cdiv(topk, num_splits),
        q.stride(0), q.stride(1), *topk_idx.stride(), *block_table.stride(), output.stride(0), output.stride(1),
        GQA=gqa, HEAD_DIM=d, PAGE=PAGE, TOPK_P2=triton.next_power_of_2(topk), BM=BM, NUM_SPLITS=num_splits,
        SPLITS_P2=triton.next_power_of_2(num_splits), NS=ns, NC=nc, CONVERT_ROWS=convert_rows,
        CONVERTER_REGS=converter_regs, EARLY=early, FUSED=fused, num_warps=4)
    if num_splits > 1 and not fused:
        merge_module.launch(part_o, part_lse, output, num_kv_heads, v_scale,
                            LaunchConfig(num_splits=num_splits), use_pdl=False)
    return output
