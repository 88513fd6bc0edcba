"""How long does the warp-specialized tile's plan launch take, by its warps? (H200)

The Gluon prefill tile (codegen/generated/sm90_prefill_ws_*.py) runs after a Triton-language launch that
writes each tile's plan (templates/_tile_plan.jinja). This times that launch alone, graph-timed over
rotating seeds, at PLAN_WARPS 1, 2, 4, 8, on the bench's correlated prefill cases, beside the whole call.

  python benchmarks/probes/ws_plan.py [--out DIR]
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

CASES = (("tp1", 4, 2048), ("tp1", 1, 8192), ("tp4", 1, 8192), ("tp8", 1, 8192))


def main() -> None:
    import bench
    from codegen import cases, selection_kernel
    from codegen import selection as tile_selection
    from codegen.configs import ws_config
    from codegen.generated import sm90_prefill_ws_scalar as ws
    from codegen.timing import graph_time

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    rows = []
    for layout, batch, tokens in CASES:
        spec = bench.Spec("prefill", layout, "scalar", batch, tokens, 0, "correlated")
        sets = [bench.build(spec, "sm90", seed) for seed in range(3)]
        hq, hkv = bench.LAYOUTS[layout]
        config = ws_config(gqa=hq // hkv)
        for warps in (1, 2, 4, 8):
            ws.PLAN_WARPS = warps
            calls = []
            for case in sets:
                recorded = []
                a = case.args
                ws.launch(a["q"], a["kv_cache"], a["topk_idx"], a["block_table"], a["cu_seqlens_q"], a["seq_lens"],
                          a["prefix_lens"], a["max_query_len"], a["num_kv_heads"], a["sm_scale"], a["output"],
                          a["k_scale"], a["v_scale"], config, record=recorded)
                kernel, grid, kargs, kw = recorded[0]
                calls.append(lambda kernel=kernel, grid=grid, kargs=kargs, kw=kw: kernel[grid](*kargs, **kw))
            t = graph_time(calls * 4, replays=10)
            rows.append(dict(case=f"{layout} {batch}x{tokens}", plan_warps=warps, plan_us=round(t.median_us, 2)))
            print(rows[-1], flush=True)
        ws.PLAN_WARPS = 4
        for selection in ("tiled", "auto"):
            t = graph_time([lambda c=c: cases.run_kernel(c, config=config, selection=selection) for c in sets] * 4,
                           replays=10)
            rows.append(dict(case=f"{layout} {batch}x{tokens}", selection=selection, whole_call_us=round(t.median_us, 1)))
            print(rows[-1], flush=True)
        # what 'auto' decides on the device at this block_t (and at half of it)
        a = sets[0].args
        for block_t in (config.block_t, config.block_t // 2):
            estimate = torch.zeros(1, device="cuda")
            tiled_cu, per_token_cu = selection_kernel.decide_and_split(
                a["topk_idx"], block_t, tile_selection.tiles_pay_off_below(block_t, "scalar"), a["cu_seqlens_q"],
                a["prefix_lens"], tile_selection.SAMPLED_TILES, inflation_out=estimate)
            rows.append(dict(case=f"{layout} {batch}x{tokens}", block_t=block_t, inflation=round(float(estimate), 3),
                             tiled_cu=tiled_cu.tolist(), per_token_cu=per_token_cu.tolist()))
            print(rows[-1], flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ws_plan.json").write_text(json.dumps(dict(torch=torch.__version__, triton=triton.__version__,
                                                                device=torch.cuda.get_device_name(), rows=rows),
                                                           indent=1))


if __name__ == "__main__":
    main()
