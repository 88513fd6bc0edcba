"""Checks prefill's tiled / per-token decision (codegen.selection) against a measured run.

Reads a bench.json that timed the tiles and the per-token path side by side (columns `tiled` or,
in runs before the `auto` default, `runtime`; and `per_token`), rebuilds each case's selections
on the CPU (the benchmark's first input set, seed 0), and prints per case: the tile size, the tile
inflation as the device measures it (the Gluon tile: over every tile at its block_t; the Triton
tiles: sampled at sampled_block_t), the threshold `auto` applies to this call (with its
fill_factor at --sm-count SMs, the H200's 132 by default), what it decides, and which path the run
found faster; then how many picks are within 5% of the faster path, and, when the run has an `auto`
column, what auto measured against the tiles and the per-token path (with the rules of that run).
CPU only.

  python benchmarks/probes/selection_check.py results/h200/short-appends/bench.json [--sm-count 132]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from codegen import cases  # noqa: E402
from codegen.selection import auto_threshold, tile_inflation  # noqa: E402
from codegen.shapes import HEAD_LAYOUTS  # noqa: E402


H200_SMS = 132
MARGIN = 1.05  # a pick within this factor of the faster path counts as right


def _inflation(spec: dict, block_t: int, every_tile: bool) -> float:
    hq, hkv = HEAD_LAYOUTS[spec["layout"]]
    # The selections do not depend on the cache dtype or head_dim: a small head_dim keeps it quick.
    case = cases.serving_case("prefill", arch="sm90", num_q_heads=hq, num_kv_heads=hkv, kv_dtype="fp8",
                              scale_mode="scalar", batch=spec["batch"], tokens=spec["tokens"],
                              context=spec["context"], pattern=spec["pattern"], head_dim=16,
                              q_dtype=torch.float32, device="cpu", seed=0)
    a = case.args
    sampled = dict(sampled_tiles=a["topk_idx"].shape[1]) if every_tile else {}
    return tile_inflation(a["topk_idx"], block_t, a["cu_seqlens_q"], a["prefix_lens"], **sampled).item()


def main(path: str, sm_count: int = H200_SMS) -> int:
    rows = [r for r in json.load(open(path))["rows"] if "error" not in r and r["case"].startswith("prefill")]
    by = {(r["case"], r["config"]): r for r in rows}
    tiled_column = "tiled" if any(r["config"] == "tiled" for r in rows) else "runtime"
    right = total = 0
    costs = []
    print(f"{'case':48s} {'bt':>3s} {'inflation':>9s} {'keep below':>10s} {'auto':>9s} {'faster':>9s} "
          f"{'tiles/per-token':>15s}")
    for case in dict.fromkeys(r["case"] for r in rows):
        tiled, per_token = by.get((case, tiled_column)), by.get((case, "per_token"))
        if not tiled or not per_token or tiled["launch"]["block_t"] == 1:
            continue  # nothing to decide
        spec, launch = tiled["spec"], tiled["launch"]
        block_t, mode = launch["block_t"], spec["mode"]
        gluon = bool(launch.get("warp_specialize"))
        judged_t, limit = auto_threshold(block_t, mode, gluon=gluon, total_q=spec["batch"] * spec["tokens"],
                                         num_kv_heads=HEAD_LAYOUTS[spec["layout"]][1], sm_count=sm_count)
        inflation = _inflation(spec, judged_t, gluon)
        chosen = "tiles" if inflation <= limit else "per-token"
        ratio = tiled["time_us"] / per_token["time_us"]
        faster = "tiles" if ratio < 1 else "per-token"
        picked = tiled["time_us"] if chosen == "tiles" else per_token["time_us"]
        costs.append((picked / min(tiled["time_us"], per_token["time_us"]), case))
        total += 1
        right += chosen == faster
        print(f"{case.removeprefix('prefill '):48s} {block_t:3d} {inflation:9.2f} {limit:10.2f} {chosen:>9s} "
              f"{faster:>9s} {ratio:15.2f}")
    print(f"auto picks the faster path in {right} of {total} cases")
    if costs:
        worst, worst_case = max(costs)
        within = sum(cost <= MARGIN for cost, _ in costs)
        print(f"auto's pick within {MARGIN:.2f}x of the faster path in {within} of {total} cases "
              f"(at {sm_count} SMs); worst {worst:.2f}x ({worst_case})")
    _measured_auto(by, tiled_column)
    return 0


def _measured_auto(by: dict, tiled_column: str) -> None:
    """Measured auto time over the tiles' and the per-token path's, per selection pattern and chunk
    shape (across layouts and scale modes)."""
    groups: dict[str, list] = {}
    for case, column in by:
        if column == "auto" and (case, tiled_column) in by and (case, "per_token") in by:
            auto = by[(case, "auto")]["time_us"]
            group = " ".join(case.split()[3:])  # "prefill tp1 scalar random 1x8k prefix120k" -> "random 1x8k ..."
            ratio = (auto / by[(case, tiled_column)]["time_us"], auto / by[(case, "per_token")]["time_us"])
            groups.setdefault(group, []).append(ratio)
            groups.setdefault(f"{group.split()[0]}, every shape", []).append(ratio)
    for group, ratios in sorted(groups.items()):
        over_tiles, over_per_token = zip(*ratios)
        print(f"measured auto, {group} ({len(ratios)} cases): / tiles median {statistics.median(over_tiles):.3f} "
              f"range {min(over_tiles):.3f}-{max(over_tiles):.3f}; / per-token range "
              f"{min(over_per_token):.3f}-{max(over_per_token):.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bench_json")
    parser.add_argument("--sm-count", type=int, default=H200_SMS, help="SMs of the GPU the run was timed on")
    args = parser.parse_args()
    sys.exit(main(args.bench_json, args.sm_count))
