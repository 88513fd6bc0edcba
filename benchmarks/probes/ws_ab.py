"""The Gluon prefill tile of this tree against another tree's, side by side in one process (H200).

The modules codegen/generated/sm90_prefill_ws_*.py as they are here against the same modules of another
tree (--before, default .before: `mkdir .before && git archive REV codegen | tar -x -C .before`): accuracy
first (output poisoned, float32 reference, every case and seed), then the whole tiled call (plan launch +
Gluon kernel) and the plan launch alone, graph-timed over 3 rotating seeds; % of the bf16 matmul rate
measured in the same run, for the call and for the kernel (the call less the plan launch).

  python benchmarks/probes/ws_ab.py [--before TREE] [--out DIR] [--convert-rows N]

Both trees run the same config: the tuned table's convert_rows for the case's bucket (this tree's
table), or --convert-rows N for every case.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "probes"))

import torch  # noqa: E402

from codegen.configs import WS_CONVERT_ROWS  # noqa: E402

from ws_limits import edited  # noqa: E402  (a generated module with text edits, imported)
from ws_plan import _as_call, _recorded, rel_l2, write_rows  # noqa: E402  (a module's launches, recorded and run)

CASES = (("tp1", "scalar", 4, 2048), ("tp1", "scalar", 1, 8192), ("tp4", "scalar", 1, 8192),
         ("tp8", "scalar", 1, 8192), ("tp1", "per_token_head", 1, 8192), ("tp4", "per_token_head", 1, 8192))


def tuned_convert_rows(mode: str, num_q_heads: int, num_kv_heads: int, tokens: int) -> int:
    """The convert_rows the loader picks for this GPU's bucket; the Gluon default when its pick is not
    the Gluon tile (no table, or Triton tiles there)."""
    from codegen.api import device_name
    from codegen.configs import ws_config
    from codegen.loader import get_config

    choice = get_config("prefill", "sm90", device_name(torch.device("cuda")), mode, "fp8", num_q_heads,
                        num_kv_heads, tokens)
    return (choice.config if choice.config.warp_specialize else ws_config(gqa=num_q_heads // num_kv_heads)).convert_rows


def module_at(tree: pathlib.Path, mode: str, folder: pathlib.Path):
    """The Gluon module of `mode` in `tree`, imported under its own name."""
    return edited("before", [], folder, tree / "codegen" / "generated" / f"sm90_prefill_ws_{mode}.py")


def main() -> None:
    import bench
    from codegen.configs import ws_config
    from codegen.generated import sm90_prefill_ws_per_token_head, sm90_prefill_ws_scalar
    from codegen.reference import reference_batched
    from codegen.timing import graph_time, matmul_flops
    from codegen.workload import useful_flops

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=pathlib.Path, default=ROOT / ".before")
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--convert-rows", type=int, choices=WS_CONVERT_ROWS,
                        help="the converter's rows a chunk for every case (default: the tuned table's)")
    args = parser.parse_args()
    folder = pathlib.Path(tempfile.mkdtemp())
    after = {"scalar": sm90_prefill_ws_scalar, "per_token_head": sm90_prefill_ws_per_token_head}
    before = {mode: module_at(args.before, mode, folder) for mode in after}
    peak = matmul_flops()
    rows = []
    print(f"bf16 matmul {peak / 1e12:.0f} TFLOP/s", flush=True)
    for layout, mode, batch, tokens in CASES:
        spec = bench.Spec("prefill", layout, mode, batch, tokens, 0, "correlated")
        sets = [bench.build(spec, "sm90", seed) for seed in range(3)]
        hq, hkv = bench.LAYOUTS[layout]
        config = ws_config(gqa=hq // hkv, convert_rows=args.convert_rows or tuned_convert_rows(
            mode, hq, hkv, batch * tokens))
        flops = useful_flops(sets[0])
        refs = [reference_batched(c.kernel, c.args) for c in sets]
        row = dict(case=f"{layout} {mode} correlated {batch}x{tokens // 1024}k", convert_rows=config.convert_rows)
        for side, module in (("before", before[mode]), ("after", after[mode])):
            row[f"rel_l2_{side}"] = max(rel_l2(module, c, config, r) for c, r in zip(sets, refs))
            calls = [_as_call(_recorded(module.launch, c, config)) for c in sets]
            row[f"us_{side}"] = round(graph_time(calls * 4, replays=10).median_us, 1)
        plans = [_as_call(_recorded(after[mode].launch, c, config)[:1]) for c in sets]
        row["plan_us"] = round(graph_time(plans * 4, replays=10).median_us, 1)
        row["x"] = round(row["us_before"] / row["us_after"], 3)
        for side in ("before", "after"):
            row[f"pct_{side}"] = round(100 * flops / (row[f"us_{side}"] * 1e-6) / peak, 1)
            row[f"kernel_pct_{side}"] = round(100 * flops / ((row[f"us_{side}"] - row["plan_us"]) * 1e-6) / peak, 1)
        rows.append(row)
        print(row, flush=True)
        del sets, refs
        torch.cuda.empty_cache()
    write_rows(args.out, "ws_ab", rows, matmul_flops=peak, before=str(args.before))


if __name__ == "__main__":
    main()
