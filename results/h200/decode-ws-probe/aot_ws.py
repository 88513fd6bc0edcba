"""Compile the WS decode probe for sm90 on the CPU: errors, registers, shared memory, wgmma/TMA counts."""
import os, re, sys, json
import torch, triton
from triton._C.libtriton import native_specialize_impl as specialize
from triton.backends.nvidia.compiler import CUDABackend
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
sys.path.insert(0, "."); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from codegen.static.compile import _cuobjdump_usage
import decode_ws as m


def compile_one(num_splits=1, ns=2, nc=2, convert_rows=32, converter_regs=120, early=False, fused=False):
    fn = m._decode_ws_kernel
    cache = torch.empty(4, 128, 4, 256, dtype=torch.float8_e4m3fn).permute(0, 2, 1, 3)
    ptr = lambda dt: torch.empty(16, dtype=dt)
    vals = dict(q_ptr=ptr(torch.bfloat16), kv_desc=m.kv_descriptor(cache), topk_ptr=ptr(torch.int32),
                block_table_ptr=ptr(torch.int32), seq_lens_ptr=ptr(torch.int32), out_ptr=ptr(torch.bfloat16),
                part_o_ptr=ptr(torch.float32), part_lse_ptr=ptr(torch.float32), counter_ptr=ptr(torch.int32),
                k_scale_ptr=ptr(torch.float32), v_scale_ptr=ptr(torch.float32), sm_scale=0.088, topk=16, num_reqs=7,
                decode_query_len=1, blocks_per_split=16 // num_splits,
                stride_q_t=64 * 128, stride_q_h=128, stride_tk_h=7 * 16, stride_tk_t=16, stride_tk_k=1,
                stride_bt_r=37, stride_bt_b=1, stride_o_t=64 * 128, stride_o_h=128)
    consts = dict(GQA=16, HEAD_DIM=128, PAGE=128, TOPK_P2=16, BM=64, NUM_SPLITS=num_splits,
                  SPLITS_P2=triton.next_power_of_2(num_splits), NS=ns, NC=nc, CONVERT_ROWS=convert_rows,
                  CONVERTER_REGS=converter_regs, EARLY=early, FUSED=fused)
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
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    ptx = ck.asm["ptx"]
    usage = _cuobjdump_usage(ck.asm["cubin"], ck.metadata.name)
    return dict(shared=ck.metadata.shared, regs=usage.get("REG"), stack=usage.get("STACK"), local=usage.get("LOCAL"),
                wgmma=ptx.count("wgmma.mma_async"), tma=ptx.count("cp.async.bulk.tensor"),
                bar=len(re.findall(r"bar\.(sync|arrive)", ptx))), ck


if __name__ == "__main__":
    for kw in [dict(), dict(num_splits=4), dict(nc=1), dict(ns=1, nc=1), dict(early=True),
               dict(num_splits=4, fused=True), dict(num_splits=4, fused=True, early=True)]:
        fig, ck = compile_one(**kw)
        print(kw, json.dumps(fig), flush=True)
