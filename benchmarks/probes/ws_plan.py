"""Where does a call of the warp-specialized tile spend the time beyond the Gluon kernel? (H200)

The Gluon prefill tile (codegen/generated/sm90_prefill_ws_*.py) runs after a Triton-language launch that
writes each tile's plan (templates/_tile_plan.jinja); under selection='auto' a decision launch comes
first (codegen.selection_kernel) and the per-token walk is launched too, over empty requests when the
tiles are chosen. This times, graph-timed over 3 rotating seeds of the bench's correlated prefill cases
(scalar scales): the plan launch alone (PLAN_WARPS 1, 2, 4, 8 with --warps), the whole call with
selection 'tiled' and 'auto', the decision launch alone, and the empty per-token launch alone; and prints
what 'auto' decides on the device. With --short: short prefills (issue 37) with the table's
configs instead, where `auto` cost 9-15 us over the faster path (results/h200/short-appends): each
launch of auto's plan alone.

  python benchmarks/probes/ws_plan.py [--warps] [--short] [--out DIR]
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


# Short prefills (issue 37): the whole call under each selection with the table's configs (config=None,
# as an engine calls), then each launch of `auto`'s plan alone and the plan without its last launch.
# The host rule is switched off so that `auto` decides on the device. SAMPLES_PER_PROGRAM varies the
# Triton tiles' decision launch (its programs walk their samples in series).
SHORT_CASES = (("tp4", "correlated", 1, 64, 8192), ("tp4", "correlated", 4, 128, 8192),
               ("tp4", "random", 1, 128, 8192), ("tp4", "correlated", 1, 512, 8192),
               ("tp8", "correlated", 1, 64, 8192), ("tp8", "correlated", 4, 256, 8192),
               ("tp8", "random", 1, 512, 8192), ("tp1", "random", 1, 128, 8192),
               ("tp1", "correlated", 1, 128, 8192), ("tp1", "correlated", 16, 64, 8192),
               ("tp1", "random", 1, 128, 131072))


def short_parts(row) -> None:
    import bench
    from codegen import api, cases, selection_kernel
    from codegen import selection as tile_selection
    from codegen.timing import graph_time

    roles = api.PREFILL_ROLES  # a call's tensors in the order its plan addresses them
    tile_selection.PER_TOKEN_UP_TO.clear()  # the device decides every call
    for layout, pattern, batch, tokens, prefix in SHORT_CASES:
        spec = bench.Spec("prefill", layout, "scalar", batch, tokens, prefix, pattern)
        sets = [bench.build(spec, "sm90", seed) for seed in range(4)]
        name = spec.label
        for selection in ("tiled", "per_token", "auto"):
            t = graph_time([lambda c=c: cases.run_kernel(c, selection=selection) for c in sets] * 3, replays=10)
            row(case=name, part=f"whole call, selection {selection}", us=round(t.median_us, 2))
        for per_program in (8, 2, 1):
            default, selection_kernel.SAMPLES_PER_PROGRAM = selection_kernel.SAMPLES_PER_PROGRAM, per_program
            a = sets[0].args
            plan = api._plan_prefill(tuple(a[r] for r in roles), a["max_query_len"], a["num_kv_heads"], a["sm_scale"],
                                     arch="sm90", config=None, fold_scales=True, selection="auto")
            selection_kernel.SAMPLES_PER_PROGRAM = default
            if per_program != 8 and not any("inflation" in launch.kernel.__name__ for launch in plan.launches):
                continue  # the Gluon tile decides in its plan launch: no samples to spread
            tensors = [tuple(c.args[r] for r in roles) for c in sets]
            pointers = [[0 if t is None else t.data_ptr() for t in ts] for ts in tensors]

            def timed(calls):
                def one(i):
                    stream = torch.cuda.current_stream().cuda_stream
                    for call in calls:
                        call(tensors[i], pointers[i], stream)
                return graph_time([lambda i=i: one(i) for i in range(len(sets))] * 3, replays=10).median_us

            names = [launch.kernel.__name__ for launch in plan.launches]
            grids = [launch.grid for launch in plan.launches]
            row(case=name, part="auto's plan", samples_per_program=per_program, launches=names, grids=grids,
                us=round(timed(plan.calls), 2))
            for i, call in enumerate(plan.calls):
                row(case=name, part=f"launch {i} alone", kernel=names[i], samples_per_program=per_program,
                    us=round(timed([call]), 2))
            row(case=name, part="plan without its last launch", samples_per_program=per_program,
                us=round(timed(plan.calls[:-1]), 2))
        del sets
        torch.cuda.empty_cache()


def _recorded(launch, case, config, cu=None):
    """The (kernel, grid, args, kwargs) launches `launch` records for `case` (cu_seqlens_q replaced by `cu`)."""
    a = case.args
    recorded = []
    launch(a["q"], a["kv_cache"], a["topk_idx"], a["block_table"], a["cu_seqlens_q"] if cu is None else cu,
           a["seq_lens"], a["prefix_lens"], a["max_query_len"], a["num_kv_heads"], a["sm_scale"], a["output"],
           a["k_scale"], a["v_scale"], config, record=recorded)
    return recorded


def write_rows(out: pathlib.Path | None, name: str, rows: list, **extra) -> None:
    """The probe's rows as out/name.json, with the versions and device they were measured on."""
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(dict(torch=torch.__version__, triton=triton.__version__,
                                                      device=torch.cuda.get_device_name(), **extra, rows=rows),
                                                 indent=1))


def _as_call(launches):
    return lambda: [kernel[grid](*args, **kw) for kernel, grid, args, kw in launches]


def rel_l2(module, case, config, reference) -> float:
    """Relative L2 error of `module`'s tiled call on `case` (output poisoned first) against `reference`."""
    from codegen.accuracy import compare

    case.poison()
    _as_call(_recorded(module.launch, case, config))()
    torch.cuda.synchronize()
    return compare(case.args["output"], reference, torch.bfloat16).rel_l2


def main() -> None:
    import bench
    from codegen import cases, get_config, selection_kernel
    from codegen import selection as tile_selection
    from codegen.configs import ws_config
    from codegen.generated import sm90_prefill_scalar as tiles
    from codegen.generated import sm90_prefill_ws_scalar as ws
    from codegen.timing import graph_time

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warps", action="store_true", help="also time the plan launch at 1, 2 and 8 warps")
    parser.add_argument("--short", action="store_true", help="short prefills with the table's configs instead")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    rows = []

    def row(**values):
        rows.append(values)
        print(values, flush=True)

    if args.short:
        short_parts(row)
        write_rows(args.out, "ws_plan_short", rows)
        return

    for layout, batch, tokens in CASES:
        name = f"{layout} {batch}x{tokens}"
        spec = bench.Spec("prefill", layout, "scalar", batch, tokens, 0, "correlated")
        sets = [bench.build(spec, "sm90", seed) for seed in range(3)]
        hq, hkv = bench.LAYOUTS[layout]
        config = ws_config(gqa=hq // hkv)
        for warps in (1, 2, 4, 8) if args.warps else (ws.PLAN_WARPS,):
            default, ws.PLAN_WARPS = ws.PLAN_WARPS, warps
            calls = [_as_call(_recorded(ws.launch, c, config)[:1]) for c in sets]
            ws.PLAN_WARPS = default
            row(case=name, part="plan launch", plan_warps=warps, us=round(graph_time(calls * 4, replays=10).median_us, 2))
        for selection in ("tiled", "auto"):
            t = graph_time([lambda c=c: cases.run_kernel(c, config=config, selection=selection) for c in sets] * 4,
                           replays=10)
            row(case=name, part=f"whole call, selection {selection}", us=round(t.median_us, 1))
        sampled_t = tile_selection.sampled_block_t(config.block_t)
        threshold = tile_selection.tiles_pay_off_below(sampled_t, "scalar")

        def decide(c):
            a = c.args
            return selection_kernel.decide_and_split(a["topk_idx"], sampled_t, threshold, a["cu_seqlens_q"],
                                                     a["prefix_lens"], tile_selection.SAMPLED_TILES)
        t = graph_time([lambda c=c: decide(c) for c in sets] * 4, replays=10)
        row(case=name, part="decision launch", block_t=sampled_t, us=round(t.median_us, 2))
        per_token = get_config("prefill", "sm90", torch.cuda.get_device_name(), "scalar", "fp8", hq, hkv,
                               tokens * batch, per_token=True).config
        empty = [torch.zeros_like(c.args["cu_seqlens_q"]) for c in sets]
        calls = [_as_call(_recorded(tiles.launch, c, per_token, cu)) for c, cu in zip(sets, empty)]
        row(case=name, part="per-token launch over empty requests", us=round(graph_time(calls * 4, replays=10).median_us, 2))
        estimate = torch.zeros(1, device="cuda")
        a = sets[0].args
        tiled_cu, _ = selection_kernel.decide_and_split(a["topk_idx"], sampled_t, threshold, a["cu_seqlens_q"],
                                                        a["prefix_lens"], tile_selection.SAMPLED_TILES,
                                                        inflation_out=estimate)
        row(case=name, part="auto's decision", block_t=sampled_t, inflation=round(float(estimate), 3),
            tiles=bool(tiled_cu[-1] > 0))
    write_rows(args.out, "ws_plan", rows)


if __name__ == "__main__":
    main()
