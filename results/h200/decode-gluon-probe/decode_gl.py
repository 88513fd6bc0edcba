"""Probe: a Gluon decode kernel, keys on the MMA's M (wgmma m64 x 2), the GQA heads on N (16).

One program = (token, KV head, split); its pages by 4-D TMA into a STAGES ring (fp8 K and V), converted
fp8 -> fp16 into shared memory, S^T = K q^T, softmax over keys (axis 0), P^T to shared memory,
O^T = V^T P^T (V^T: the fp16 V tile read transposed). Scalar (folded) scales, fp8 e4m3fn, GQA 16, D 128.
Splits: partials (fp16) + lse, merged by the last program to arrive (per (token, KV head) counter).
"""
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_init, warpgroup_mma_wait)

# Gluon's names across Triton versions: the generated prefill tile's shims (templates/prefill_ws.py.jinja).
from codegen.generated.sm90_prefill_ws_scalar import _cta_barrier, _reinterpret, _tma_load  # noqa: E402

PAGE = 128
HEAD_DIM = 128


@gluon.jit
def _pick(vec, offs, j):
    """Element j of a per-thread-replicated vector (a scalar)."""
    return gl.sum(gl.where(offs == j, vec, 0), 0)


@gluon.jit
def _issue(kv_desc, k8, v8, kbar, vbar, g, page, j, live, BN: gl.constexpr, D: gl.constexpr, NS: gl.constexpr):
    s = j % NS
    nbytes: gl.constexpr = kv_desc.block_type.nbytes
    mbarrier.expect(kbar.index(s), nbytes, live)
    mbarrier.expect(vbar.index(s), nbytes, live)
    box_layout: gl.constexpr = kv_desc.layout
    k_dst = _reinterpret(k8.index(s), gl.float8e4nv, [1, 1, BN, D], box_layout)
    v_dst = _reinterpret(v8.index(s), gl.float8e4nv, [1, 1, BN, D], box_layout)
    _tma_load(kv_desc, [page, g, 0, 0], kbar.index(s), k_dst, live)
    _tma_load(kv_desc, [page, g, 0, D], vbar.index(s), v_dst, live)


@gluon.jit
def _convert(src, dst, n_vis, ZERO_PAST: gl.constexpr, BN: gl.constexpr, CR: gl.constexpr, cvt_layout: gl.constexpr):
    for c in gl.static_range(BN // CR):
        y = src.slice(c * CR, CR).load(cvt_layout).to(gl.float16)
        if ZERO_PAST:
            rows = c * CR + gl.arange(0, CR, layout=gl.SliceLayout(1, cvt_layout))
            y = gl.where((rows < n_vis)[:, None], y, 0.0)
        dst.slice(c * CR, CR).store(y)


@gluon.jit
def _page_scales(ks_head, vs_head, page, n_vis, offs_key, stride_ks_t, stride_vs_t, PAGE: gl.constexpr):
    """per_token_head: the page's K and V scales (0 past its visible slots)."""
    slot = page.to(gl.int64) * PAGE + offs_key
    ks = gl.load(ks_head + slot * stride_ks_t, mask=offs_key < n_vis, other=0.0)
    vs = gl.load(vs_head + slot * stride_vs_t, mask=offs_key < n_vis, other=0.0)
    return ks, vs


@gluon.jit
def _issue_qk(k8_stage, k16, q_s, n_vis, BN: gl.constexpr, GQA: gl.constexpr, CONVERT_ROWS: gl.constexpr,
              K_IN_REGS: gl.constexpr, IS_ASYNC: gl.constexpr, s_layout: gl.constexpr, k_op_layout: gl.constexpr,
              cvt_layout: gl.constexpr):
    """S^T = K q^T: K from the fp8 stage straight into the register operand (K_IN_REGS), or converted into
    k16 first. The result, or with IS_ASYNC the MMA in flight."""
    if K_IN_REGS:
        k_a = k8_stage.load(k_op_layout).to(gl.float16)
        return warpgroup_mma(k_a, q_s.permute((1, 0)), gl.zeros([BN, GQA], gl.float32, s_layout), use_acc=False,
                             is_async=IS_ASYNC)
    else:
        _convert(k8_stage, k16, n_vis, False, BN, CONVERT_ROWS, cvt_layout)
        fence_async_shared()
        _cta_barrier()
        return warpgroup_mma(k16, q_s.permute((1, 0)), gl.zeros([BN, GQA], gl.float32, s_layout), use_acc=False,
                             is_async=IS_ASYNC)


@gluon.jit
def _convert_v(v8_stage, v16, n_vis, BN: gl.constexpr, CONVERT_ROWS: gl.constexpr, cvt_layout: gl.constexpr):
    """V fp8 -> fp16, rows past the visible slots zeroed only on a partial page."""
    if n_vis < BN:
        _convert(v8_stage, v16, n_vis, True, BN, CONVERT_ROWS, cvt_layout)
    else:
        _convert(v8_stage, v16, n_vis, False, BN, CONVERT_ROWS, cvt_layout)


@gluon.jit
def _softmax_step(s, n_vis, offs_key, m_i, l_i, acc, acc_unit, ks, vs, qk_scale, PTH: gl.constexpr):
    """Online softmax over the page's keys (axis 0 of S^T); returns (P^T, m, l, acc, acc_unit).
    per_token_head: K's scales on the scores, V's on P over their largest |scale| (acc kept in that unit)."""
    if PTH:
        s = s * (ks * qk_scale)[:, None]
        s = gl.where((offs_key < n_vis)[:, None], s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 0))
        m_shift = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_shift)
        p = gl.exp2(s - m_shift[None, :])
        l_i = l_i * alpha + gl.sum(p, 0)
        v_top = gl.max(gl.abs(vs), 0)
        v_top = gl.where(v_top > 0.0, v_top, 1.0)
        acc = acc * (alpha * (acc_unit / v_top))[None, :]
        acc_unit = v_top
        p = p * (vs / v_top)[:, None]
    else:
        s = gl.where((offs_key < n_vis)[:, None], s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 0) * qk_scale)
        m_shift = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_shift)
        p = gl.exp2(s * qk_scale - m_shift[None, :])
        l_i = l_i * alpha + gl.sum(p, 0)
        acc = acc * alpha[None, :]
    return p, m_new, l_i, acc, acc_unit


@gluon.jit
def _decode_gl_kernel(
    q_ptr, kv_desc, topk_ptr, block_table_ptr, seq_lens_ptr, out_ptr, part_o_ptr, part_lse_ptr, counter_ptr,
    k_scale_ptr, v_scale_ptr,
    sm_scale, topk, num_reqs, decode_query_len, blocks_per_split,
    stride_q_t, stride_q_h, stride_tk_h, stride_tk_t, stride_tk_k, stride_bt_r, stride_bt_b, stride_o_t, stride_o_h,
    stride_ks_h, stride_ks_t, stride_vs_h, stride_vs_t,
    GQA: gl.constexpr, HEAD_DIM: gl.constexpr, PAGE: gl.constexpr, TOPK_P2: gl.constexpr,
    NUM_SPLITS: gl.constexpr, SPLITS_P2: gl.constexpr, STAGES: gl.constexpr, CONVERT_ROWS: gl.constexpr,
    SHARE_F16: gl.constexpr, ASYNC: gl.constexpr, K_IN_REGS: gl.constexpr, PTH: gl.constexpr, NUM_WARPS: gl.constexpr,
):
    gl.static_assert(GQA == 16)
    BN: gl.constexpr = PAGE
    D: gl.constexpr = HEAD_DIM
    t = gl.program_id(0)
    g = gl.program_id(1)
    split = gl.program_id(2)
    row_live = t < num_reqs * decode_query_len
    req = t // decode_query_len
    jq = t % decode_query_len
    seq_len = gl.load(seq_lens_ptr + req, mask=row_live, other=0)
    q_pos = seq_len - decode_query_len + jq
    kv_end = gl.where(row_live, gl.minimum(q_pos + 1, seq_len), 0)
    n_causal = gl.cdiv(gl.maximum(kv_end, 0), PAGE)
    n_read = gl.minimum(topk, n_causal)
    blk_lo = gl.minimum(split * blocks_per_split, n_read)
    blk_hi = gl.minimum(blk_lo + blocks_per_split, n_read)
    n_steps = blk_hi - blk_lo

    # The split's entries, every thread holding all of them (a step's page is picked in registers).
    ent_layout: gl.constexpr = gl.BlockedLayout([TOPK_P2], [32], [NUM_WARPS], [0])
    offs_k = gl.arange(0, TOPK_P2, layout=ent_layout)
    mine = (offs_k >= blk_lo) & (offs_k < blk_hi)
    topk_row = topk_ptr + g.to(gl.int64) * stride_tk_h + t.to(gl.int64) * stride_tk_t
    # (loaded over the whole row, not only this split's entries: no wait on seq_len first)
    ids = gl.load(topk_row + offs_k * stride_tk_k, mask=offs_k < topk, other=-1)
    live_k = mine & (ids >= 0) & (ids < n_causal)
    ids = gl.where(live_k, ids, 0)
    bt_row = block_table_ptr + req.to(gl.int64) * stride_bt_r
    pages_k = gl.load(bt_row + ids * stride_bt_b, mask=live_k, other=0)
    n_vis_k = gl.where(live_k, gl.minimum(kv_end - ids * PAGE, PAGE), 0)  # 0: a dead entry adds nothing

    k8 = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BN, D], gl.NVMMASharedLayout.get_default_for([BN, D], gl.float8e4nv))
    v8 = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BN, D], gl.NVMMASharedLayout.get_default_for([BN, D], gl.float8e4nv))
    kbar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    vbar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(kbar.index(i), count=1)
        mbarrier.init(vbar.index(i), count=1)
    fence_async_shared()
    for i in gl.static_range(STAGES):
        _issue(kv_desc, k8, v8, kbar, vbar, g, _pick(pages_k, offs_k, blk_lo + i), i, i < n_steps, BN, D, STAGES)

    # q -> fp16 (divided into fp16's range; a negative k_scale flips q), [GQA, D] in shared memory.
    q_ld: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [NUM_WARPS, 1], [1, 0])
    offs_qm = gl.arange(0, GQA, layout=gl.SliceLayout(1, q_ld))
    offs_qd = gl.arange(0, D, layout=gl.SliceLayout(0, q_ld))
    q_rows = t.to(gl.int64) * stride_q_t + (g * GQA + offs_qm).to(gl.int64) * stride_q_h
    qf = gl.load(q_ptr + q_rows[:, None] + offs_qd[None, :]).to(gl.float32)
    q_div = gl.maximum(gl.max(gl.max(gl.abs(qf), 1), 0) / 32768.0, 1.0)
    if PTH:
        qk_scale = sm_scale * 1.4426950408889634
    else:
        qk_scale = sm_scale * 1.4426950408889634 * gl.load(k_scale_ptr)
    q_mul = gl.where(qk_scale < 0.0, -1.0, 1.0) / q_div
    qk_scale = gl.abs(qk_scale) * q_div
    q_s = gl.allocate_shared_memory(gl.float16, [GQA, D], gl.NVMMASharedLayout.get_default_for([GQA, D], gl.float16),
                                    (qf * q_mul).to(gl.float16))
    f16_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D], gl.float16)
    k16 = gl.allocate_shared_memory(gl.float16, [BN, D], f16_layout)
    if SHARE_F16 and not ASYNC:
        v16 = k16
    else:
        v16 = gl.allocate_shared_memory(gl.float16, [BN, D], f16_layout)
    p_s = gl.allocate_shared_memory(gl.float16, [BN, GQA], gl.NVMMASharedLayout.get_default_for([BN, GQA], gl.float16))

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                       instr_shape=[16, GQA, 16])
    cvt_layout: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [NUM_WARPS, 1], [1, 0])
    k_op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
    offs_key = gl.arange(0, BN, layout=gl.SliceLayout(1, s_layout))
    m_i = gl.full([GQA], float("-inf"), gl.float32, gl.SliceLayout(0, s_layout))
    l_i = gl.zeros([GQA], gl.float32, gl.SliceLayout(0, s_layout))
    acc = gl.zeros([D, GQA], gl.float32, s_layout)  # O^T
    acc_unit = gl.to_tensor(1.0)  # per_token_head: acc in units of the last page's largest |V scale|
    ks_head = k_scale_ptr + g.to(gl.int64) * stride_ks_h
    vs_head = v_scale_ptr + g.to(gl.int64) * stride_vs_h
    _cta_barrier()
    if ASYNC:
        # QK(j) runs while V(j) is converted, PV(j) while K(j+1) is (k16 and v16 apart).
        pv = warpgroup_mma_init(acc)
        for j in range(n_steps):
            st = j % STAGES
            ph = (j // STAGES) & 1
            n_vis = _pick(n_vis_k, offs_k, blk_lo + j)
            if PTH:
                ks, vs = _page_scales(ks_head, vs_head, _pick(pages_k, offs_k, blk_lo + j), n_vis, offs_key,
                                      stride_ks_t, stride_vs_t, PAGE)
            else:
                ks = qk_scale  # not read
                vs = qk_scale
            mbarrier.wait(kbar.index(st), ph)
            qk = _issue_qk(k8.index(st), k16, q_s, n_vis, BN, GQA, CONVERT_ROWS, K_IN_REGS, True, s_layout,
                           k_op_layout, cvt_layout)
            acc = warpgroup_mma_wait(1, deps=[pv])  # PV(j-1) retired: v16 and p_s free
            _cta_barrier()
            mbarrier.wait(vbar.index(st), ph)
            _convert_v(v8.index(st), v16, n_vis, BN, CONVERT_ROWS, cvt_layout)
            s = warpgroup_mma_wait(0, deps=[qk])
            p, m_i, l_i, acc, acc_unit = _softmax_step(s, n_vis, offs_key, m_i, l_i, acc, acc_unit, ks, vs, qk_scale,
                                                       PTH)
            p_s.store(p.to(gl.float16))
            fence_async_shared()
            _cta_barrier()  # V, P written; this stage's fp8 read by every thread
            nj = j + STAGES
            _issue(kv_desc, k8, v8, kbar, vbar, g, _pick(pages_k, offs_k, blk_lo + nj), nj, nj < n_steps, BN, D,
                   STAGES)
            pv = warpgroup_mma(v16.permute((1, 0)), p_s, acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[pv])
    else:
        for j in range(n_steps):
            st = j % STAGES
            ph = (j // STAGES) & 1
            n_vis = _pick(n_vis_k, offs_k, blk_lo + j)
            if PTH:
                ks, vs = _page_scales(ks_head, vs_head, _pick(pages_k, offs_k, blk_lo + j), n_vis, offs_key,
                                      stride_ks_t, stride_vs_t, PAGE)
            else:
                ks = qk_scale  # not read
                vs = qk_scale
            mbarrier.wait(kbar.index(st), ph)
            s = _issue_qk(k8.index(st), k16, q_s, n_vis, BN, GQA, CONVERT_ROWS, K_IN_REGS, False, s_layout,
                          k_op_layout, cvt_layout)
            p, m_i, l_i, acc, acc_unit = _softmax_step(s, n_vis, offs_key, m_i, l_i, acc, acc_unit, ks, vs, qk_scale,
                                                       PTH)
            mbarrier.wait(vbar.index(st), ph)
            if SHARE_F16:
                _cta_barrier()  # every warp's QK read k16 before V overwrites it
            _convert_v(v8.index(st), v16, n_vis, BN, CONVERT_ROWS, cvt_layout)
            p_s.store(p.to(gl.float16))
            fence_async_shared()
            _cta_barrier()  # V, P written; this stage's fp8 read by every thread
            nj = j + STAGES
            _issue(kv_desc, k8, v8, kbar, vbar, g, _pick(pages_k, offs_k, blk_lo + nj), nj, nj < n_steps, BN, D,
                   STAGES)
            acc = warpgroup_mma(v16.permute((1, 0)), p_s, acc)
            _cta_barrier()  # PV read v16 and p_s before the next step writes them

    # O^T -> out / partials, stored along D (a blocked layout over [D, GQA], D fastest).
    st_layout: gl.constexpr = gl.BlockedLayout([8, 1], [16, 2], [1, NUM_WARPS], [0, 1])
    l_safe = gl.where(l_i > 0.0, l_i, 1.0)
    o = acc * (acc_unit / l_safe)[None, :]
    o = gl.convert_layout(o, st_layout)
    offs_od = gl.arange(0, D, layout=gl.SliceLayout(1, st_layout))
    offs_oh = gl.arange(0, GQA, layout=gl.SliceLayout(0, st_layout))
    heads = g * GQA + offs_oh
    if NUM_SPLITS == 1:
        if not PTH:
            o = o * gl.load(v_scale_ptr)
        o_rows = t.to(gl.int64) * stride_o_t + heads.to(gl.int64) * stride_o_h
        gl.store(out_ptr + o_rows[None, :] + offs_od[:, None], o.to(out_ptr.dtype.element_ty))
    else:
        hq = gl.num_programs(1) * GQA
        prow = (t.to(gl.int64) * hq + heads) * NUM_SPLITS + split
        gl.store(part_o_ptr + prow[None, :] * D + offs_od[:, None], o.to(part_o_ptr.dtype.element_ty))
        lse = gl.where(l_i > 0.0, m_i + gl.log2(l_safe), float("-inf"))
        lse_rows = (t.to(gl.int64) * hq + g * GQA + gl.arange(0, GQA, layout=gl.SliceLayout(0, s_layout))) * NUM_SPLITS + split
        gl.store(part_lse_ptr + lse_rows, lse)
        _cta_barrier()
        counter = counter_ptr + t * gl.num_programs(1) + g
        arrived = gl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
        if arrived == NUM_SPLITS - 1:
            mg: gl.constexpr = gl.BlockedLayout([1, 1, 8], [2, 1, 16], [NUM_WARPS, 1, 1], [2, 1, 0])
            w_layout: gl.constexpr = gl.SliceLayout(2, mg)
            o_layout: gl.constexpr = gl.SliceLayout(1, mg)
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
            md = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
            md3 = gl.expand_dims(gl.expand_dims(md, 0), 1)
            rows3 = gl.expand_dims(base[:, None] + ms[None, :], 2)
            parts = gl.load(part_o_ptr + rows3 * D + md3, mask=gl.expand_dims((ms < NUM_SPLITS)[None, :], 2),
                            other=0.0, cache_modifier=".cg").to(gl.float32)
            om = gl.sum(gl.expand_dims(w, 2) * parts, 1)
            if not PTH:
                om = om * gl.load(v_scale_ptr)
            oh = gl.arange(0, GQA, layout=gl.SliceLayout(1, o_layout))
            o_rows = t.to(gl.int64) * stride_o_t + (g * GQA + oh).to(gl.int64) * stride_o_h
            gl.store(out_ptr + o_rows[:, None] + md[None, :], om.to(out_ptr.dtype.element_ty))
            gl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")


def kv_descriptor(kv_cache):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    layout = gl.NVMMASharedLayout.get_default_for([1, 1, PAGE, HEAD_DIM], gl.float8e4nv)
    return TensorDescriptor(kv_cache, list(kv_cache.shape), list(kv_cache.stride()), [1, 1, PAGE, HEAD_DIM], layout)


def launch(q, kv_cache, topk_idx, block_table, seq_lens, num_kv_heads, sm_scale, output, decode_query_len,
           k_scale, v_scale, *, num_splits=1, stages=2, convert_rows=32, share_f16=True, async_qk=False, k_in_regs=False, num_warps=4,
           counters=None):
    total_q, hq, d = q.shape
    pth = k_scale.dim() == 2
    topk = topk_idx.shape[2]
    gqa = hq // num_kv_heads
    if num_splits > 1:
        part_o = torch.empty((total_q, hq, num_splits, d), dtype=torch.float32 if pth else torch.float16,
                             device=q.device)
        part_lse = torch.empty((total_q, hq, num_splits), dtype=torch.float32, device=q.device)
        if counters is None:
            counters = torch.zeros(total_q * num_kv_heads, dtype=torch.int32, device=q.device)
    else:
        part_o = part_lse = output
        counters = seq_lens
    grid = (total_q, num_kv_heads, num_splits)
    _decode_gl_kernel[grid](
        q, kv_descriptor(kv_cache), topk_idx, block_table, seq_lens, output, part_o, part_lse, counters,
        k_scale, v_scale, float(sm_scale), topk, seq_lens.shape[0], decode_query_len, triton.cdiv(topk, num_splits),
        q.stride(0), q.stride(1), *topk_idx.stride(), *block_table.stride(), output.stride(0), output.stride(1),
        *(k_scale.stride() if pth else (0, 0)), *(v_scale.stride() if pth else (0, 0)),
        GQA=gqa, HEAD_DIM=d, PAGE=PAGE, TOPK_P2=triton.next_power_of_2(topk), NUM_SPLITS=num_splits,
        SPLITS_P2=triton.next_power_of_2(num_splits), STAGES=stages, CONVERT_ROWS=convert_rows,
        SHARE_F16=share_f16, ASYNC=async_qk, K_IN_REGS=k_in_regs, PTH=pth, NUM_WARPS=num_warps, num_warps=num_warps)
    return output
