"""Host cost of one attention call as a serving engine makes it: eager, back-to-back, on shapes whose
GPU time is small, so the GPU waits for the host and the host's time per call is the latency.

Per row (a kernel, head layout, scale mode and batch), in microseconds per call:
  api        the API as vLLM calls it (config from the tuned table), each call another layer's
             tensors (q, output, top-k and cache rotate over 8 sets) with the step's metadata
  new step   the same, with other metadata tensors of the same shapes every call
  config=    the API with the same configs given explicitly (selection "tiled" / the table's pick)
  plan.run   a step plan (codegen.plan_prefill / plan_decode, made once) run with each layer's tensors
  floor      the same compiled kernels launched directly with prebuilt arguments through
             Triton's launcher (CompiledKernel.run, tensors as arguments): what a Triton launch
             from Python costs on this host at least
  floor C    the same through the launcher's C entry point with addresses and encoded TMA
             descriptors (what the plans call): the launch itself
  gpu        GPU time per call, from one CUDA graph of 20 calls on the rotating sets
Host times: `calls` back-to-back calls timed on the host clock up to the last issue (not the
final sync), best of 5 repeats, after warm-up. Since the launch queue is not full, that is the
host's time to issue a call, whatever the GPU does.

  python benchmarks/host_cost.py                 # every row, JSON to --out
  python benchmarks/host_cost.py --quick         # scalar rows only (the GPU check runs this)
  python benchmarks/host_cost.py --tree OLD_TREE --out before.json   # another checkout's API
  python benchmarks/host_cost.py --compare before.json after.json    # side-by-side table
  python benchmarks/host_cost.py --cold-start    # first-call time with and without msa-tune warmup
"""
from __future__ import annotations

import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from script_cli import NO_GPU, Parser, gpu_missing, read_json  # benchmarks/script_cli.py (no codegen: --tree)

REPO = pathlib.Path(__file__).resolve().parent.parent

# (kernel, layout, requests, tokens per request, cached context): the issue-24 rows.
SHAPES = [
    ("decode", "tp4", 1, 1, 8192),
    ("decode", "tp1", 8, 1, 8192),
    ("decode", "tp1", 64, 1, 8192),
    ("prefill", "tp4", 1, 16, 8192),
    ("prefill", "tp1", 1, 64, 8192),
    ("prefill", "tp1", 1, 512, 0),
]
MODES = [("scalar", "fp8"), ("per_token_head", "fp8"), ("none", "bf16")]
LAYERS = 8  # input sets rotated through, as the layers of one step


def _rows(quick: bool):
    modes = MODES[:1] if quick else MODES
    return [(kernel, layout, reqs, tokens, context, mode, kv) for kernel, layout, reqs, tokens, context in SHAPES
            for mode, kv in modes]


def _host_us(call, calls: int, repeats: int = 5) -> float:
    import torch

    for i in range(20):
        call(i)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(calls):
            call(i)
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return best


def _layer_sets(case, count: int):
    """`count` argument dicts: the case's metadata tensors shared, per-layer tensors distinct."""
    import torch

    sets = []
    for i in range(count):
        args = dict(case.args)
        gen = torch.Generator(device=args["q"].device).manual_seed(i)
        args["q"] = torch.randn(args["q"].shape, generator=gen, device=args["q"].device).to(args["q"].dtype)
        args["output"] = torch.empty_like(args["q"])
        for name in ("kv_cache", "topk_idx", "k_scale", "v_scale"):
            if isinstance(args.get(name), torch.Tensor):
                args[name] = args[name].clone()  # clone keeps the strides of these dense views
        sets.append(args)
    return sets


def _metadata_sets(sets):
    """The same sets with metadata tensors of their own (same shapes) in each: a new step each call."""
    import torch

    fresh = []
    for args in sets:
        args = dict(args)
        for name in ("block_table", "seq_lens", "cu_seqlens_q", "prefix_lens"):
            if isinstance(args.get(name), torch.Tensor):
                args[name] = args[name].clone()
        fresh.append(args)
    return fresh


def _floor_calls(codegen, fn, args):
    """Calls that launch the plan's compiled kernels directly with prebuilt arguments: through
    Triton's launcher (`CompiledKernel.run`, tensors as arguments) and through its C entry point
    (addresses, descriptors encoded once); (None, None) for a tree without call plans."""
    import torch

    try:
        from codegen import bound_launch
        from codegen import plan as call_plans
    except ImportError:
        return None, None
    call_plans.PLANS.clear()
    fn(**args)
    (plan,) = call_plans.PLANS._plans.values()
    roles = codegen.api.PREFILL_ROLES if "cu_seqlens_q" in args else codegen.api.DECODE_ROLES
    tensors = tuple(args.get(role) for role in roles)
    triton_launches, c_launches = [], []
    for launch in plan.launches:
        values = list(launch.values)
        for pos, role in launch.slots:
            values[pos] = tensors[role]
        encoded = {}  # descriptors as the C entry takes them, by position
        metas = getattr(launch.compiled.metadata, "tensordesc_meta", None) or [None] * len(launch.descriptor_slots)
        for (pos, role, template), meta in zip(launch.descriptor_slots, metas):
            ptr = tensors[role].data_ptr()
            values[pos] = bound_launch._Descriptors(template, meta, encode=False)(ptr)
            encoded[pos] = bound_launch._Descriptors(template, meta, encode=True)(ptr)
        triton_launches.append((launch.launcher, launch.grid, launch.function, launch.packed_metadata, values))
        entry = bound_launch._direct_entry(launch.launcher)
        if entry is None:
            c_launches = None
        elif c_launches is not None:
            flat = []
            for pos, value in enumerate(values):
                if pos in encoded:
                    flat.extend(encoded[pos])
                else:
                    flat.append(value.data_ptr() if isinstance(value, torch.Tensor) else value)
            c_launches.append((entry, launch.grid, launch.function, launch.packed_metadata, flat))
    stream_of, device = bound_launch._current_stream, plan.launches[0].device

    def triton_floor(_):
        for launcher, (g0, g1, g2), function, packed, values in triton_launches:
            launcher(g0, g1, g2, stream_of(device), function, packed, None, None, None, *values)

    def c_floor(_):
        for entry, (g0, g1, g2), function, packed, flat in c_launches:
            entry.launch(g0, g1, g2, stream_of(device), function, entry.cooperative, entry.pdl, None, None, packed,
                         None, None, None, *flat)
    return triton_floor, (c_floor if c_launches else None)


def _step_plan_call(codegen, kernel: str, sets):
    """A call through a step plan (codegen.plan_prefill / plan_decode: metadata once, then
    run(layer tensors)), or None for a tree without them."""
    planner = getattr(codegen.api, f"plan_{kernel}", None)
    if planner is None:
        return None
    a = sets[0]
    if kernel == "prefill":
        step = planner(a["block_table"], a["cu_seqlens_q"], a["seq_lens"], a["prefix_lens"], a["max_query_len"],
                       a["num_kv_heads"], a["sm_scale"])
    else:
        step = planner(a["block_table"], a["seq_lens"], a["num_kv_heads"], a["sm_scale"], a["decode_query_len"])
    layers = [tuple(s.get(name) for name in ("q", "kv_cache", "topk_idx", "output", "k_scale", "v_scale"))
              for s in sets]
    return lambda i: step.run(*layers[i % LAYERS])


def components(fn, args, family: str, calls: int) -> dict:
    """Per-part host time of one planned call (µs): the key, the lookup (table stat included),
    the launches, and the whole API call, each timed alone back to back."""
    import codegen
    from codegen import plan as call_plans

    api = codegen.api
    roles = api.PREFILL_ROLES if family == "prefill" else api.DECODE_ROLES
    tensors = tuple(args.get(role) for role in roles)
    if family == "prefill":
        scalars = (args["max_query_len"], args["num_kv_heads"], args["sm_scale"])
        options = (None, None, True, None)
    else:
        scalars = (args["num_kv_heads"], args["sm_scale"], args["decode_query_len"])
        options = (None, None, True)
    fn(**args)
    key, _, stream, pointers = call_plans.call_key(family, tensors, scalars, options)
    plan = call_plans.PLANS.get(key)
    parts = dict(
        key=_host_us(lambda i: call_plans.call_key(family, tensors, scalars, options), calls),
        lookup=_host_us(lambda i: call_plans.PLANS.get(key), calls),
        table_stat=_host_us(lambda i: plan.fresh(), calls),
        launches=_host_us(lambda i: plan.run(tensors, pointers, stream), calls),
        api_positional=_host_us(lambda i: fn(*[args[name] for name in ARG_ORDER[family]]), calls),
    )
    return parts


ARG_ORDER = {
    "prefill": ("q", "kv_cache", "topk_idx", "block_table", "cu_seqlens_q", "seq_lens", "prefix_lens",
                "max_query_len", "num_kv_heads", "sm_scale", "output", "k_scale", "v_scale"),
    "decode": ("q", "kv_cache", "topk_idx", "block_table", "seq_lens", "num_kv_heads", "sm_scale", "output",
               "decode_query_len", "k_scale", "v_scale"),
}


def measure(quick: bool, calls: int, with_components: bool = False) -> dict:
    import torch
    import triton

    import codegen
    from codegen import api, cases, get_config
    from codegen.api import sparse_attn_decode, sparse_attn_prefill
    from codegen.shapes import HEAD_LAYOUTS
    from codegen.timing import graph_time
    from codegen.tuned_store import kv_dtype_name
    from codegen.validate import detect_device_arch

    arch = detect_device_arch(torch.device("cuda"))
    device = api.device_name(torch.device("cuda"))
    rows, seen = [], set()
    for kernel, layout, reqs, tokens, context, mode, kv in _rows(quick):
        hq, hkv = HEAD_LAYOUTS[layout]
        case = cases.serving_case(kernel, arch=arch, num_q_heads=hq, num_kv_heads=hkv, kv_dtype=kv, scale_mode=mode,
                                  batch=reqs, tokens=tokens, context=context, seed=1)
        fn = sparse_attn_prefill if kernel == "prefill" else sparse_attn_decode
        sets = _layer_sets(case, LAYERS)
        steps = _metadata_sets(sets)
        choice = get_config(kernel, arch, device, mode, kv_dtype_name(case.args["kv_cache"].dtype), hq, hkv,
                            reqs * tokens)
        given = dict(config=choice.config)
        if kernel == "prefill":
            given["selection"] = "tiled"
        row = dict(kernel=kernel, layout=layout, requests=reqs, tokens=tokens, context=context, mode=mode, kv=kv,
                   config=choice.config.non_default(), source=choice.source)
        row["api"] = _host_us(lambda i: fn(**sets[i % LAYERS]), calls)
        row["new_step"] = _host_us(lambda i: fn(**steps[i % LAYERS]), calls)
        row["config"] = _host_us(lambda i: fn(**sets[i % LAYERS], **given), calls)
        step_run = _step_plan_call(codegen, kernel, sets)
        row["plan_run"] = _host_us(step_run, calls) if step_run is not None else None
        triton_floor, c_floor = _floor_calls(codegen, fn, sets[0])
        row["floor"] = _host_us(triton_floor, calls) if triton_floor is not None else None
        row["floor_c"] = _host_us(c_floor, calls) if c_floor is not None else None
        if with_components and triton_floor is not None and (kernel, mode) not in seen:
            seen.add((kernel, mode))
            row["components"] = components(fn, sets[0], kernel, calls)
            print("  components (us):", {k: round(v, 1) for k, v in row["components"].items()}, flush=True)
        row["gpu"] = graph_time([lambda a=sets[i % LAYERS]: fn(**a) for i in range(20)]).median_us
        rows.append(row)
        print(_line(row), flush=True)
    return dict(rows=rows, device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                python=platform.python_version(), tree=str(pathlib.Path(codegen.__file__).resolve().parent.parent),
                calls=calls, date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def _name(row) -> str:
    what = f"{row['requests']} req" if row["kernel"] == "decode" else f"{row['tokens']} tok"
    after = f" after {row['context'] // 1024}k" if row["context"] else ""
    return f"{row['kernel']} {row['layout']} {what}{after} {row['mode']}:{row['kv']}"


def _line(row) -> str:
    return (f"{_name(row):44s} api {_fmt(row['api']):>6s}  new step {_fmt(row['new_step']):>6s}  "
            f"config= {_fmt(row['config']):>6s}  plan.run {_fmt(row.get('plan_run')):>6s}  "
            f"floor {_fmt(row['floor']):>6s}  floor C {_fmt(row.get('floor_c')):>6s}  "
            f"gpu {_fmt(row['gpu']):>6s}")


def compare(before_doc: dict, after_doc: dict) -> str:
    """A markdown table of two runs' rows side by side (µs per call)."""
    before = {_name(r): r for r in before_doc["rows"]}
    after = after_doc["rows"]
    lines = ["| call | before: api | before: config= | api | new step | config= | plan.run | floor (Triton) | floor (C) | gpu |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in after:
        old = before.get(_name(row), {})
        lines.append(f"| {_name(row)} | {_fmt(old.get('api'))} | {_fmt(old.get('config'))} | {_fmt(row['api'])} | "
                     f"{_fmt(row['new_step'])} | {_fmt(row['config'])} | {_fmt(row.get('plan_run'))} | {_fmt(row['floor'])} | "
                     f"{_fmt(row.get('floor_c'))} | "
                     f"{_fmt(row['gpu'])} |")
    return "\n".join(lines)


_FIRST_CALLS = r"""
import json, sys, time, torch
sys.path.insert(0, {repo!r})
from codegen import cases
from codegen.api import sparse_attn_decode, sparse_attn_prefill
from codegen.shapes import HEAD_LAYOUTS
out = []
for kernel, layout, reqs, tokens, context in {shapes!r}:
    hq, hkv = HEAD_LAYOUTS[layout]
    case = cases.serving_case(kernel, arch="sm90", num_q_heads=hq, num_kv_heads=hkv, kv_dtype="fp8",
                              scale_mode="scalar", batch=reqs, tokens=tokens, context=context, seed=1)
    fn = sparse_attn_prefill if kernel == "prefill" else sparse_attn_decode
    table = case.args["block_table"]  # vLLM's is max_model_len / 128 = 1024 blocks wide
    case.args["block_table"] = torch.zeros(table.shape[0], 1024, dtype=table.dtype, device=table.device)
    case.args["block_table"][:, :table.shape[1]] = table
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn(**case.args)
    torch.cuda.synchronize()
    out.append(time.perf_counter() - start)
print(json.dumps(out))
"""


def cold_start(layouts: str = "tp1,tp4") -> dict:
    """First-call wall time of each SHAPES row on an empty Triton cache, without and with
    `msa-tune warmup` (its own time included), each in a fresh process."""
    shapes = [s for s in SHAPES if s[1] in layouts.split(",")]
    script = _FIRST_CALLS.format(repo=str(REPO), shapes=shapes)
    result = {}
    for label in ("without warm-up", "with warm-up"):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TRITON_CACHE_DIR=cache)
            warm = None
            if label == "with warm-up":
                start = time.perf_counter()
                subprocess.run([sys.executable, str(REPO / "tune.py"), "warmup", "--layouts", layouts, "--modes",
                                "scalar:fp8", "--quiet"], env=env, check=True)
                warm = time.perf_counter() - start
            start = time.perf_counter()
            firsts = json.loads(subprocess.run([sys.executable, "-c", script], env=env, check=True,
                                               capture_output=True, text=True).stdout.strip().splitlines()[-1])
            result[label] = dict(warmup_s=warm, process_s=time.perf_counter() - start, first_calls_s=firsts,
                                 shapes=[list(s) for s in shapes])
            print(f"{label}: warm-up {_fmt(warm)} s; first calls (s): "
                  + ", ".join(f"{t:.3f}" for t in firsts), flush=True)
    return result


def main(argv=None) -> int:
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the scalar rows only")
    parser.add_argument("--calls", type=int, default=None, help="back-to-back calls per repeat (default: 200)")
    parser.add_argument("--tree", help="import codegen from this checkout instead (e.g. the previous main)")
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="print two runs side by side")
    parser.add_argument("--cold-start", action="store_true", help="first-call times with and without warm-up")
    parser.add_argument("--components", action="store_true", help="per-part host time of a planned call")
    args = parser.parse_args(argv)
    # What each mode reads: --compare only its two files; --cold-start this checkout's first calls (--out).
    given = [name for name, value in (("--quick", args.quick), ("--calls", args.calls is not None),
                                      ("--tree", args.tree), ("--out", args.out), ("--cold-start", args.cold_start),
                                      ("--components", args.components)) if value]
    if args.compare and given:
        parser.error(f"--compare prints two runs side by side; it takes none of {', '.join(given)}")
    ignored = [name for name in given if name not in ("--cold-start", "--out")]
    if args.cold_start and ignored:
        parser.error(f"--cold-start times this checkout's first calls; it takes none of {', '.join(ignored)}")
    if args.compare:
        print(compare(*(read_json(parser, path, keys=("rows",)) for path in args.compare)))
        return 0
    args.calls = 200 if args.calls is None else args.calls
    if args.calls < 1:
        parser.error(f"argument --calls: expected an int >= 1, got {args.calls}")
    if args.tree and not (pathlib.Path(args.tree) / "codegen").is_dir():
        parser.refuse(f"--tree: {args.tree} is not a checkout (no codegen/ folder in it)")
    if args.out and not pathlib.Path(args.out).resolve().parent.is_dir():
        parser.refuse(f"--out: {pathlib.Path(args.out).parent} is not a folder")
    if gpu_missing(parser.prog):
        return NO_GPU
    sys.path.insert(0, str(pathlib.Path(args.tree).resolve() if args.tree else REPO))
    result = cold_start() if args.cold_start else measure(args.quick, args.calls, args.components)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
