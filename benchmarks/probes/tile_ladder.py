"""Where does a prefill tile lose against dense attention? (H200)

A ladder of dense causal attention kernels (B=4, H=64, N=2048, head_dim 128: the FLOPs of the
TP1 4x2k prefill case), each one step closer to the prefill tile, timed side by side with the
prefill kernels of this tree on the 4x2k case and the bf16 matmul rate:
  - `dense`: K/V tiles straight from TMA buffers into the MMAs (Triton leaves the PV MMA of one
    step in flight while the next step's K arrives);
  - `vreg`: V through registers and back to shared memory (what the V guard and the fp8
    conversion do in the prefill tile), which makes Triton wait on every PV MMA;
  - `fp8`: an fp8 e4m3 K/V converted to fp16 in registers (the tile's `kv_upcast` 3), q in fp16.

  python benchmarks/probes/tile_ladder.py --out DIR [--configs JSON]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

# The prefill kernel's own fp8 -> fp16 conversion (kv_upcast 3), so the fp8 rung converts as it does.
from codegen.generated.sm90_prefill_scalar import _e4m3_to_fp16  # noqa: E402


@triton.jit
def _dense(q_ptr, k_desc, v_desc, o_ptr, sm_scale, N, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
           VREG: tl.constexpr, FP8: tl.constexpr):
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    offs_m = pid * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BN)
    base = bh.to(tl.int64) * N * D
    q = tl.load(q_ptr + base + offs_m[:, None] * D + offs_d[None, :])
    if FP8:
        q = q.to(tl.float16)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    for start in range(0, (pid + 1) * BM, BN):
        k = k_desc.load([bh * N + start, 0])
        if FP8:
            k = _e4m3_to_fp16(k)
        s = tl.dot(q, tl.trans(k))
        if start + BN > pid * BM:
            s = tl.where(offs_m[:, None] >= start + offs_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s * qk_scale - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = v_desc.load([bh * N + start, 0])
        if FP8:
            v = _e4m3_to_fp16(v)
        if VREG:
            v = tl.where((start + offs_n < N)[:, None], v, 0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v)
        m_i = m_new
    o = acc / l_i[:, None]
    tl.store(o_ptr + base + offs_m[:, None] * D + offs_d[None, :], o.to(o_ptr.dtype.element_ty))


def dense_rungs(flops_peak):
    from codegen.timing import graph_time
    B, H, N, D = 4, 64, 2048, 128
    flops = 4 * B * H * D * (N * (N + 1) // 2)  # causal: QK and PV over the visible keys
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    sets = []
    for _ in range(4):
        q = torch.randn(B * H * N, D, device="cuda", generator=gen).to(torch.bfloat16)
        k = torch.randn(B * H * N, D, device="cuda", generator=gen)
        v = torch.randn(B * H * N, D, device="cuda", generator=gen)
        sets.append((q, k, v))
    for name, vreg, fp8, bm, bn, w, st in [
        ("dense", 0, 0, 128, 64, 4, 2), ("dense", 0, 0, 128, 64, 4, 3), ("dense", 0, 0, 64, 128, 4, 2),
        ("vreg", 1, 0, 128, 64, 4, 2), ("vreg", 1, 0, 64, 128, 4, 2),
        ("fp8", 0, 1, 128, 64, 4, 2), ("fp8", 0, 1, 64, 128, 4, 2), ("fp8", 0, 1, 128, 32, 4, 2),
        ("fp8", 0, 1, 128, 128, 8, 2),
    ]:
        kv_dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
        calls, outs = [], []
        for q, k, v in sets:
            kk, vv = k.to(kv_dtype), v.to(kv_dtype)
            o = torch.full_like(q, float("nan"))
            kd = TensorDescriptor(kk, list(kk.shape), list(kk.stride()), [bn, D])
            vd = TensorDescriptor(vv, list(vv.shape), list(vv.stride()), [bn, D])
            grid = (N // bm, B * H)
            calls.append(lambda q=q, kd=kd, vd=vd, o=o: _dense[grid](q, kd, vd, o, D ** -0.5, N, BM=bm, BN=bn, D=D,
                                                                      VREG=vreg, FP8=fp8, num_warps=w,
                                                                      num_stages=st))
            outs.append((o, q, kk, vv))
        try:
            t = graph_time(calls * 3, replays=10)
        except Exception as exc:  # a config that does not compile or run is reported, not fatal
            rows.append(dict(kernel=name, config=f"bm{bm} bn{bn} w{w} st{st}", error=str(exc)[:200]))
            continue
        o, q, kk, vv = outs[0]
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.view(B, H, N, D)[:1, :4].float(), kk.view(B, H, N, D)[:1, :4].float(),
            vv.view(B, H, N, D)[:1, :4].float(), is_causal=True)
        got = o.view(B, H, N, D)[:1, :4].float()
        err = ((got - ref).norm() / ref.norm()).item()
        rows.append(dict(kernel=name, config=f"bm{bm} bn{bn} w{w} st{st}", us=round(t.median_us, 1),
                         tflops=round(flops / t.median_us / 1e6, 1), share=round(flops / t.median_us * 1e6 / flops_peak, 3),
                         rel_l2=float(f"{err:.2e}")))
        print(rows[-1], flush=True)
    return rows


def tile_rungs(flops_peak, configs):
    import bench
    from codegen import api
    from codegen.accuracy import compare
    from codegen.cases import run_reference
    from codegen.configs import LaunchConfig
    from codegen.timing import graph_time
    from codegen.workload import useful_flops
    rows = []
    for spec_args in [("prefill", "tp1", "scalar", 4, 2048, 0, "correlated"),
                      ("prefill", "tp1", "none", 4, 2048, 0, "correlated"),
                      ("prefill", "tp1", "scalar", 1, 8192, 0, "correlated"),
                      ("prefill", "tp4", "scalar", 1, 8192, 0, "correlated")]:
        spec = bench.Spec(*spec_args)
        cases_ = [bench.build(spec, "sm90", seed) for seed in range(3)]
        flops = useful_flops(cases_[0])
        ref = run_reference(cases_[0], torch.float32, on_device=True)
        for cfg in configs:
            if spec.mode == "none" and cfg.get("kv_upcast", 0) != 0:
                continue
            config = LaunchConfig(**cfg)
            calls = [lambda c=c: api.sparse_attn_prefill(**c.args, config=config, selection="tiled") for c in cases_]
            try:
                cases_[0].args["output"].fill_(float("nan"))
                calls[0]()
                err = compare(cases_[0].args["output"], ref).rel_l2
                t = graph_time(calls * 4, replays=10)
            except Exception as exc:
                rows.append(dict(case=spec.label, config=cfg, error=str(exc)[:200]))
                print(rows[-1], flush=True)
                continue
            rows.append(dict(case=spec.label, config=cfg, us=round(t.median_us, 1),
                             share=round(flops / t.median_us * 1e6 / flops_peak, 3), rel_l2=float(f"{err:.2e}")))
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--no-dense", action="store_true", help="only the prefill kernels (a second tree)")
    parser.add_argument("--configs", type=str, default="[]", help="prefill LaunchConfig dicts (JSON list)")
    args = parser.parse_args()
    from codegen.timing import matmul_flops
    peak = matmul_flops()
    print(f"bf16 matmul: {peak / 1e12:.0f} TFLOP/s; torch {torch.__version__}, triton {triton.__version__}", flush=True)
    result = dict(peak_tflops=round(peak / 1e12, 1), torch=torch.__version__, triton=triton.__version__,
                  device=torch.cuda.get_device_name())
    result["dense"] = [] if args.no_dense else dense_rungs(peak)
    result["tiles"] = tile_rungs(peak, json.loads(args.configs))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tile_ladder.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
