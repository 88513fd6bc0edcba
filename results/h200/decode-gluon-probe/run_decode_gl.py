"""On the H200: the probe Gluon decode against the shipped decode, side by side (graph of 20 calls over
rotating input sets), accuracy against the fp32 reference. Prints a table; writes $OUT/decode_gl.json."""
import json
import os
import sys
import time
import torch
import triton
sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # decode_gl.py beside this file
from bench import Spec, build  # noqa: E402
from codegen import cases  # noqa: E402
from codegen.accuracy import compare  # noqa: E402
from codegen.reference import reference_batched  # noqa: E402
from codegen.timing import copy_bandwidth, graph_time, input_sets  # noqa: E402
from codegen.workload import min_bytes  # noqa: E402
import decode_gl  # noqa: E402

SPECS = [Spec("decode", "tp4", "scalar", 1, 1, 8192), Spec("decode", "tp1", "scalar", 1, 1, 8192),
         Spec("decode", "tp4", "scalar", 8, 1, 8192), Spec("decode", "tp4", "scalar", 32, 1, 8192),
         Spec("decode", "tp4", "scalar", 128, 1, 8192), Spec("decode", "tp1", "scalar", 32, 1, 8192),
         Spec("decode", "tp1", "scalar", 128, 1, 8192), Spec("decode", "tp1", "scalar", 128, 1, 128 * 1024),
         Spec("decode", "tp4", "scalar", 32, 4, 8192), Spec("decode", "tp4", "per_token_head", 1, 1, 8192),
         Spec("decode", "tp4", "per_token_head", 128, 1, 8192), Spec("decode", "tp1", "per_token_head", 128, 1, 8192)]
VARIANTS = []
for sp in (1, 2, 4, 8, 16):
    VARIANTS += [dict(num_splits=sp), dict(num_splits=sp, k_in_regs=True, async_qk=True, share_f16=False),
                 dict(num_splits=sp, k_in_regs=True, async_qk=True, share_f16=False, stages=1),
                 dict(num_splits=sp, k_in_regs=True, async_qk=True, share_f16=False, num_warps=8)]
VARIANTS += [dict(num_splits=sp, async_qk=True, share_f16=False) for sp in (1, 16)]
only = os.environ.get("PROBE_SPECS")
if only:
    SPECS = [s for s in SPECS if any(o in s.label for o in only.split(","))]
out_dir = os.environ.get("OUT", "/tmp")
copy = copy_bandwidth()
print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__} copy {copy/1e12:.2f} TB/s")
rows = []
for spec in SPECS:
    first = build(spec, "sm90", seed=0)
    nbytes = min_bytes(first)
    n_sets = input_sets(nbytes, maximum=20)
    sets = [first] + [build(spec, "sm90", seed=s) for s in range(1, n_sets)]
    ref = reference_batched("decode", first.args)
    hkv = first.args["num_kv_heads"]
    shipped = graph_time([lambda c=sets[i % n_sets]: cases.run_kernel(c) for i in range(20)], replays=30).median_us
    first.poison()
    err = compare(cases.run_kernel(first), ref, torch.bfloat16).rel_l2
    line = dict(case=spec.label, shipped_us=shipped, shipped_rel_l2=err, floor_us=nbytes / copy * 1e6, variants={})
    print(f"{spec.label:44s} shipped {shipped:7.2f} us  floor {line['floor_us']:6.2f}  rel {err:.1e}", flush=True)
    for var in VARIANTS:
        counters = [torch.zeros(c.args["q"].shape[0] * hkv, dtype=torch.int32, device="cuda") for c in sets]
        def call(i, var=var):
            a = sets[i % n_sets].args
            return decode_gl.launch(a["q"], a["kv_cache"], a["topk_idx"], a["block_table"], a["seq_lens"], hkv,
                                    a["sm_scale"], a["output"], a["decode_query_len"], a["k_scale"], a["v_scale"],
                                    counters=counters[i % n_sets], **var)
        try:
            first.poison()
            out = call(0)
            torch.cuda.synchronize()
            e = compare(out, ref, torch.bfloat16).rel_l2
            us = graph_time([lambda i=i: call(i) for i in range(20)], replays=30).median_us
        except Exception as exc:  # noqa: BLE001
            print(f"   {var} ERROR {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            continue
        line["variants"][json.dumps(var)] = dict(us=us, rel_l2=e)
    best = sorted(line["variants"].items(), key=lambda kv: kv[1]["us"])[:4]
    for name, r in best:
        print(f"   {name[:70]:70s} {r['us']:7.2f} us  x{shipped / r['us']:5.2f}  {100 * line['floor_us'] / r['us']:5.1f}% floor  rel {r['rel_l2']:.1e}", flush=True)
    worst_err = max((r["rel_l2"] for r in line["variants"].values()), default=float("nan"))
    print(f"   worst rel_l2 over {len(line['variants'])} variants: {worst_err:.1e}", flush=True)
    rows.append(line)
    del sets
    torch.cuda.empty_cache()
    json.dump(rows, open(os.path.join(out_dir, "decode_gl.json"), "w"), indent=1)
