"""On the H200: the WS decode probe against the shipped decode (graph of 20 calls over rotating input sets),
accuracy against the fp32 reference first. QUICK=1: one small case, each variant once (a hang shows here)."""
import json, os, sys
import torch, triton
sys.path.insert(0, "."); sys.path.insert(0, "benchmarks"); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import Spec, build
from codegen import cases
from codegen.accuracy import compare
from codegen.reference import reference_batched
from codegen.timing import copy_bandwidth, graph_time, input_sets
from codegen.workload import min_bytes
import decode_ws

SPECS = [Spec("decode", "tp4", "scalar", 1, 1, 8192), Spec("decode", "tp1", "scalar", 1, 1, 8192),
         Spec("decode", "tp4", "scalar", 32, 1, 8192), Spec("decode", "tp4", "scalar", 128, 1, 8192),
         Spec("decode", "tp1", "scalar", 32, 1, 8192), Spec("decode", "tp1", "scalar", 128, 1, 8192),
         Spec("decode", "tp8", "scalar", 256, 1, 8192), Spec("decode", "tp4", "scalar", 32, 4, 8192)]
VARIANTS = [dict(num_splits=s) for s in (1, 2, 4, 8, 16)] + [dict(num_splits=s, nc=1) for s in (4, 16)]
if os.environ.get("ROUND") == "2":  # the fixed cost: the first pages issued early, the merge fused
    SPECS = [s for s in SPECS if s.batch in (1, 32, 128, 256) and s.tokens == 1 and not (s.layout == "tp1" and s.batch == 32)]
    VARIANTS = [dict(num_splits=1), dict(num_splits=1, early=True), dict(num_splits=4),
                dict(num_splits=4, fused=True), dict(num_splits=4, fused=True, early=True),
                dict(num_splits=2, fused=True, early=True), dict(num_splits=8, fused=True, early=True)]
QUICK = os.environ.get("QUICK") == "1"
if QUICK:
    SPECS = [Spec("decode", "tp4", "scalar", 3, 1, 3000), Spec("decode", "tp8", "scalar", 3, 2, 1000)]
    VARIANTS = [dict(num_splits=1), dict(num_splits=4), dict(num_splits=4, nc=1), dict(num_splits=1, early=True),
                dict(num_splits=4, fused=True, early=True)]
out_dir = os.environ.get("OUT", "/tmp")
copy = copy_bandwidth()
print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__} copy {copy/1e12:.2f} TB/s", flush=True)
rows = []
for spec in SPECS:
    first = build(spec, "sm90", seed=0)
    nbytes = min_bytes(first)
    n_sets = input_sets(nbytes, maximum=20)
    sets = [first] + [build(spec, "sm90", seed=s) for s in range(1, n_sets)]
    ref = reference_batched("decode", first.args)
    hkv = first.args["num_kv_heads"]
    first.poison()
    err = compare(cases.run_kernel(first), ref, torch.bfloat16).rel_l2
    shipped = float("nan") if QUICK else graph_time([lambda c=sets[i % n_sets]: cases.run_kernel(c) for i in range(20)], replays=30).median_us
    line = dict(case=spec.label, shipped_us=shipped, shipped_rel_l2=err, floor_us=nbytes / copy * 1e6, variants={})
    print(f"{spec.label:44s} shipped {shipped:7.2f} us  floor {line['floor_us']:6.2f}  rel {err:.1e}", flush=True)
    counters = [torch.zeros(c.args["q"].shape[0] * hkv, dtype=torch.int32, device="cuda") for c in sets]
    for var in VARIANTS:
        def call(i, var=var):
            a = sets[i % n_sets].args
            return decode_ws.launch(a["q"], a["kv_cache"], a["topk_idx"], a["block_table"], a["seq_lens"], hkv,
                                    a["sm_scale"], a["output"], a["decode_query_len"], a["k_scale"], a["v_scale"],
                                    counters=counters[i % n_sets], **var)
        try:
            first.poison()
            out = call(0)
            torch.cuda.synchronize()
            e = compare(out, ref, torch.bfloat16).rel_l2
            us = float("nan") if QUICK else graph_time([lambda i=i: call(i) for i in range(20)], replays=30).median_us
        except Exception as exc:  # noqa: BLE001
            print(f"   {var} ERROR {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            continue
        line["variants"][json.dumps(var)] = dict(us=us, rel_l2=e)
        print(f"   {json.dumps(var):40s} {us:7.2f} us  x{shipped / us:5.2f}  {100 * line['floor_us'] / us:5.1f}% floor  rel {e:.1e}", flush=True)
    rows.append(line)
    del sets
    torch.cuda.empty_cache()
    json.dump(rows, open(os.path.join(out_dir, "decode_ws_round2.json" if os.environ.get("ROUND") == "2"
                                       else "decode_ws.json"), "w"), indent=1)
