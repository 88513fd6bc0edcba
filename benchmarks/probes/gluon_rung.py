"""Can a hand-pipelined Gluon kernel keep the PV MMA in flight with fp8 K/V upcast in registers? (H200)

The `fp8` rung of tile_ladder.py (dense causal attention, B=4, H=64, N=2048, head_dim 128, q bf16,
K/V fp8 e4m3 converted to fp16 in registers) loses to its `dense` rung partly because Triton waits on
every PV MMA once V passes through registers. This probe writes that kernel in Gluon (Triton 3.6,
sm90), where the pipeline is explicit, and times it the way tile_ladder times its rungs:
  - K/V fp8 tiles arrive by TMA into a ring of NS stages (one mbarrier per tile), issued NS steps
    ahead; the diagonal (masked) key blocks are processed first, then blocks 0 .. n_full-1 unmasked;
  - each step upcasts K(j) and V(j) fp8 -> fp16 in registers (cvt.rn.f16x2.e4m3x2) into
    double-buffered fp16 NVMMA shared tiles (fence_async_shared + thread_barrier before a wgmma
    reads them); q is upcast once and stays in shared memory as QK's A operand;
  - PV(j-1) stays in flight while the K(j) mbarrier is waited for, K(j) (and with V_EARLY=1 also
    V(j)) is upcast and QK(j) is issued (with V_EARLY=0, V(j) is upcast while QK(j) and PV(j-1)
    both run). One warpgroup_mma_wait(0) then retires both: wgmma groups retire in issue order,
    so QK(j), issued after PV(j-1), cannot be waited for alone (num_outstanding=1 never applies);
  - online softmax in base 2 (scale folded into exp2), fp32 accumulator, out = acc / l stored by TMA.

Warp-specialized variant (_attn_fwd_ws, configs with ws=1): does taking the upcast off the MMA warps close
the gap to the bf16 dense rate? gl.warp_specialize splits the CTA into
  - a producer partition (4 warps, setmaxnreg to `producer_regs`): TMA K/V fp8 into the NS-stage ring
    (kbar/vbar, expect-tx), upcast into an NC-stage fp16 ring; per step j, stage c = j % NC:
    wait empty[c] (parity ((j // NC) & 1) ^ 1: a fresh mbarrier passes parity 1 at once), upcast,
    fence_async_shared, partition bar.sync, one-thread arrive on ready[c]; K first (kready) so QK can start,
    then V (vready); then the fp8 stage is refilled for step j + NS;
  - the default partition (`warps` warps, 4 or 8, the rest of the registers): waits kready[c] (parity
    (j // NC) & 1), QK(j), one warpgroup_mma_wait(0) that retires QK(j) and PV(j-1), bar.sync over the
    partition (each warpgroup waits only for its own wgmmas), then arrives kempty[c] and vempty[(j-1) % NC];
    softmax; waits vready[c]; PV(j) left in flight. All mbarriers have count 1: Gluon's mbarrier.arrive is
    thread 0 of the partition (PTX: `@(tid % 128 == 0)` in the producer).

  python benchmarks/probes/gluon_rung.py --aot [--out DIR]   # sm90 compile here: registers, spills, smem
  python benchmarks/probes/gluon_rung.py --time --out DIR    # on an H200: rel L2 vs SDPA and timings
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: E402
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_init, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

from codegen.generated.sm90_prefill_ws_scalar import _alloc_rings as alloc_rings  # noqa: E402  (the product's rings)

B, H, N, D = 4, 64, 2048, 128
# (BM, BN, num_warps, num_stages = TMA ring depth, cvt_rows = rows upcast per chunk, v_early)
CONFIGS = [(128, 64, 4, 2, 16, 1), (128, 64, 4, 2, 64, 1), (128, 128, 8, 2, 128, 0), (128, 128, 8, 2, 128, 1),
           (128, 64, 8, 2, 64, 0), (128, 64, 8, 2, 64, 1), (128, 64, 8, 3, 64, 0)]
# warp-specialized (_attn_fwd_ws): (..., cvt_rows, v_early (unused), ws=1, n_cvt = fp16 ring stages, producer regs);
# warps counts the consumer (default) partition, the 4 producer warps come on top
WS_CONFIGS = [(128, 128, 8, 2, 32, 0, 1, 2, 56), (128, 128, 8, 2, 128, 0, 1, 2, 88), (128, 64, 8, 3, 32, 0, 1, 3, 56),
              (128, 64, 8, 2, 64, 0, 1, 2, 56), (64, 64, 4, 3, 32, 0, 1, 3, 56), (128, 64, 4, 3, 32, 0, 1, 3, 56)]
CONFIGS += WS_CONFIGS


@gluon.jit
def _issue_kv(k_desc, v_desc, k8, v8, kbar, vbar, row0, j, n_steps, n_full, NDIAG: gl.constexpr, BN: gl.constexpr,
              NS: gl.constexpr):
    """TMA loads of step j's fp8 K and V tiles into ring stage j % NS (skipped past the last step)."""
    s = j % NS
    pred = j < n_steps
    kb = gl.where(j < NDIAG, j + n_full, j - NDIAG)  # diagonal key blocks first, then 0 .. n_full - 1
    nbytes: gl.constexpr = k_desc.block_type.nbytes
    mbarrier.expect(kbar.index(s), nbytes, pred)  # both expects first: one compiler barrier before the copies
    mbarrier.expect(vbar.index(s), nbytes, pred)
    tma.async_copy_global_to_shared(k_desc, [row0 + kb * BN, 0], kbar.index(s), k8.index(s), pred)
    tma.async_copy_global_to_shared(v_desc, [row0 + kb * BN, 0], vbar.index(s), v8.index(s), pred)


@gluon.jit
def _upcast(src, dst, BN: gl.constexpr, CR: gl.constexpr, cvt_layout: gl.constexpr):
    """fp8 shared tile -> registers -> fp16 shared tile, CR rows at a time. Fewer live registers, but
    the compiler's barrier pass puts a bar.sync between the chunks (it sees a write-after-write)."""
    for c in gl.static_range(BN // CR):
        dst.slice(c * CR, CR).store(src.slice(c * CR, CR).load(cvt_layout).to(gl.float16))


@gluon.jit
def _online_softmax(qk, m_i, l_i, acc, qk_scale, o_layout: gl.constexpr):
    """One step's base-2 online softmax: the rescaled accumulator, the new row maxima and sums, and P as the
    fp16 A operand of PV. The diagonal (masked) steps come first, so every row's maximum is finite."""
    m_new = gl.maximum(m_i, gl.max(qk, 1) * qk_scale)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(qk * qk_scale - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, 1)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    p16 = gl.convert_layout(p.to(gl.float16), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
    return acc, m_new, l_i, p16


@gluon.jit
def _step(j, acc, m_i, l_i, q_s, k8, v8, k16, v16, kbar, vbar, k_desc, v_desc, row0, n_steps, n_full, qk_scale,
          MASKED: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, NS: gl.constexpr, CR: gl.constexpr,
          V_EARLY: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr, cvt_layout: gl.constexpr):
    s = j % NS
    phase = (j // NS) & 1
    b = j % 2
    # K(j): wait for its TMA, upcast in registers, store to fp16 buffer b (last read by QK(j-2), retired).
    # V(j) likewise (v16[b] was last read by PV(j-2), retired last step): before QK(j) is issued when
    # V_EARLY (fewer live registers: only PV(j-1) in flight), else while QK(j) and PV(j-1) both run.
    mbarrier.wait(kbar.index(s), phase)
    _upcast(k8.index(s), k16.index(b), BN, CR, cvt_layout)
    if V_EARLY:
        mbarrier.wait(vbar.index(s), phase)
        _upcast(v8.index(s), v16.index(b), BN, CR, cvt_layout)
    fence_async_shared()
    gl.thread_barrier()  # every warp's part of K(j) is written before any warpgroup's QK reads it
    qk = warpgroup_mma(q_s, k16.index(b).permute((1, 0)), gl.zeros([BM, BN], gl.float32, s_layout),
                       use_acc=False, is_async=True)
    if not V_EARLY:
        mbarrier.wait(vbar.index(s), phase)
        _upcast(v8.index(s), v16.index(b), BN, CR, cvt_layout)
        fence_async_shared()
    qk, acc = warpgroup_mma_wait(0, deps=[qk, acc])  # retires PV(j-1) and QK(j)
    gl.thread_barrier()  # V(j) fully written; every warp done reading fp8 stage s
    _issue_kv(k_desc, v_desc, k8, v8, kbar, vbar, row0, j + NS, n_steps, n_full, BM // BN, BN, NS)
    if MASKED:  # diagonal step j < BM // BN: keys q_lo + j*BN + [0, BN) against queries q_lo + [0, BM)
        offs_m = gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
        offs_n = j * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
        qk = gl.where(offs_m[:, None] >= offs_n[None, :], qk, float("-inf"))
    acc, m_new, l_i, p16 = _online_softmax(qk, m_i, l_i, acc, qk_scale, o_layout)
    acc = warpgroup_mma(p16, v16.index(b), acc, is_async=True)  # PV(j): left in flight
    return acc, m_new, l_i


@gluon.jit
def _store_out(acc, l_i, q_s, o_desc, N, BM: gl.constexpr, D: gl.constexpr, o_layout: gl.constexpr):
    """Epilogue through shared memory and a TMA store; q's buffer is free (every QK retired before the
    last step's thread_barrier) and has the bf16 tile's size and swizzle."""
    o = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
    o_s = q_s._reinterpret(gl.bfloat16, [BM, D], o_desc.layout)
    o_s.store(o.to(gl.bfloat16))
    fence_async_shared()
    gl.thread_barrier()
    # block ids re-read here (an impure asm is not CSE'd), so no row offset stays live across the loops:
    # that spilled a register at 4 warps
    ids = gl.inline_asm_elementwise("mov.u32 $0, %ctaid.x; mov.u32 $1, %ctaid.y;", "=r,=r,r", [gl.to_tensor(0)],
                                    dtype=(gl.int32, gl.int32), is_pure=False, pack=1)
    tma.async_copy_shared_to_global(o_desc, [(ids[1] * N + ids[0] * BM), 0], o_s)
    tma.store_wait(0)


@gluon.jit
def _attn_fwd(q_ptr, k_desc, v_desc, o_desc, sm_scale, N, BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr,
              NS: gl.constexpr, NUM_WARPS: gl.constexpr, CR: gl.constexpr,
              V_EARLY: gl.constexpr):
    gl.static_assert(BM % BN == 0)
    gl.static_assert(BN % CR == 0)
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                       instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                       instr_shape=[16, D, 16])
    cvt_layout: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [NUM_WARPS, 1], [1, 0])
    q_ld_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [NUM_WARPS, 1], [1, 0])
    f16_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D], gl.float16)
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, D], gl.float16)

    pid = gl.program_id(0)
    bh = gl.program_id(1)
    row0 = bh * N
    q_lo = pid * BM

    k8 = gl.allocate_shared_memory(k_desc.dtype, [NS, BN, D], k_desc.layout)
    v8 = gl.allocate_shared_memory(v_desc.dtype, [NS, BN, D], v_desc.layout)
    k16 = gl.allocate_shared_memory(gl.float16, [2, BN, D], f16_layout)
    v16 = gl.allocate_shared_memory(gl.float16, [2, BN, D], f16_layout)
    kbar = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    vbar = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NS):
        mbarrier.init(kbar.index(i), count=1)
        mbarrier.init(vbar.index(i), count=1)
    fence_async_shared()  # barrier inits visible to the TMA unit

    n_full = q_lo // BN  # steps entirely below the diagonal: no mask
    n_steps = (q_lo + BM) // BN
    for i in gl.static_range(NS):
        _issue_kv(k_desc, v_desc, k8, v8, kbar, vbar, row0, i, n_steps, n_full, BM // BN, BN, NS)

    # q: bf16 -> fp16 once, kept in shared memory as the A operand of every QK.
    offs_qm = gl.arange(0, BM, layout=gl.SliceLayout(1, q_ld_layout))
    offs_qd = gl.arange(0, D, layout=gl.SliceLayout(0, q_ld_layout))
    q = gl.load(q_ptr + (row0 + q_lo + offs_qm)[:, None] * D + offs_qd[None, :])
    q_s = gl.allocate_shared_memory(gl.float16, [BM, D], q_layout, q.to(gl.float16))
    fence_async_shared()
    gl.thread_barrier()

    qk_scale = sm_scale * 1.4426950408889634
    m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, s_layout))
    acc = warpgroup_mma_init(gl.zeros([BM, D], gl.float32, o_layout))
    # Two loops (a runtime `if` on the mask, or unrolled diagonal steps, make ptxas serialize the wgmmas).
    # Diagonal first: every row sees key q_lo in step 0, so m_i is finite before any fully masked row.
    for j in range(0, BM // BN):
        acc, m_i, l_i = _step(j, acc, m_i, l_i, q_s, k8, v8, k16, v16, kbar, vbar, k_desc, v_desc, row0, n_steps,
                              n_full, qk_scale, True, BM, BN, D, NS, CR, V_EARLY, s_layout, o_layout, cvt_layout)
    for j in range(BM // BN, n_steps):
        acc, m_i, l_i = _step(j, acc, m_i, l_i, q_s, k8, v8, k16, v16, kbar, vbar, k_desc, v_desc, row0, n_steps,
                              n_full, qk_scale, False, BM, BN, D, NS, CR, V_EARLY, s_layout, o_layout, cvt_layout)
    acc = warpgroup_mma_wait(0, deps=[acc])
    for i in gl.static_range(NS):
        mbarrier.invalidate(kbar.index(i))
        mbarrier.invalidate(vbar.index(i))

    _store_out(acc, l_i, q_s, o_desc, N, BM, D, o_layout)


@gluon.jit
def _ws_producer(k_desc, v_desc, k8, v8, k16, v16, bars, row0, n_steps, n_full, BM: gl.constexpr, BN: gl.constexpr,
                 NS: gl.constexpr, NC: gl.constexpr, CR: gl.constexpr, cvt_layout: gl.constexpr):
    """Worker partition (4 warps): TMA K/V fp8 into ring stage s = j % NS, upcast into fp16 stage c = j % NC.
    ready[c] is arrived once per use (count 1, phase (j // NC) & 1 for the consumer); empty[c] likewise by the
    consumer, so the producer's n-th pass through c waits parity (n & 1) ^ 1 (a fresh barrier passes parity 1)."""
    kbar, vbar, kready, vready, kempty, vempty = bars
    for i in gl.static_range(NS):
        _issue_kv(k_desc, v_desc, k8, v8, kbar, vbar, row0, i, n_steps, n_full, BM // BN, BN, NS)
    for j in range(n_steps):
        s = j % NS
        c = j % NC
        ph = (j // NS) & 1
        pe = ((j // NC) & 1) ^ 1
        mbarrier.wait(kbar.index(s), ph)
        mbarrier.wait(kempty.index(c), pe)  # QK(j - NC) retired
        _upcast(k8.index(s), k16.index(c), BN, CR, cvt_layout)
        fence_async_shared()  # generic-proxy stores before the consumer's wgmma (async proxy) reads
        gl.thread_barrier()  # all 4 producer warps' stores done before the single-thread arrive
        mbarrier.arrive(kready.index(c))
        mbarrier.wait(vbar.index(s), ph)
        mbarrier.wait(vempty.index(c), pe)  # PV(j - NC) retired
        _upcast(v8.index(s), v16.index(c), BN, CR, cvt_layout)
        fence_async_shared()  # also orders this stage's fp8 reads before the TMA below overwrites it
        gl.thread_barrier()
        mbarrier.arrive(vready.index(c))
        _issue_kv(k_desc, v_desc, k8, v8, kbar, vbar, row0, j + NS, n_steps, n_full, BM // BN, BN, NS)


@gluon.jit
def _ws_step(j, acc, m_i, l_i, q_s, k16, v16, bars, qk_scale, MASKED: gl.constexpr, BM: gl.constexpr,
             BN: gl.constexpr, NC: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr):
    kbar, vbar, kready, vready, kempty, vempty = bars
    c = j % NC
    ph = (j // NC) & 1
    mbarrier.wait(kready.index(c), ph)
    qk = warpgroup_mma(q_s, k16.index(c).permute((1, 0)), gl.zeros([BM, BN], gl.float32, s_layout),
                       use_acc=False, is_async=True)
    qk, acc = warpgroup_mma_wait(0, deps=[qk, acc])  # retires PV(j-1) and QK(j)
    gl.thread_barrier()  # every consumer warpgroup's wgmmas retired before the single-thread arrives
    mbarrier.arrive(kempty.index(c))
    mbarrier.arrive(vempty.index((j + NC - 1) % NC), pred=j > 0)  # V(j-1)'s stage
    if MASKED:
        offs_m = gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
        offs_n = j * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
        qk = gl.where(offs_m[:, None] >= offs_n[None, :], qk, float("-inf"))
    acc, m_new, l_i, p16 = _online_softmax(qk, m_i, l_i, acc, qk_scale, o_layout)
    mbarrier.wait(vready.index(c), ph)
    acc = warpgroup_mma(p16, v16.index(c), acc, is_async=True)  # PV(j): left in flight
    return acc, m_new, l_i


@gluon.jit
def _ws_consumer(q_s, k16, v16, bars, o_desc, n_steps, N, qk_scale, BM: gl.constexpr, BN: gl.constexpr,
                 D: gl.constexpr, NC: gl.constexpr, NUM_WARPS: gl.constexpr):
    """Default partition (NUM_WARPS warps): QK, softmax, PV and the epilogue; no conversion."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                       instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                       instr_shape=[16, D, 16])
    m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, s_layout))
    acc = warpgroup_mma_init(gl.zeros([BM, D], gl.float32, o_layout))
    for j in range(0, BM // BN):
        acc, m_i, l_i = _ws_step(j, acc, m_i, l_i, q_s, k16, v16, bars, qk_scale, True, BM, BN, NC, s_layout, o_layout)
    for j in range(BM // BN, n_steps):
        acc, m_i, l_i = _ws_step(j, acc, m_i, l_i, q_s, k16, v16, bars, qk_scale, False, BM, BN, NC, s_layout,
                                 o_layout)
    acc = warpgroup_mma_wait(0, deps=[acc])
    _store_out(acc, l_i, q_s, o_desc, N, BM, D, o_layout)


@gluon.jit
def _attn_fwd_ws(q_ptr, k_desc, v_desc, o_desc, sm_scale, N, BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr,
                 NS: gl.constexpr, NUM_WARPS: gl.constexpr, CR: gl.constexpr, NC: gl.constexpr,
                 PRODUCER_REGS: gl.constexpr):
    """Warp-specialized variant: a 4-warp producer partition owns TMA and the fp8 -> fp16 upcast into an
    NC-stage fp16 ring; the NUM_WARPS default partition only waits, multiplies and does the softmax."""
    gl.static_assert(BM % BN == 0)
    gl.static_assert(BN % CR == 0)
    gl.static_assert(NC >= 2)
    cvt_layout: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])  # producer: 4 warps
    q_ld_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [NUM_WARPS, 1], [1, 0])
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, D], gl.float16)

    pid = gl.program_id(0)
    bh = gl.program_id(1)
    row0 = bh * N
    q_lo = pid * BM

    k8, v8, k16, v16, bars = alloc_rings(BN, D, NS, NC)

    offs_qm = gl.arange(0, BM, layout=gl.SliceLayout(1, q_ld_layout))
    offs_qd = gl.arange(0, D, layout=gl.SliceLayout(0, q_ld_layout))
    q = gl.load(q_ptr + (row0 + q_lo + offs_qm)[:, None] * D + offs_qd[None, :])
    q_s = gl.allocate_shared_memory(gl.float16, [BM, D], q_layout, q.to(gl.float16))
    fence_async_shared()  # barrier inits and q visible to the TMA unit / wgmma
    gl.thread_barrier()

    n_full = q_lo // BN
    n_steps = (q_lo + BM) // BN
    qk_scale = sm_scale * 1.4426950408889634
    gl.warp_specialize([
        (_ws_consumer, (q_s, k16, v16, bars, o_desc, n_steps, N, qk_scale, BM, BN, D, NC, NUM_WARPS)),
        (_ws_producer, (k_desc, v_desc, k8, v8, k16, v16, bars, row0, n_steps, n_full, BM, BN, NS, NC, CR,
                        cvt_layout)),
    ], [4], [PRODUCER_REGS])


def _fp8_desc(t, BN):
    layout = gl.NVMMASharedLayout.get_default_for([BN, D], gl.float8e4nv)
    return TensorDescriptor.from_tensor(t, [BN, D], layout)


def _out_desc(t, BM):
    return TensorDescriptor.from_tensor(t, [BM, D], gl.NVMMASharedLayout.get_default_for([BM, D], gl.bfloat16))


def _extra(BN, num_warps, cvt_rows, v_early, ws=0, n_cvt=2, producer_regs=56):
    """Constexprs beyond the shape. Non-WS defaults: the whole tile in one chunk; V upcast before QK at 4 warps
    (register pressure). WS (ws=1): n_cvt fp16 ring stages, producer_regs registers for the 4 producer warps."""
    if ws:
        return dict(CR=min(BN, cvt_rows or BN), NC=n_cvt, PRODUCER_REGS=producer_regs)
    return dict(CR=min(BN, cvt_rows or BN), V_EARLY=int(num_warps == 4 if v_early is None else v_early))


def _kernel(ws):
    return _attn_fwd_ws if ws else _attn_fwd


def _maxnreg(num_warps, ws, producer_regs=56):
    """WS: Triton's warp-group allocation gives the default partition 64K registers minus the producer's,
    spread over its warps, uncapped; at 4 consumer warps that exceeds setmaxnreg's 256, so cap it here:
    maxnreg * (num_warps + 4) * 32 = (256 * num_warps + producer_regs * 4) * 32."""
    if not ws or num_warps != 4:
        return None
    return (256 + producer_regs) // 2 // 8 * 8


def run(q, k, v, out, BM, BN, num_warps, num_stages, cvt_rows=None, v_early=None, ws=0, n_cvt=2, producer_regs=56,
        n=N):
    """out = causal softmax(q k^T / sqrt(D)) v over rows laid out [(b*H + h)*n + i, D]."""
    grid = (n // BM, q.shape[0] // n)
    opts = dict(num_warps=num_warps)
    if _maxnreg(num_warps, ws, producer_regs):
        opts["maxnreg"] = _maxnreg(num_warps, ws, producer_regs)
    _kernel(ws)[grid](q, _fp8_desc(k, BN), _fp8_desc(v, BN), _out_desc(out, BM), D ** -0.5, n, BM=BM, BN=BN, D=D,
                      NS=num_stages, NUM_WARPS=num_warps,
                      **_extra(BN, num_warps, cvt_rows, v_early, ws, n_cvt, producer_regs), **opts)
    return out


def compile_gluon_sm90(fn, sample, constexprs, options):
    """Ahead-of-time sm90 compile of the Gluon kernel `fn` (no GPU needed): non-constexpr arguments are
    specialized as the JIT would on `sample` (their values by name); returns (compiled, ptxas log)."""
    from triton import knobs
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.experimental.gluon._runtime import GluonASTSource

    signature, attrs = {}, {}
    for index, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
            continue
        kind, desc = native_specialize_impl(CUDABackend, sample[name], False, True, True)
        signature[name] = kind
        if isinstance(desc, str):
            attrs[(index,)] = CUDABackend.parse_attr(desc)
    src = GluonASTSource(fn, signature, constexprs, attrs)
    log = io.StringIO()
    with knobs.compilation.scope(), knobs.nvidia.scope(), contextlib.redirect_stdout(log):
        knobs.compilation.always_compile = True
        knobs.nvidia.dump_ptxas_log = True
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    return compiled, log.getvalue()


def compile_sm90(BM, BN, num_warps, num_stages, cvt_rows=None, v_early=None, ws=0, n_cvt=2, producer_regs=56):
    """Ahead-of-time sm90 compile (no GPU needed); returns (compiled, ptxas log)."""
    sample = dict(q_ptr=torch.empty(16, dtype=torch.bfloat16),
                  k_desc=_fp8_desc(torch.empty(4 * BN, D, dtype=torch.float8_e4m3fn), BN),
                  v_desc=_fp8_desc(torch.empty(4 * BN, D, dtype=torch.float8_e4m3fn), BN),
                  o_desc=_out_desc(torch.empty(4 * BM, D, dtype=torch.bfloat16), BM), sm_scale=D ** -0.5, N=N)
    constexprs = dict(BM=BM, BN=BN, D=D, NS=num_stages, NUM_WARPS=num_warps,
                      **_extra(BN, num_warps, cvt_rows, v_early, ws, n_cvt, producer_regs))
    fn = _kernel(ws)
    options = dict(num_warps=num_warps, num_stages=num_stages)
    if _maxnreg(num_warps, ws, producer_regs):
        options["maxnreg"] = _maxnreg(num_warps, ws, producer_regs)
    return compile_gluon_sm90(fn, sample, constexprs, options)


def _label(c):
    """(BM, BN, warps, stages[, cvt_rows[, v_early[, ws, n_cvt, producer_regs]]]) -> its row label, with the
    defaults filled in."""
    ex = _extra(c[1], c[2], *(list(c[4:]) + [None, None])[:2], *c[6:])
    if len(c) > 6 and c[6]:
        return f"bm{c[0]} bn{c[1]} w{c[2]}+4 st{c[3]} cr{ex['CR']} ws nc{ex['NC']} pr{ex['PRODUCER_REGS']}"
    return f"bm{c[0]} bn{c[1]} w{c[2]} st{c[3]} cr{ex['CR']} ve{ex['V_EARLY']}"


def aot(configs=CONFIGS):
    from codegen.static.compile import _sm90_figures
    rows = []
    for c in configs:
        cfg = _label(c)
        try:
            compiled, log = compile_sm90(*c)
        except Exception as exc:  # report and go on
            rows.append(dict(config=cfg, error=f"{type(exc).__name__}: {str(exc)[-1500:]}"))
            print(rows[-1], flush=True)
            continue
        fig = _sm90_figures(compiled, log)
        ptx = compiled.asm["ptx"]
        rows.append(dict(config=cfg, registers=fig["registers"], spill_bytes=fig["spill"],
                         shared_bytes=fig["shared_bytes"], wgmma=ptx.count("wgmma.mma_async"),
                         wgmma_wait=sorted(set(ln.strip() for ln in ptx.splitlines() if "wgmma.wait_group" in ln)),
                         cvt_e4m3=ptx.count("cvt.rn.f16x2.e4m3x2"), bar_sync=ptx.count("bar.sync"),
                         setmaxnreg=sorted(set(re.findall(r"setmaxnreg\.(\w+)\.sync\.aligned\.u32\s+(\d+)", ptx))),
                         notes=fig["notes"]))
        print(rows[-1], flush=True)
    return rows


def _rel_l2(o, q, k, v, bs, hs):
    """Relative L2 error of o against float32 causal SDPA on batches bs, heads hs."""
    def view(t):
        return t.view(B, H, N, D)[bs, hs].float()
    ref = torch.nn.functional.scaled_dot_product_attention(view(q), view(k), view(v), is_causal=True)
    return ((view(o) - ref).norm() / ref.norm()).item()


def time_configs(configs=CONFIGS):
    from codegen.timing import graph_time, matmul_flops
    peak = matmul_flops()
    flops = 4 * B * H * D * (N * (N + 1) // 2)  # causal: QK and PV over the visible keys
    print(f"bf16 matmul: {peak / 1e12:.0f} TFLOP/s; torch {torch.__version__}, triton {triton.__version__}", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    sets = []
    for _ in range(4):
        q = torch.randn(B * H * N, D, device="cuda", generator=gen).to(torch.bfloat16)
        k = torch.randn(B * H * N, D, device="cuda", generator=gen).to(torch.float8_e4m3fn)
        v = torch.randn(B * H * N, D, device="cuda", generator=gen).to(torch.float8_e4m3fn)
        sets.append((q, k, v, torch.full_like(q, float("nan"))))
    rows = []
    for c in configs:
        cfg = _label(c)
        try:
            q, k, v, o = sets[0]
            o.fill_(float("nan"))
            run(q, k, v, o, *c)
            torch.cuda.synchronize()
            err = _rel_l2(o, q, k, v, slice(0, 1), slice(0, 4))
            err_last = _rel_l2(o, q, k, v, slice(B - 1, B), slice(H - 1, H))  # last programs' row offsets
            calls = [lambda s=s, c=c: run(*s, *c) for s in sets]
            t = graph_time(calls * 3, replays=10)
        except Exception as exc:  # a config that does not compile or run is reported, not fatal
            rows.append(dict(kernel="gluon_fp8", config=cfg, error=str(exc)[:300]))
            print(rows[-1], flush=True)
            continue
        rows.append(dict(kernel="gluon_fp8", config=cfg, us=round(t.median_us, 1),
                         tflops=round(flops / t.median_us / 1e6, 1), share=round(flops / t.median_us * 1e6 / peak, 3),
                         rel_l2=float(f"{err:.2e}"), rel_l2_last_head=float(f"{err_last:.2e}")))
        print(rows[-1], flush=True)
    return dict(peak_tflops=round(peak / 1e12, 1), torch=torch.__version__, triton=triton.__version__,
                device=torch.cuda.get_device_name(), rows=rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--aot", action="store_true", help="compile for sm90 here and print registers/spills")
    parser.add_argument("--time", action="store_true", help="check and time on the GPU")
    parser.add_argument("--out", type=pathlib.Path, help="directory for gluon_rung.json")
    parser.add_argument("--configs", type=str, default=None,
                        help="JSON list of [BM, BN, warps, stages(, cvt_rows, v_early(, ws, n_cvt, producer_regs))]")
    args = parser.parse_args()
    configs = [tuple(c) for c in json.loads(args.configs)] if args.configs else CONFIGS
    result = {}
    if args.aot:
        result["aot"] = aot(configs)
    if args.time:
        result.update(time_configs(configs))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gluon_rung.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
