"""Does Triton's Hopper warp specialization (`tl.range(..., warp_specialize=True)`) apply to an
attention loop shaped like prefill's tile walk? Compiles a minimal flash-attention loop for sm90
ahead of time (no GPU), once per feature the tile walk has, and reports whether the loop was split
into partitions (`ttg.warp_specialize` in the TTGIR) or the compiler failed:

  .venv-static/bin/python benchmarks/ws_probe.py

With triton 3.6.0 (2026-12-01): the plain loop, a page taken from a register vector, an fp8 cache
and an asm conversion are specialized; a branch inside the loop is not (silently); an early return
before the loop, or a query read through pointers instead of a descriptor, fail an assertion in the
pass. The prefill kernel has all three, and its tile walk is not specialized (the FA3 schedule the
tiles would need: results/h200/prefill-lean).
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

FEATURES = ("plain", "page_from_registers", "asm_convert", "branch_in_loop", "early_return", "pointer_query")


@triton.jit
def _walk(q_desc, kv_desc, pages_ptr, q_ptr, out_ptr, n_pages, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
          D: tl.constexpr, FEATURE: tl.constexpr):
    pid = tl.program_id(0)
    if FEATURE == "early_return":
        if pid >= n_pages:
            return
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    if FEATURE == "pointer_query":
        q = tl.load(q_ptr + rows[:, None] * D + tl.arange(0, D)[None, :], mask=rows[:, None] < n_pages, other=0.0)
    else:
        q = q_desc.load([pid * BLOCK_M, 0])
    offs = tl.arange(0, 64)
    pages = tl.load(pages_ptr + offs)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for j in tl.range(0, n_pages, warp_specialize=True):
        page = j
        if FEATURE == "page_from_registers":
            page = tl.sum(tl.where(offs == j, pages, 0), axis=0)
        k = kv_desc.load([page, 0, 0, 0]).reshape(BLOCK_N, D)
        s = tl.dot(q, tl.trans(k.to(tl.float16)))
        if FEATURE == "branch_in_loop":
            if (page & 1) == 0:
                s = tl.where(tl.arange(0, BLOCK_N)[None, :] < page, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = kv_desc.load([page, 0, 0, D]).reshape(BLOCK_N, D)
        if FEATURE == "asm_convert":
            v = tl.inline_asm_elementwise(
                asm="{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
                constraints="=r,=r,r", args=[v.to(tl.uint8, bitcast=True)], dtype=tl.float16, is_pure=False, pack=4)
        acc = tl.dot(p.to(tl.float16), v.to(tl.float16), acc * alpha[:, None])
        m_i = m_new
    tl.store(out_ptr + rows[:, None] * D + tl.arange(0, D)[None, :], (acc / l_i[:, None]).to(tl.float16))


def specialized(feature: str) -> str:
    """'yes' / 'no' (the loop kept whole) / 'compiler failure'."""
    signature = {"q_desc": "tensordesc<fp16[64,128]>", "kv_desc": "tensordesc<fp8e4nv[1,1,128,128]>",
                 "pages_ptr": "*i32", "q_ptr": "*fp16", "out_ptr": "*fp16", "n_pages": "i32", "BLOCK_M": "constexpr",
                 "BLOCK_N": "constexpr", "D": "constexpr", "FEATURE": "constexpr"}
    source = ASTSource(_walk, signature, constexprs={"BLOCK_M": 64, "BLOCK_N": 128, "D": 128, "FEATURE": feature})
    try:
        kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=2))
    except Exception as exc:  # the pass asserts on some shapes; the message is in the compiler's stderr
        return f"compiler failure ({type(exc).__name__})"
    return "yes" if "ttg.warp_specialize" in kernel.asm["ttgir"] else "no"


def main() -> int:
    print(f"triton {triton.__version__}, sm90, num_warps 4: is the loop warp-specialized?")
    for feature in FEATURES:
        print(f"  {feature:22s} {specialized(feature)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
