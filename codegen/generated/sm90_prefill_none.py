# GENERATED FILE - DO NOT EDIT. Regenerate with `python -m codegen render`.
# template: templates/prefill.py.jinja (with templates/_attend.jinja)
# variant: sm90_prefill_none (arch=sm90, kernel=prefill, scale_mode=none)
# inputs-sha256: 77576956d3486ca0f0b91383bfd6e1c61818b9adf032777e577cd22e5f8a29c4
"""MSA sparse-attention prefill, sm90, KV scale mode `none`.

One program = one query token x one KV head: its GQA query heads are the rows of the tile and it
walks the token's own top-k selected pages, BLOCK_N keys at a time, with an online softmax.
"""
import torch
import triton
import triton.language as tl

ARCH = "sm90"
SCALE_MODE = "none"
PAGE = 128


@triton.jit
def _msa_prefill_kernel(
    # tensors
    q_ptr, kv_ptr, topk_ptr, block_table_ptr, cu_seqlens_q_ptr, seq_lens_ptr, prefix_lens_ptr,
    out_ptr,
    # scalars
    sm_scale, topk,
    # strides
    stride_q_t, stride_q_h, stride_q_d,
    stride_kv_b, stride_kv_h, stride_kv_t, stride_kv_d,
    stride_tk_h, stride_tk_t, stride_tk_k,
    stride_bt_r, stride_bt_b,
    stride_o_t, stride_o_h, stride_o_d,
    # shapes and launch parameters
    GQA: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, TOPK_P2: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    SUBTILES: tl.constexpr = PAGE // BLOCK_N
    i = tl.program_id(0)  # query index inside its request
    req = tl.program_id(1)
    g = tl.program_id(2)  # KV head
    q_start = tl.load(cu_seqlens_q_ptr + req)
    q_len = tl.load(cu_seqlens_q_ptr + req + 1) - q_start
    if i >= q_len:  # the grid covers max_query_len; shorter requests end here
        return
    t = (q_start + i).to(tl.int64)
    q_pos = tl.load(prefix_lens_ptr + req) + i
    kv_end = tl.minimum(q_pos + 1, tl.load(seq_lens_ptr + req))  # causal and in-sequence
    block_table_row_ptr = block_table_ptr + req.to(tl.int64) * stride_bt_r

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    heads = g * GQA + offs_m
    row_ok = offs_m < GQA
    q = tl.load(
        q_ptr + t * stride_q_t + heads[:, None] * stride_q_h + offs_d[None, :] * stride_q_d,
        mask=row_ok[:, None],
        other=0.0,
    )
    qk_scale = sm_scale * 1.4426950408889634  # base-2 softmax: exp2(x * log2 e) == exp(x)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    kv_head_ptr = kv_ptr + g * stride_kv_h
    topk_row_ptr = topk_ptr + g * stride_tk_h + t * stride_tk_t

    offs_k = tl.arange(0, TOPK_P2)
    sel = tl.load(topk_row_ptr + offs_k * stride_tk_k, mask=offs_k < topk, other=-1)
    n_sel = tl.sum((sel >= 0).to(tl.int32), axis=0)

    for it in range(0, n_sel * SUBTILES):
        blk = tl.load(topk_row_ptr + (it // SUBTILES) * stride_tk_k)
        slot = (it % SUBTILES) * BLOCK_N + offs_n  # offset inside the page
        # Visible slots of this page: those before kv_end; none for a -1 pad. (One vector compare:
        # a scalar & vector mask trips the triton 3.9 interpreter.)
        n_visible = tl.where(blk >= 0, kv_end - blk * PAGE, 0)
        page = tl.load(block_table_row_ptr + blk * stride_bt_b, mask=n_visible > 0, other=0).to(tl.int64)
        visible = slot < n_visible
        slot_ptr = kv_head_ptr + page * stride_kv_b + slot * stride_kv_t
        # K as a [HEAD_DIM, BLOCK_N] tile: only upcast, never scaled element-wise.
        k = tl.load(slot_ptr[None, :] + offs_d[:, None] * stride_kv_d, mask=visible[None, :], other=0.0)
        s = tl.dot(q, k.to(q.dtype))
        s = s * qk_scale
        s = tl.where(visible[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # A row that has seen no visible key yet keeps m == -inf; shift by 0 so exp2 gives 0, not NaN.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_shift)
        p = tl.exp2(s - m_shift[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(
            slot_ptr[:, None] + (HEAD_DIM + offs_d[None, :]) * stride_kv_d, mask=visible[:, None], other=0.0
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype))
        m_i = m_new

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc / l_safe[:, None]

    tl.store(
        out_ptr + t * stride_o_t + heads[:, None] * stride_o_h + offs_d[None, :] * stride_o_d,
        o.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )


def launch(q, kv_cache, topk_idx, block_table, cu_seqlens_q, seq_lens, prefix_lens,
           max_query_len, num_kv_heads, sm_scale, output, k_scale, v_scale, config):
    """Launches on validated arguments (codegen.api checks them)."""
    num_reqs = seq_lens.shape[0]
    gqa = q.shape[1] // num_kv_heads
    topk = topk_idx.shape[2]
    if max_query_len == 0 or num_reqs == 0:
        return output
    grid = (max_query_len, num_reqs, num_kv_heads)
    _msa_prefill_kernel[grid](
        q, kv_cache, topk_idx, block_table, cu_seqlens_q, seq_lens, prefix_lens,
        output,
        float(sm_scale), topk,
        *q.stride(), *kv_cache.stride(), *topk_idx.stride(), *block_table.stride(), *output.stride(),
        GQA=gqa, HEAD_DIM=q.shape[2], PAGE=PAGE, TOPK_P2=triton.next_power_of_2(topk),
        BLOCK_M=max(16, triton.next_power_of_2(gqa)), BLOCK_N=config.block_n,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return output

INPUTS_SHA256 = '77576956d3486ca0f0b91383bfd6e1c61818b9adf032777e577cd22e5f8a29c4'
