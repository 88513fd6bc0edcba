"""Register cap probe on the GPU: the shipped prefill kernels with and without ptxas's `maxnreg`.

Why: the 64-row prefill tiles are latency-bound at 255 registers (2 CTAs of 4 warps per SM, 72% of
issue cycles without an eligible warp). At <= 168 registers three CTAs fit an SM (65536 registers /
(168 x 128 threads) = 3.05), at the price of the spills ptxas then needs (static_cli: 96-148 B at
`bn32`/`bn64`). This times both side by side on the same inputs.

Per case and config: per-call time from one CUDA graph (median of replays), % of a bf16 matmul
measured in the same run, and the relative L2 against the float32 reference of every timed launch
(the output poisoned before).

  python benchmarks/maxnreg_probe.py --out DIR [--caps 0,168,200] [--filter "tp1 scalar"]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
import triton  # noqa: E402

import bench  # noqa: E402
from codegen import cases  # noqa: E402
from codegen.accuracy import compare  # noqa: E402
from codegen.configs import LaunchConfig  # noqa: E402
from codegen.modules import load_module  # noqa: E402
from codegen.reference import reference_batched  # noqa: E402
from codegen.timing import graph_time, input_sets, matmul_flops  # noqa: E402
from codegen.workload import min_bytes, useful_flops  # noqa: E402

Spec = bench.Spec
CASES = [
    Spec("prefill", "tp1", "scalar", 1, 8192, 0, "correlated"),
    Spec("prefill", "tp4", "scalar", 1, 8192, 0, "correlated"),
    Spec("prefill", "tp1", "none", 1, 8192, 0, "correlated"),
    Spec("prefill", "tp1", "per_token_head", 1, 8192, 0, "correlated"),
    Spec("prefill", "tp4", "scalar", 4, 2048, 0, "random"),
    Spec("prefill", "tp1", "scalar", 1, 8192, 0, "random"),
]


def configs(spec) -> list[LaunchConfig]:
    """The shipped tile (bt4 bn128 st2) and the narrower ones a cap could fit, plus the per-token walk
    on unrelated selections."""
    up = 0 if spec.mode == "none" else 3
    shapes = [(4, 128, 2), (4, 64, 1), (4, 64, 2), (4, 64, 3), (4, 32, 2)]
    if spec.pattern == "random":
        shapes += [(1, 128, 2), (1, 64, 2)]
    return [LaunchConfig(block_t=bt, block_n=bn, num_warps=4, num_stages=st, kv_upcast=up) for bt, bn, st in shapes]


def capped(mode: str, cap: int) -> None:
    """Makes the sm90 prefill module of `mode` launch with ptxas's register cap `cap` (0: none)."""
    mod = load_module("sm90", "prefill", mode)
    if not hasattr(mod, "_options_uncapped"):
        mod._options_uncapped = mod.options
    mod.options = (mod._options_uncapped if not cap else
                   (lambda config, _f=mod._options_uncapped: dict(_f(config), maxnreg=cap)))


def _compile(plan) -> None:
    for spec, config, cap in plan:
        capped(spec.mode, cap)
        try:
            cases.run_kernel(bench.build(spec, "sm90", seed=0), config=config)
            torch.cuda.synchronize()
        except Exception as exc:  # reported again (and skipped) in the timing pass
            print(f"compile {spec.label} {config.non_default()} cap {cap}: {type(exc).__name__}", flush=True)
        torch.cuda.empty_cache()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=pathlib.Path)
    ap.add_argument("--caps", default="0,168", help="comma list of register caps (0: none)")
    ap.add_argument("--filter", nargs="*", default=None, help="cases whose label contains one of these")
    ap.add_argument("--replays", type=int, default=8)
    ap.add_argument("--compile-jobs", type=int, default=12)
    args = ap.parse_args(argv)
    caps = [int(c) for c in args.caps.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    specs = [s for s in CASES if not args.filter or any(f in s.label for f in args.filter)]
    plan = [(s, c, cap) for s in specs for c in configs(s) for cap in caps]
    t0 = time.time()
    with multiprocessing.get_context("spawn").Pool(args.compile_jobs) as pool:
        pool.map(_compile, [plan[i::args.compile_jobs] for i in range(args.compile_jobs)])
    peak = matmul_flops()
    print(f"compiled {len(plan)} launches in {time.time() - t0:.0f} s; bf16 matmul {peak / 1e12:.0f} TFLOP/s; "
          f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}", flush=True)
    rows = []
    for spec in specs:
        first = bench.build(spec, "sm90", seed=0)
        flops = useful_flops(first)
        n_sets = input_sets(min_bytes(first), maximum=4)
        sets = [first] + [bench.build(spec, "sm90", seed=s) for s in range(1, n_sets)]
        ref = reference_batched(spec.kernel, first.args)
        for config in configs(spec):
            for cap in caps:
                capped(spec.mode, cap)
                try:
                    first.poison()
                    out = cases.run_kernel(first, config=config)
                    rel = compare(out, ref, torch.bfloat16).rel_l2
                    t = graph_time([lambda c=sets[i % n_sets]: cases.run_kernel(c, config=config)
                                    for i in range(2)], replays=args.replays).median_us
                except Exception as exc:
                    print(f"{spec.label:44s} {str(config.non_default()):52s} cap {cap:3d}: "
                          f"{type(exc).__name__}: {str(exc)[:80]}", flush=True)
                    continue
                rows.append(dict(case=spec.label, config=config.to_dict(), cap=cap, time_us=t, rel_l2=rel,
                                 bf16_fraction=flops / peak / (t * 1e-6)))
                print(f"{spec.label:44s} {str(config.non_default()):52s} cap {cap:3d}: {t:8.1f} us "
                      f"{100 * rows[-1]['bf16_fraction']:5.1f}% rel_l2 {rel:.1e}", flush=True)
        del sets
        torch.cuda.empty_cache()
        (args.out / "maxnreg_probe.json").write_text(json.dumps(dict(peak_flops=peak, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
