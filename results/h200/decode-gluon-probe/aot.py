"""Compile the probe's Gluon decode kernel for sm90 on the CPU: errors, PTX figures, registers, shared memory."""
import os
import re
import sys
import torch
import triton
from triton._C.libtriton import native_specialize_impl as specialize
from triton.backends.nvidia.compiler import CUDABackend
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
sys.path.insert(0, ".")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # decode_gl.py beside this file
from codegen.static.compile import _cuobjdump_usage
import decode_gl as m


def compile_one(num_splits=1, stages=2, convert_rows=32, share_f16=True, num_warps=4, async_qk=False, k_in_regs=False, pth=False):
    fn = m._decode_gl_kernel
    cache = torch.empty(4, 4, 128, 256, dtype=torch.float8_e4m3fn).permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
    cache = torch.empty(4, 128, 4, 256, dtype=torch.float8_e4m3fn).permute(0, 2, 1, 3)
    ptr = lambda dt: torch.empty(16, dtype=dt)
    vals = dict(q_ptr=ptr(torch.bfloat16), kv_desc=m.kv_descriptor(cache), topk_ptr=ptr(torch.int32),
                block_table_ptr=ptr(torch.int32), seq_lens_ptr=ptr(torch.int32), out_ptr=ptr(torch.bfloat16),
                part_o_ptr=ptr(torch.float16), part_lse_ptr=ptr(torch.float32), counter_ptr=ptr(torch.int32),
                k_scale_ptr=ptr(torch.float32), v_scale_ptr=ptr(torch.float32), sm_scale=0.088, topk=16, num_reqs=7,
                decode_query_len=1, blocks_per_split=16 // num_splits,
                stride_q_t=64 * 128, stride_q_h=128, stride_tk_h=7 * 16, stride_tk_t=16, stride_tk_k=1,
                stride_bt_r=37, stride_bt_b=1, stride_o_t=64 * 128, stride_o_h=128, stride_ks_h=4096, stride_ks_t=1, stride_vs_h=4096, stride_vs_t=1)
    consts = dict(GQA=16, HEAD_DIM=128, PAGE=128, TOPK_P2=16, NUM_SPLITS=num_splits,
                  SPLITS_P2=triton.next_power_of_2(num_splits), STAGES=stages, CONVERT_ROWS=convert_rows,
                  SHARE_F16=share_f16, ASYNC=async_qk, K_IN_REGS=k_in_regs, PTH=pth, NUM_WARPS=num_warps)
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            sig[name] = "constexpr"
            continue
        kind, desc = specialize(CUDABackend, vals[name], False, True, True)
        sig[name] = kind
        if kind == "constexpr":
            consts[name] = desc
        elif isinstance(desc, str):
            attrs[(i,)] = CUDABackend.parse_attr(desc)
    src = GluonASTSource(fn, sig, consts, attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps))
    ptx = ck.asm["ptx"]
    usage = _cuobjdump_usage(ck.asm["cubin"], ck.metadata.name)
    return dict(shared=ck.metadata.shared, regs=usage.get("REG"), stack=usage.get("STACK"), local=usage.get("LOCAL"),
                wgmma=ptx.count("wgmma.mma_async"), tma=ptx.count("cp.async.bulk.tensor"),
                barriers=len(re.findall(r"bar\.sync|barrier\.sync", ptx))), ck


if __name__ == "__main__":
    import json
    for kw in [dict(), dict(num_splits=4), dict(share_f16=False)]:
        fig, ck = compile_one(**kw)
        print(kw, json.dumps(fig))
    open("/tmp/decode_gl.ptx", "w").write(ck.asm["ptx"])
    open("/tmp/decode_gl.ttgir", "w").write(ck.asm["ttgir"])
