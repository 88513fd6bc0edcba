"""Runs benchmark cases once each inside a profiler range, for Nsight Compute's hardware counters.

Each case is built as `bench.py` builds it (its exact label, e.g. 'decode tp1 scalar b128 q1 ctx8k')
and called with a column's config (as `bench.py --configs`: runtime, untuned, a JSON override...).
The compile and two warm-up calls run outside the range; only the next call's kernels are profiled:

  ncu --clock-control none --profile-from-start off --section SpeedOfLight ... \
      python benchmarks/probes/ncu_cases.py 'decode tp1 scalar b128 q1 ctx8k=runtime' \
                                     'decode tp1 scalar b128 q1 ctx8k={"kv_tma": 0}'

The kernels come out in the order of the arguments; this script prints that order (CASE=CONFIG
and the launch config each ran).
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # bench.py, plots.py

from bench import GRIDS, build, grid, resolve  # noqa: E402
from codegen import cases  # noqa: E402
from codegen.validate import detect_device_arch  # noqa: E402


def parse(arg: str, specs: dict) -> tuple:
    label, sep, column = arg.partition("=")
    if not sep:
        column = "runtime"
    if label not in specs:
        close = [s for s in specs if label.split(" ")[0] in s][:5]
        raise SystemExit(f"case: no benchmark case is labelled {label!r}; labels look like {close}")
    return specs[label], column


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="+", help="LABEL or LABEL=COLUMN (column as in bench.py --configs)")
    parser.add_argument("--warmup", type=int, default=2, help="calls before the profiled one")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a GPU")
    arch = detect_device_arch(torch.device("cuda"))
    specs = {s.label: s for name in GRIDS for s in grid(name)}
    for i, arg in enumerate(args.cases):
        spec, column = parse(arg, specs)
        case = build(spec, arch, seed=0)
        config, kw = resolve(column, spec, arch, case)
        if config is None:
            raise SystemExit(f"case: column {column!r} does not apply to {spec.label!r}")
        for _ in range(args.warmup):
            cases.run_kernel(case, **kw)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        cases.run_kernel(case, **kw)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        print(f"[{i}] {spec.label} = {column}: {config.to_dict()}", flush=True)
        del case
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
