"""Kernel design probe on the GPU: the previous main's kernels (their tuned configs) against this
tree's kernels over a small launch-config grid, side by side on the same inputs (decode cases,
or with --kernel prefill the prefill headline cases).

Per case: per-call time from one CUDA graph of `--calls` calls over rotating input sets (median of
replays), % of the HBM floor against a device copy measured in the same run, and the relative L2
error of the fastest config of each kernel against the float32 reference.

  python benchmarks/probes/probe.py --before .before --out DIR [--kernel prefill] [--compile-jobs 12]

`--before` is a tree of the previous main (its generated modules are loaded under other names).
Compiles run first in `--compile-jobs` processes (each launches every config once), timings after.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import itertools
import json
import multiprocessing
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import bench  # noqa: E402
import codegen.api as api  # noqa: E402
from codegen import cases  # noqa: E402
from codegen.accuracy import compare  # noqa: E402
from codegen.configs import LaunchConfig  # noqa: E402
from codegen.modules import load_module  # noqa: E402
from codegen.reference import reference_batched  # noqa: E402
from codegen.timing import copy_bandwidth, graph_time, input_sets, matmul_flops  # noqa: E402
from codegen.variants import Variant  # noqa: E402
from codegen.workload import min_bytes, useful_flops  # noqa: E402

Spec = bench.Spec
SPECS = {  # case -> split counts tried
    Spec("decode", "tp4", "scalar", 1, 1, 8192): (4, 8, 16),
    Spec("decode", "tp4", "per_token_head", 1, 1, 8192): (4, 8, 16),
    Spec("decode", "tp4", "scalar", 8, 1, 8192): (2, 4, 8),
    Spec("decode", "tp4", "scalar", 128, 1, 8192): (1, 2, 4),
    Spec("decode", "tp1", "scalar", 128, 1, 8192): (1, 2),
    Spec("decode", "tp1", "scalar", 1, 1, 8192): (4, 8, 16),
    Spec("decode", "tp4", "scalar", 32, 1, 8192): (2, 4, 8),
    Spec("decode", "tp1", "per_token_head", 128, 1, 8192): (1, 2),
    Spec("decode", "tp8", "scalar", 256, 1, 128 * 1024): (1, 2),
}


PREFILL_SPECS = {  # case -> tokens per program tried
    Spec("prefill", "tp1", "scalar", 1, 8192, 0, "correlated"): (1, 4, 8),
    Spec("prefill", "tp4", "scalar", 1, 8192, 0, "correlated"): (1, 4, 8),
    Spec("prefill", "tp1", "per_token_head", 1, 8192, 0, "correlated"): (1, 4, 8),
    Spec("prefill", "tp4", "per_token_head", 1, 8192, 0, "correlated"): (1, 4, 8),
    Spec("prefill", "tp1", "none", 1, 8192, 0, "correlated"): (1, 4, 8),
    Spec("prefill", "tp1", "scalar", 1, 8192, 120 * 1024, "random"): (1,),
    Spec("prefill", "tp1", "per_token_head", 1, 8192, 120 * 1024, "random"): (1,),
    Spec("prefill", "tp1", "scalar", 1, 8192, 0, "random"): (1, 4),
    Spec("prefill", "tp1", "none", 1, 8192, 0, "random"): (1, 4),
    Spec("prefill", "tp4", "scalar", 4, 2048, 0, "random"): (1, 4),
    Spec("prefill", "tp4", "scalar", 4, 2048, 0, "correlated"): (1, 4, 8),
}


def _prefill_configs(block_t: int, mode: str) -> list[LaunchConfig]:
    """The probe's configs of one tile height: TMA, fp16 MMAs with the asm V conversion (fp8), one
    warpgroup per 64 rows."""
    up = 0 if mode == "none" else 3
    warps = 8 if block_t == 8 else 4
    shapes = [(128, 1), (128, 2), (64, 2), (64, 3)] + ([(128, 3)] if block_t == 1 else [])
    return [LaunchConfig(block_t=block_t, block_n=bn, num_warps=warps, num_stages=st, kv_upcast=up)
            for bn, st in shapes]


def prefill_grid(block_ts, mode: str = "scalar") -> list[LaunchConfig]:
    return [c for bt in block_ts for c in _prefill_configs(bt, mode)]


def prefill_before_grid(runtime: LaunchConfig, mode: str) -> list[LaunchConfig]:
    """The previous main at its table's config, that config's per-token twin and the previous probe's
    best tile and walk (so 'before' is the previous kernels at their best, not at a stale table)."""
    up = 0 if mode == "none" else 2
    configs = [runtime, dataclasses.replace(runtime, block_t=1),
               LaunchConfig(block_t=4, block_n=128, num_warps=4, num_stages=2, kv_upcast=up),
               LaunchConfig(block_t=1, block_n=128, num_warps=4, num_stages=2, kv_upcast=up)]
    if mode != "none":
        configs.append(LaunchConfig(block_t=4, block_n=128, num_warps=4, num_stages=2, kv_upcast=3))
    return list(dict.fromkeys(configs))


def grid(splits) -> list[LaunchConfig]:
    return [LaunchConfig(block_n=bn, num_warps=warps, num_stages=stages, num_splits=sp, fused_merge=int(sp > 1),
                         kv_upcast=2)
            for bn, warps, stages, sp in itertools.product((64, 128), (2, 4, 8), (2, 3, 4), splits)]


@triton.jit
def _stream_kernel(kv_desc, topk_ptr, block_table_ptr, out_ptr, n_pages_per_split, stride_tk_h, stride_tk_t,
                   stride_bt_r, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, TOPK: tl.constexpr):
    """The split kernel's memory traffic alone: the same pages through the same TMA boxes, summed."""
    t = tl.program_id(0)
    g = tl.program_id(1)
    split = tl.program_id(2)
    offs_k = tl.arange(0, TOPK)
    lo = split * n_pages_per_split
    mine = (offs_k >= lo) & (offs_k < lo + n_pages_per_split)
    ids = tl.load(topk_ptr + g * stride_tk_h + t * stride_tk_t + offs_k, mask=mine, other=0)
    pages = tl.load(block_table_ptr + t * stride_bt_r + ids, mask=mine, other=0)
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    SUB: tl.constexpr = 128 // BLOCK_N
    for it in range(lo * SUB, (lo + n_pages_per_split) * SUB):
        page = tl.sum(tl.where(offs_k == it // SUB, pages, 0), axis=0)
        sub = ((it % SUB) * BLOCK_N).to(tl.int32)
        k = kv_desc.load([page, g, sub, 0]).reshape(BLOCK_N, HEAD_DIM)
        v = kv_desc.load([page, g, sub, HEAD_DIM]).reshape(BLOCK_N, HEAD_DIM)
        acc += tl.sum(k.to(tl.float16).to(tl.float32) + v.to(tl.float16).to(tl.float32), axis=0)
    tl.store(out_ptr + ((t * tl.num_programs(1) + g) * tl.num_programs(2) + split) * HEAD_DIM
             + tl.arange(0, HEAD_DIM), acc)


def stream_time(spec, sets, calls, block_n, warps, stages, splits) -> float:
    kv_descriptor = load_module("sm90", "decode_split", spec.mode).kv_descriptor  # the split kernel's boxes

    def one(case):
        a = case.args
        kv, topk, bt = a["kv_cache"], a["topk_idx"], a["block_table"]
        total_q, hkv, d = topk.shape[1], kv.shape[1], kv.shape[3] // 2
        if a.get("decode_query_len", 1) != 1:
            raise ValueError("stream probe: query length 1 only")
        desc = kv_descriptor(kv, d, block_n)
        out = torch.empty(total_q * hkv * splits * d, device=kv.device)
        return lambda: _stream_kernel[(total_q, hkv, splits)](
            desc, topk, bt, out, 16 // splits, topk.stride(0), topk.stride(1), bt.stride(0),
            HEAD_DIM=d, BLOCK_N=block_n, TOPK=16, num_warps=warps, num_stages=stages)
    fns = [one(c) for c in sets]
    return graph_time([fns[i % len(fns)] for i in range(calls)], replays=30).median_us


def old_loader(before: pathlib.Path):
    cache = {}

    def load(arch, kernel, scale_mode, fold_scales=True):
        name = Variant(arch, kernel, scale_mode, fold_scales).name
        if name not in cache:
            path = before / "codegen" / "generated" / f"{name}.py"
            spec = importlib.util.spec_from_file_location(f"before_{name}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            cache[name] = module
        return cache[name]
    return load


def use(kernel: str, before):
    """Points the API at the previous main's modules ('before') or this tree's ('after')."""
    api.load_module = before if kernel == "before" else load_module


def _compile_shard(args):
    shard, before_dir = args
    before = old_loader(pathlib.Path(before_dir))
    for spec, kernel, config in shard:
        case = bench.build(spec, "sm90", seed=0)
        use(kernel, before)
        try:
            cases.run_kernel(case, config=config)
        except Exception as exc:  # reported again (and timed as failed) in the timing phase
            print(f"compile {spec.label} {config}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
    torch.cuda.synchronize()
    return len(shard)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, type=pathlib.Path)
    ap.add_argument("--out", required=True, type=pathlib.Path)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--compile-jobs", type=int, default=12)
    ap.add_argument("--filter", nargs="*", default=None)
    ap.add_argument("--kernel", choices=("decode", "prefill"), default="decode")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    before = old_loader(args.before)
    table, make_grid = (SPECS, grid) if args.kernel == "decode" else (PREFILL_SPECS, prefill_grid)
    specs = {s: sp for s, sp in table.items() if not args.filter or any(f in s.label for f in args.filter)}

    plan = []  # (spec, kernel, config)
    runtime = {}  # spec -> the config the runtime picks (this tree's table; the 'before' column runs it too)
    for spec, splits in specs.items():
        runtime[spec] = bench.resolve("runtime", spec, "sm90", bench.build(spec, "sm90", seed=0))[0]
        if args.kernel == "prefill":
            plan += [(spec, "before", c) for c in prefill_before_grid(runtime[spec], spec.mode)]
            plan.append((spec, "after", runtime[spec]))
            plan += [(spec, "after", c) for c in prefill_grid(splits, spec.mode)]
            continue
        plan.append((spec, "before", runtime[spec]))
        plan.append((spec, "after", runtime[spec]))
        plan += [(spec, "after", c) for c in make_grid(splits)]
    t0 = time.time()
    jobs = [plan[i::args.compile_jobs] for i in range(args.compile_jobs)]
    with multiprocessing.get_context("spawn").Pool(args.compile_jobs) as pool:
        pool.map(_compile_shard, [(j, str(args.before)) for j in jobs if j])
    print(f"compiled {len(plan)} launches in {time.time() - t0:.0f} s", flush=True)

    copy_bps = copy_bandwidth()
    peak = matmul_flops() if args.kernel == "prefill" else None
    print(f"copy {copy_bps / 1e12:.2f} TB/s  {torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"triton {__import__('triton').__version__}", flush=True)
    rows = []
    for spec in specs:
        first = bench.build(spec, "sm90", seed=0)
        nbytes, flops = min_bytes(first), useful_flops(first)
        n_sets = input_sets(nbytes, maximum=args.calls)
        sets = [first] + [bench.build(spec, "sm90", seed=s) for s in range(1, n_sets)]
        ref = reference_batched(spec.kernel, first.args)
        best = {}
        for s, kernel, config in plan:
            if s != spec:
                continue
            use(kernel, before)
            try:
                calls = args.calls if spec.kernel == "decode" else 1  # a prefill call runs for milliseconds
                t = graph_time([lambda c=sets[i % n_sets]: cases.run_kernel(c, config=config)
                                for i in range(calls)], replays=30 if spec.kernel == "decode" else 8).median_us
            except Exception as exc:
                print(f"  {kernel} {config.non_default()}: {type(exc).__name__}: {str(exc)[:100]}", flush=True)
                continue
            row = dict(case=spec.label, kernel=kernel, config=config.to_dict(), time_us=t,
                       floor_fraction=nbytes / copy_bps / (t * 1e-6),
                       bf16_fraction=flops / peak / (t * 1e-6) if peak else None)
            rows.append(row)
            tag = kernel if kernel == "before" or config == runtime[spec] else "after, best of grid"
            if tag not in best or t < best[tag]["time_us"]:
                best[tag] = row
        for tag, row in best.items():
            use(row["kernel"], before)
            first.poison()
            out = cases.run_kernel(first, config=LaunchConfig(**row["config"]))
            row["rel_l2"] = compare(out, ref, torch.bfloat16).rel_l2
            share = (f"{100 * row['bf16_fraction']:5.1f}% bf16" if row.get("bf16_fraction")
                     else f"{100 * row['floor_fraction']:5.1f}% floor")
            print(f"{spec.label:40s} {tag:22s} {row['time_us']:8.2f} us {share} "
                  f"rel_l2 {row['rel_l2']:.1e}  {LaunchConfig(**row['config']).non_default()}", flush=True)
        if spec.kernel == "decode" and spec.tokens == 1:
            for bn, warps, stages, sp in itertools.product((64, 128), (4,), (2, 3, 4), SPECS[spec][:2]):
                try:
                    t = stream_time(spec, sets, args.calls, bn, warps, stages, sp)
                except Exception as exc:
                    print(f"  stream: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    break
                rows.append(dict(case=spec.label, kernel="stream", config=dict(block_n=bn, num_warps=warps,
                            num_stages=stages, num_splits=sp), time_us=t, floor_fraction=nbytes / copy_bps / (t * 1e-6)))
                print(f"{spec.label:40s} stream bn{bn} w{warps} st{stages} sp{sp}: {t:8.2f} us "
                      f"{100 * rows[-1]['floor_fraction']:5.1f}% floor", flush=True)
        del sets
        torch.cuda.empty_cache()
    (args.out / "probe.json").write_text(json.dumps(dict(copy_bps=copy_bps, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
