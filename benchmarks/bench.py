"""MSA kernel benchmark on the current GPU: per-call time from CUDA-graph replays, % of floors.

Each case: per-call time from one CUDA graph of `calls` calls cycling over rotating input sets
(enough sets that the data of consecutive calls never shares the L2), median of replays; achieved
bytes/s against a device copy and useful FLOP/s against a bf16 matmul, both measured in this run;
relative L2 error of one call against the float32 reference (codegen.reference.reference_batched).

  python benchmarks/bench.py --quick                  # a few headline cases
  python benchmarks/bench.py --out results/h200       # the full serving grid (JSON, table, PNGs)
  python benchmarks/bench.py --configs runtime '{"block_n": 128}'   # compare launch configs
  python benchmarks/bench.py --grid short-appends --out DIR   # prefill's tiles / per-token break-even
  python benchmarks/break_even.py DIR/bench.json              #   and the host rule it gives

bench.json holds `rows` (one per case and column) and `cases` (one per case: its shape and each
column's time and error).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import pathlib
import platform
import sys
import time

import torch
import triton

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from codegen import LaunchConfig, cases, get_config, selection  # noqa: E402
from codegen.accuracy import compare  # noqa: E402
from codegen.configs import default_config, ws_config  # noqa: E402
from codegen.reference import reference_batched  # noqa: E402
from codegen.timing import copy_bandwidth, empty_launch_us, graph_time, input_sets, matmul_flops  # noqa: E402
from codegen.shapes import DEFAULT_MODES, HEAD_LAYOUTS, SERVING_LAYOUTS  # noqa: E402
from codegen.validate import detect_device_arch  # noqa: E402
from codegen.variants import WS_SCALE_MODES  # noqa: E402
from codegen.workload import min_bytes, useful_flops  # noqa: E402
from plots import token_count  # noqa: E402  (benchmarks/plots.py; matplotlib only when plotting)
from script_cli import NO_GPU, Parser, gpu_missing  # noqa: E402  (benchmarks/script_cli.py)

# The tuner's default grid: head layouts (q heads, KV heads) and scale mode -> KV dtype.
LAYOUTS = SERVING_LAYOUTS
MODES = dict(DEFAULT_MODES)


@dataclasses.dataclass(frozen=True)
class Spec:
    kernel: str
    layout: str
    mode: str
    batch: int  # decode: requests; prefill: requests in the chunk
    tokens: int  # decode: query length per request; prefill: chunk tokens per request
    context: int  # decode: context per request; prefill: cached prefix per request
    pattern: str = "random"

    @property
    def label(self) -> str:
        if self.kernel == "decode":
            return f"decode {self.layout} {self.mode} b{self.batch} q{self.tokens} ctx{token_count(self.context)}"
        return (f"prefill {self.layout} {self.mode} {self.pattern} {self.batch}x{token_count(self.tokens)} "
                f"prefix{token_count(self.context)}")


def build(spec: Spec, arch: str, seed: int, tail: str = "own") -> cases.Case:
    hq, hkv = LAYOUTS[spec.layout]
    return cases.serving_case(spec.kernel, arch=arch, num_q_heads=hq, num_kv_heads=hkv, kv_dtype=MODES[spec.mode],
                              scale_mode=spec.mode, batch=spec.batch, tokens=spec.tokens, context=spec.context,
                              pattern=spec.pattern, q_dtype=torch.bfloat16, device="cuda", seed=seed, tail=tail)


GRIDS = ("serving", "quick", "short-appends")


def grid(name: str = "serving") -> list[Spec]:
    """The cases of a named grid: "serving" (the full serving grid), "quick" (headline cases) or
    "short-appends" (short_appends: prefill's break-even)."""
    if name not in GRIDS:
        raise ValueError(f"grid: expected one of {GRIDS}, got {name!r}")
    if name == "short-appends":
        return short_appends()
    if name == "quick":  # the headline targets and their neighbours
        return [
            Spec("decode", "tp4", "scalar", 1, 1, 8192),
            Spec("decode", "tp4", "per_token_head", 1, 1, 8192),
            Spec("decode", "tp4", "scalar", 32, 1, 8192),
            Spec("decode", "tp4", "scalar", 128, 1, 8192),
            Spec("decode", "tp4", "per_token_head", 128, 1, 8192),
            Spec("decode", "tp1", "scalar", 128, 1, 8192),
            Spec("decode", "tp1", "per_token_head", 128, 1, 8192),
            Spec("decode", "tp1", "none", 128, 1, 8192),
            Spec("decode", "tp1", "scalar", 128, 4, 128 * 1024),
            Spec("decode", "tp8", "scalar", 256, 1, 128 * 1024),
            Spec("prefill", "tp1", "scalar", 1, 8192, 0, "correlated"),
            Spec("prefill", "tp1", "per_token_head", 1, 8192, 0, "correlated"),
            Spec("prefill", "tp4", "scalar", 1, 8192, 0, "correlated"),
            Spec("prefill", "tp4", "per_token_head", 1, 8192, 0, "correlated"),
            Spec("prefill", "tp1", "scalar", 1, 8192, 120 * 1024, "random"),
            Spec("prefill", "tp4", "scalar", 1, 8192, 120 * 1024, "random"),
            Spec("prefill", "tp4", "per_token_head", 1, 8192, 120 * 1024, "random"),
            Spec("prefill", "tp8", "none", 4, 2048, 0, "correlated"),
        ]
    specs = []
    for mode in MODES:
        for layout in LAYOUTS:
            for ctx in (8192, 128 * 1024):
                for qlen in (1, 4):
                    for batch in (1, 8, 32, 128, 256):
                        specs.append(Spec("decode", layout, mode, batch, qlen, ctx))
            for pattern in ("correlated", "random"):
                for tokens, prefix, batch in ((2048, 0, 1), (8192, 0, 1), (32768, 0, 1), (8192, 120 * 1024, 1),
                                              (2048, 0, 4)):
                    specs.append(Spec("prefill", layout, mode, batch, tokens, prefix, pattern))
    return specs


# Short prefills (issue 37): tens to hundreds of new tokens per request after a cached prefix
# (chunked-prefill tails, multi-turn appends, speculative verification), where `auto`'s device
# decision and its emptied launch can cost more than the work. Timed with the three SELECTION_COLUMNS
# (the table's configs, as a user calls it) for benchmarks/break_even.py, which derives the host
# rule (codegen.selection.PER_TOKEN_UP_TO) from them.
SHORT_QUERY_LENS = (16, 32, 64, 128, 256, 512)  # new tokens per request
SHORT_REQUESTS = (1, 4, 16)  # the host rule's request buckets
SHORT_PREFIXES = (1024, 8192, 128 * 1024)  # cached tokens before them
SHORT_MODES = ("scalar", "per_token_head")  # fp8 caches
SHORT_RANDOM = dict(prefixes=(8192, 128 * 1024), requests=(1,))  # the random pattern's trimmed subgrid


def short_appends() -> list[Spec]:
    """Prefill's break-even grid: every query length of SHORT_QUERY_LENS per request, for each
    serving layout (TP1 64/4, TP4 16/1, TP8 8/1 heads) and fp8 scale mode. Correlated selections
    (neighbouring tokens share blocks: the tiles' best case, so these rows bound the per-token
    region) run every request count of SHORT_REQUESTS after every prefix of SHORT_PREFIXES. Random
    ones (the per-token walk's best case: their rows only show where per-token wins) are trimmed to
    keep the run short: prefixes 8k and 128k, one request (SHORT_RANDOM); after a 1k prefix a
    token reads every block up to its own (at most 12, under topk 16), so random and correlated
    selections coincide there. Memory: caches
    hold only the selected pages, at most 16 requests x 1024 blocks of 128k (2 GB at TP1) per set."""
    specs = []  # correlated first, by prefix: a run stopped at its time limit keeps the rows that bound the rule
    for pattern, prefixes, requests in (("correlated", SHORT_PREFIXES, SHORT_REQUESTS),
                                        ("random", SHORT_RANDOM["prefixes"], SHORT_RANDOM["requests"])):
        for prefix in prefixes:
            for mode in SHORT_MODES:
                for layout in LAYOUTS:
                    for batch in requests:
                        for tokens in SHORT_QUERY_LENS:
                            specs.append(Spec("prefill", layout, mode, batch, tokens, prefix, pattern))
    return specs


# The columns a grid runs when --configs is not given, and its calls per graph when --calls is not.
# Short prefills take 10: their calls last tens to hundreds of microseconds, and building half the
# input sets keeps the grid's run short (under 3 MB a set, 10 or 20 sets alike stay in the H200's
# 60 MB L2; from 24 MB a set on, 10 stream four L2s as 20 do).
GRID_COLUMNS = {"short-appends": ["tiled", "per_token", "auto"]}
DEFAULT_COLUMNS = ["runtime", "untuned", "unfolded"]
GRID_CALLS = {"short-appends": 10}
DEFAULT_CALLS = 20

SELECTION_COLUMNS = ("tiled", "per_token", "auto")  # prefill's `selection` argument


# `auto` told the cases' longest sequence (max_seq_len, as an engine that holds it on the host passes it:
# vLLM's drop-in op does not): within topk pages the tiles are taken on the host (selection.tiles_on_host).
BOUNDED_AUTO = "auto_bound"
NAMED_COLUMNS = ("runtime", "untuned", "unfolded") + SELECTION_COLUMNS + (BOUNDED_AUTO,)


def column_problem(variant: str) -> str | None:
    """Why `variant` is no column --configs takes (checked before any GPU work), or None."""
    if variant in NAMED_COLUMNS or variant == "ws":
        return None
    if variant.startswith("ws:"):
        rows = variant.partition(":")[2]
        return None if rows.isdigit() and int(rows) > 0 else f"{variant!r}: ws:N needs a positive int N"
    try:
        overrides = json.loads(variant)
        if not isinstance(overrides, dict):
            raise TypeError(f"expected a JSON object, got {type(overrides).__name__}")
        LaunchConfig.from_dict(overrides, what="override")  # field names and int values
    except (ValueError, TypeError) as exc:  # json.JSONDecodeError is a ValueError
        return (f"{variant!r} is none of {', '.join(NAMED_COLUMNS)}, ws, ws:N, or a JSON object of "
                f"LaunchConfig fields ({exc})")
    return None


def resolve(variant: str, spec: Spec, arch: str, case: cases.Case) -> tuple[LaunchConfig | None, dict]:
    """(the config a column runs, the keyword arguments of its call). 'runtime': what the API does
    by itself (config=None: the loader's tuned entry when a file matches; prefill's selection
    'auto'); 'ws' / 'ws:N': the warp-specialized Gluon tile (sm90 fp8 prefill, convert_rows N, 'auto');
    'untuned': the arch default; 'unfolded': the runtime config in the seed's unfolded
    scalar rendering (none where the runtime runs the Gluon tile, which has no unfolded form);
    'tiled' / 'per_token' / 'auto': prefill's selection argument, the API
    picking the config (the one shown is the tiled one for auto); 'auto_bound': 'auto' with the
    case's longest sequence as max_seq_len; or a JSON object overriding
    fields of the runtime config. (None, {}) when the column does not apply to the case."""
    hq, hkv = LAYOUTS[spec.layout]
    lookup = functools.partial(get_config, spec.kernel, arch, torch.cuda.get_device_name(), spec.mode,
                               MODES[spec.mode], hq, hkv, case.args["q"].shape[0])
    if variant in SELECTION_COLUMNS:
        if spec.kernel != "prefill":
            return None, {}
        return lookup(per_token=variant == "per_token").config, dict(selection=variant)
    if variant == BOUNDED_AUTO:
        if spec.kernel != "prefill":
            return None, {}
        return lookup().config, dict(selection="auto", max_seq_len=int(case.args["seq_lens"].max()))
    if variant.startswith("ws"):  # the Gluon tile at convert_rows N ("ws:N", default 16), selection 'auto'
        if spec.kernel != "prefill" or spec.mode not in WS_SCALE_MODES or arch != "sm90":
            return None, {}
        ws = ws_config(gqa=hq // hkv, convert_rows=int(variant.partition(":")[2] or 16))
        return ws, dict(config=ws, selection="auto")
    runtime = lookup().config
    if variant == "runtime":
        return runtime, {}
    if variant == "untuned":
        default = default_config(arch, spec.kernel, num_tokens=case.args["q"].shape[0], num_kv_heads=hkv)
        return default, dict(config=default)
    if variant == "unfolded":  # the seed's baseline exists for the Triton-language kernels, scalar scales only
        if spec.mode != "scalar" or runtime.warp_specialize:
            return None, {}
        return runtime, dict(config=runtime, fold_scales=False)
    override = dataclasses.replace(runtime, **json.loads(variant))
    return override, dict(config=override)


def accuracy(case: cases.Case, kw: dict, reference: torch.Tensor | None = None) -> float:
    """Relative L2 error of one call on `case` (output poisoned first) against the float32 reference
    (`reference`: computed before, for the case's inputs)."""
    case.poison()
    out = cases.run_kernel(case, **kw)
    if reference is None:
        reference = reference_batched(case.kernel, case.args)
    return compare(out, reference, torch.bfloat16).rel_l2


def run_spec(spec: Spec, arch: str, config_args: list[str], calls: int, tail: str = "own") -> list[dict]:
    first = build(spec, arch, seed=0, tail=tail)
    nbytes, flops = min_bytes(first), useful_flops(first)
    n_sets = input_sets(nbytes, maximum=calls)
    sets = [first] + [build(spec, arch, seed=s, tail=tail) for s in range(1, n_sets)]
    reference = functools.cache(lambda: reference_batched(first.kernel, first.args))  # once for every column
    rows = []
    for config_arg in config_args:
        config, kw = resolve(config_arg, spec, arch, first)
        if config is None:
            continue  # the unfolded baseline exists for scalar scales only, selections for prefill only
        try:
            # Prefill calls run for milliseconds: fewer replays give as stable a median.
            timing = graph_time([lambda c=sets[i % n_sets]: cases.run_kernel(c, **kw)
                                 for i in range(calls)], replays=30 if spec.kernel == "decode" else 8)
            rel_l2 = accuracy(first, kw, reference())
        except Exception as exc:  # a config that cannot run is reported, not fatal
            rows.append(dict(case=spec.label, config=config_arg, error=f"{type(exc).__name__}: {exc}"[:200]))
            continue
        rows.append(dict(case=spec.label, spec=dataclasses.asdict(spec), config=config_arg, launch=config.to_dict(),
                         time_us=timing.median_us, p10_us=timing.p10_us, p90_us=timing.p90_us,
                         calls=calls, input_sets=n_sets, bytes=nbytes, flops=flops, rel_l2=rel_l2, tail=tail))
    del sets, reference
    torch.cuda.empty_cache()
    return rows


def case_summary(rows: list[dict], wall_s: dict | None = None) -> list[dict]:
    """One entry per case of `rows` (in their order): its shape (num_q_heads, num_kv_heads and gqa,
    requests, query_len and prefix for prefill; context instead of prefix for decode), and per column
    its time_us and rel_l2 (columns that failed are left out). wall_s: seconds each case took, by label."""
    by_case: dict = {}
    for row in rows:
        if "error" in row:
            continue
        spec = row["spec"]
        # (q heads, KV heads); None for each: a layout this version does not know
        hq, hkv = HEAD_LAYOUTS.get(spec["layout"], (None, None))
        entry = by_case.setdefault(row["case"], dict(
            case=row["case"], kernel=spec["kernel"], layout=spec["layout"], num_q_heads=hq, num_kv_heads=hkv,
            gqa=hq // hkv if hq else None, mode=spec["mode"],
            pattern=spec["pattern"] if spec["kernel"] == "prefill" else None, requests=spec["batch"],
            query_len=spec["tokens"], time_us={}, rel_l2={}))
        entry["prefix" if spec["kernel"] == "prefill" else "context"] = spec["context"]
        entry["time_us"][row["config"]] = row["time_us"]
        entry["rel_l2"][row["config"]] = row["rel_l2"]
        if wall_s and row["case"] in wall_s:
            entry["wall_s"] = wall_s[row["case"]]
    return list(by_case.values())


def main(argv=None) -> int:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", choices=GRIDS, default="serving",
                        help="the cases: serving (the full serving grid, default), quick (a few headline cases), "
                             "short-appends (short prefills after a prefix: prefill's tiles / per-token break-even "
                             "for benchmarks/break_even.py; columns tiled per_token auto)")
    parser.add_argument("--quick", dest="grid", action="store_const", const="quick", help="--grid quick")
    parser.add_argument("--configs", nargs="+", default=None,
                        help="columns: runtime (tuned when a file matches), untuned (arch default), unfolded "
                             "(the seed's baseline, scalar only), tiled / per_token / auto (prefill's selection "
                             "argument), auto_bound (auto told max_seq_len), ws / ws:N (the Gluon prefill tile, "
                             "convert_rows N), or JSON overrides of the runtime config (default: runtime untuned "
                             "unfolded; short-appends: tiled per_token auto)")
    parser.add_argument("--no-host-rule", action="store_true",
                        help="auto decides every prefill on the device: codegen.selection.PER_TOKEN_UP_TO emptied "
                             "for this run (to re-measure the break-even once the table holds entries)")
    parser.add_argument("--calls", type=int, default=None,
                        help="calls captured per graph, each on its own input set up to as many sets as keep the "
                             "L2 cold (default 20; short-appends 10)")
    parser.add_argument("--filter", nargs="+", default=[""], help="only cases whose label contains one of these")
    parser.add_argument("--exclude", nargs="+", default=[], help="leave out cases whose label contains one of these")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="folder for bench.json and the PNG plots")
    parser.add_argument("--tail", default="own", choices=cases.TAILS,
                        help="what fills top-k rows past the entries a token reads (default: vLLM's, the own block)")
    args = parser.parse_args(argv)
    columns = args.configs or GRID_COLUMNS.get(args.grid, DEFAULT_COLUMNS)
    calls = args.calls if args.calls is not None else GRID_CALLS.get(args.grid, DEFAULT_CALLS)
    # Checked before any GPU work: a typo used to surface as a traceback after the ceilings' measurement.
    for variant in columns:
        if (problem := column_problem(variant)) is not None:
            parser.error(f"--configs: {problem}")
    if calls < 1:
        parser.error(f"--calls: expected an int >= 1, got {calls}")
    specs = [s for s in grid(args.grid)
             if any(f in s.label for f in args.filter) and not any(x in s.label for x in args.exclude)]
    if not specs:
        parser.error(f"--filter {args.filter} / --exclude {args.exclude}: no case of the {args.grid} grid left")
    if gpu_missing(parser.prog):
        return NO_GPU
    started = time.perf_counter()
    if args.no_host_rule:
        selection.PER_TOKEN_UP_TO = {}
    arch = detect_device_arch(torch.device("cuda"))
    env = dict(gpu=torch.cuda.get_device_name(), arch=arch, torch=torch.__version__, triton=triton.__version__,
               cuda=torch.version.cuda, hip=torch.version.hip, python=platform.python_version(),
               date=time.strftime("%Y-%m-%d %H:%M:%S %Z"), command=" ".join(sys.argv))
    env["copy_bytes_per_s"] = copy_bandwidth()
    env["bf16_flops_per_s"] = matmul_flops()
    env["empty_launch_us"] = empty_launch_us(calls)
    # The host rule `auto` ran under (codegen.selection.PER_TOKEN_UP_TO for this arch): inside its
    # region `auto` is the per-token launch alone, which break_even.py says when it reads the file.
    env["host_rule"] = {f"{mode}/{hq}q{hkv}kv": [list(b) for b in buckets]
                        for (mode, hq, hkv), buckets in selection.PER_TOKEN_UP_TO.get(arch, {}).items()}
    print(f"# {env['gpu']} ({arch}), torch {env['torch']}, triton {env['triton']}; "
          f"copy {env['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 matmul {env['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s, "
          f"an empty one-launch call {env['empty_launch_us']:.2f} us")
    rows, wall_s = [], {}
    header = f"{'case':58s} {'config':>18s} {'us/call':>9s} {'%HBM':>6s} {'%bf16':>6s} {'rel_l2':>8s}"
    print(header)
    for spec in specs:
        case_started = time.perf_counter()
        spec_rows = run_spec(spec, arch, columns, calls, args.tail)
        wall_s[spec.label] = round(time.perf_counter() - case_started, 3)
        for row in spec_rows:
            if "error" not in row:
                row["hbm_fraction"] = row["bytes"] / (row["time_us"] * 1e-6) / env["copy_bytes_per_s"]
                row["bf16_fraction"] = row["flops"] / (row["time_us"] * 1e-6) / env["bf16_flops_per_s"]
                print(f"{row['case']:58s} {row['config'][:18]:>18s} {row['time_us']:9.2f} "
                      f"{100 * row['hbm_fraction']:6.1f} {100 * row['bf16_fraction']:6.1f} {row['rel_l2']:8.1e}",
                      flush=True)
            else:
                print(f"{row['case']:58s} {row['config'][:18]:>18s} ERROR {row['error']}", flush=True)
            rows.append(row)
        if args.out:  # after every case (atomically): a run stopped at its time limit keeps what it measured
            args.out.mkdir(parents=True, exist_ok=True)
            env["wall_s"] = round(time.perf_counter() - started, 1)
            partial = args.out / "bench.json.tmp"
            partial.write_text(json.dumps(dict(env=env, rows=rows, cases=case_summary(rows, wall_s)), indent=1,
                                          sort_keys=True))
            partial.replace(args.out / "bench.json")
    if args.out:
        try:
            from plots import write_plots  # noqa: E402  (benchmarks/plots.py, matplotlib)
            write_plots(rows, args.out)
        except ImportError as exc:
            print(f"plots skipped: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
