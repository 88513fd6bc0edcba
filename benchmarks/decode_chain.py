"""Where the time of a one-request decode call goes (issue 5's 4 us target), on the current GPU.

Each row is timed like the benchmark (one CUDA graph of 20 calls over rotating input sets, replay /
calls, median), on the benchmark's own inputs for `decode tp4 scalar b1 q1 ctx8k`. The rows peel the
call apart: an empty launch; only the dependent index loads (top-k id -> block-table entry); those
plus the page's K/V bytes; the split kernel alone (partials stored, no merge); split + merge kernel;
the fused merge; one program reading all partials (the fused merge's serial tail), in fp32 and in
fp16; the split kernel and the call with plain K/V loads (`kv_tma` 0). `pdl` rows launch
the probe with programmatic dependent launch (each kernel waits for its predecessor with
griddepcontrol, but its launch overlaps the predecessor's tail).

  python benchmarks/decode_chain.py [--out DIR]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from codegen import cases, get_config  # noqa: E402
from codegen.modules import load_module  # noqa: E402
from codegen.timing import empty_launch_us, graph_time, input_sets  # noqa: E402
from codegen.validate import detect_device_arch  # noqa: E402
from codegen.workload import min_bytes  # noqa: E402
from codegen.workspace import arrival_counters  # noqa: E402

CALLS = 20


@triton.jit
def _probe(topk_ptr, block_table_ptr, kv_ptr, out_ptr, stride_tk_k, stride_bt_b, stride_kv_b, stride_kv_t,
           PAGE: tl.constexpr, ROW: tl.constexpr, READ_KV: tl.constexpr, PDL: tl.constexpr):
    """One program per selected page: top-k id -> block-table entry (-> the page's K and V rows)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    s = tl.program_id(0)
    page = tl.load(block_table_ptr + tl.load(topk_ptr + s * stride_tk_k) * stride_bt_b).to(tl.int64)
    if READ_KV:
        offs = tl.arange(0, PAGE)[:, None] * stride_kv_t + tl.arange(0, ROW)[None, :]
        kv = tl.load(kv_ptr + page * stride_kv_b + offs).to(tl.float32)
        tl.store(out_ptr + s, tl.sum(tl.sum(kv, axis=1), axis=0))
    else:
        tl.store(out_ptr + s, page.to(tl.float32))


@triton.jit
def _read_partials(part_ptr, out_ptr, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, PDL: tl.constexpr):
    """One program reads ROWS x HEAD_DIM partials (fp32, or fp16 as the split kernel stores them
    where partial_dtype allows) and stores their column sums: the bytes the fused merge's last
    program reads, without the merge arithmetic."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    offs = tl.arange(0, ROWS)[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    x = tl.load(part_ptr + offs, cache_modifier=".cg").to(tl.float32)
    tl.store(out_ptr + tl.arange(0, HEAD_DIM), tl.sum(x, axis=0))


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    what: str
    us: float


def _split_only(case, config, arch):
    """The split kernel with the merge left out (partials stored, no second launch)."""
    a = case.args
    split = load_module(arch, "decode_split", case.scale_mode)
    counters = arrival_counters(a["q"].device, a["q"].shape[0] * a["num_kv_heads"]) if config.fuses_merge else None
    return lambda: split.launch(a["q"], a["kv_cache"], a["topk_idx"], a["block_table"], a["seq_lens"],
                                a["num_kv_heads"], a["sm_scale"], a["output"], a["decode_query_len"], a["k_scale"],
                                a["v_scale"], None, None, config, True, counters)


def measure(arch: str) -> tuple[list[Row], dict]:
    hq, hkv, context = 16, 1, 8192
    build = lambda seed: cases.serving_case("decode", arch=arch, num_q_heads=hq, num_kv_heads=hkv,  # noqa: E731
                                            kv_dtype="fp8", scale_mode="scalar", batch=1, tokens=1, context=context,
                                            seed=seed)
    first = build(0)
    sets = [first] + [build(s) for s in range(1, input_sets(min_bytes(first), maximum=CALLS))]
    runtime = get_config("decode", arch, torch.cuda.get_device_name(), "scalar", "fp8", hq, hkv, 1).config
    splits = runtime.num_splits
    head_dim = first.args["q"].shape[2]
    probes_out = [torch.empty(max(splits, 16), device="cuda") for _ in sets]
    partials = [torch.randn(hq * splits, head_dim, device="cuda") for _ in sets]
    merged = torch.empty(head_dim, device="cuda")

    def probe(read_kv: bool, pdl: bool):
        def call(i):
            a = sets[i % len(sets)].args
            kv = a["kv_cache"]
            _probe[(splits,)](a["topk_idx"], a["block_table"], kv, probes_out[i % len(sets)],
                              a["topk_idx"].stride(2), a["block_table"].stride(1), kv.stride(0), kv.stride(2), PAGE=kv.shape[2], ROW=kv.shape[3], READ_KV=read_kv, PDL=pdl,
                              launch_pdl=pdl)
        return [lambda i=i: call(i) for i in range(CALLS)]

    def read_partials(pdl: bool, dtype=torch.float32):
        parts = [p.to(dtype) for p in partials]
        return [lambda i=i: _read_partials[(1,)](parts[i % len(sets)], merged, ROWS=hq * splits,
                                                 HEAD_DIM=head_dim, PDL=pdl, launch_pdl=pdl)
                for i in range(CALLS)]

    def api(config, fused=None):
        cfg = config if fused is None else dataclasses.replace(config, fused_merge=int(fused))
        return [lambda c=sets[i % len(sets)]: cases.run_kernel(c, config=cfg) for i in range(CALLS)]

    def split_only(config):
        cfg = dataclasses.replace(config, fused_merge=0)
        fns = [_split_only(c, cfg, arch) for c in sets]
        return [fns[i % len(sets)] for i in range(CALLS)]

    rows = []

    def add(name, what, calls):
        try:
            rows.append(Row(name, what, graph_time(calls, replays=50).median_us))
        except Exception as exc:  # e.g. a launch option this Triton lacks: reported, the rest still run
            print(f"{name:28s} failed: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
            return
        print(f"{name:28s} {rows[-1].us:7.2f} us  {what}", flush=True)

    rows.append(Row("empty launch", "a Triton kernel storing one int (codegen.timing)", empty_launch_us(CALLS)))
    print(f"{rows[-1].name:28s} {rows[-1].us:7.2f} us  {rows[-1].what}", flush=True)
    for pdl in (False, True):
        tag = " pdl" if pdl else ""
        add(f"index loads{tag}", f"{splits} programs: top-k id -> block-table entry", probe(False, pdl))
        add(f"index + K/V page{tag}", f"{splits} programs: ... -> the page's 128 x {2 * head_dim} K/V bytes",
            probe(True, pdl))
        add(f"read partials{tag}", f"1 program reads {hq * splits} x {head_dim} fp32 (the fused merge's reads)",
            read_partials(pdl))
    add("read partials fp16 pdl", f"1 program reads {hq * splits} x {head_dim} fp16 (half the bytes)",
        read_partials(True, torch.float16))
    add("split kernel only", f"runtime config, {splits} splits, partials stored, no merge", split_only(runtime))
    plain = dataclasses.replace(runtime, kv_tma=0)
    add("split kernel only, kv_tma 0", "the same with plain K/V loads", split_only(plain))
    add("fused merge, kv_tma 0", "the runtime config with plain K/V loads", api(plain, fused=True))
    add("split + merge kernel", "runtime config with fused_merge=0 (two launches, PDL)", api(runtime, fused=False))
    add("fused merge (runtime)", f"the runtime config: {runtime.non_default() or 'default'}", api(runtime, fused=True))
    for n in (8, 4, 1):
        cfg = dataclasses.replace(runtime, num_splits=n)
        add(f"fused, {n} splits", f"runtime config with num_splits={n}", api(cfg, fused=n > 1))
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                runtime_config=runtime.to_dict(), input_sets=len(sets), calls=CALLS)
    return rows, meta


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path, help="write decode_chain.json here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a GPU: the rows are CUDA-graph timings")
    arch = detect_device_arch(torch.device("cuda"))
    rows, meta = measure(arch)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "decode_chain.json").write_text(json.dumps(
            dict(meta=meta, rows=[dataclasses.asdict(r) for r in rows]), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
