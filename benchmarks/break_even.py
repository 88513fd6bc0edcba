"""Prefill's break-even between the tiles and the per-token walk, and the host rule it gives
(codegen.selection.PER_TOKEN_UP_TO), from a run of `bench.py --grid short-appends`.

  python benchmarks/break_even.py DIR/bench.json [MORE.json ...] [--margin 1.05]

Reads the cases timed with all three selections (columns `tiled`, `per_token` and `auto`, the
table's configs as a user calls them) and prints:
(a) per scale mode and head layout, a table by query length (columns) and pattern x requests x
    prefix (rows) of per_token / tiled and auto / min(tiled, per_token): below 1 the per-token walk
    is the faster path; above 1 `auto` is slower than the faster path;
(b) PER_TOKEN_UP_TO's entries for the run's arch as Python text, to paste into codegen/selection.py;
(c) `auto` as a user gets it over the faster path (geomean, median, worst, cases over the margin): the
    run's auto column when it ran under a host rule, else these entries' per-token time inside their
    region and the device decision outside.

The rule: for each scale mode, head layout (q heads, KV heads: TP1 64/4 and TP4 16/1 share a gqa
of 16 but not their break-even, so each layout has its own entries) and request count R measured,
the bucket (R, L) holds the largest measured query length L such that on EVERY case of that mode and
layout with R requests and query length <= L (every prefix, both selection patterns) the per-token
time is at most margin x min(tiled, auto) (margin 1.05 by default); L is 0 when even the shortest
fails.
Calls of n requests take the bucket with the smallest R >= n; more requests than the largest R
measured have no host rule. A case whose column failed or is missing does not count (it is named).
"""
from __future__ import annotations

import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from codegen.selection import inside_buckets  # noqa: E402
from codegen.shapes import HEAD_LAYOUTS  # noqa: E402
from codegen.variants import SCALE_MODES  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench import case_summary  # noqa: E402  (benchmarks/bench.py: the cases of its rows)
from plots import token_count  # noqa: E402  (benchmarks/plots.py; matplotlib only when plotting)
from script_cli import Parser, read_json  # noqa: E402

COLUMNS = ("tiled", "per_token", "auto")
MARGIN = 1.05
ACCURACY = 5e-3  # rel L2 a row must stay within (issue 37's target); worse ones are named


def measured_cases(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """(prefill cases with all three columns: bench.case_summary's entries; labels of those without:
    a column that failed or is missing, or not a prefill case of a known head layout)."""
    rows = [row for row in rows if row.get("config") in COLUMNS]
    complete = [case for case in case_summary(rows)
                if case["kernel"] == "prefill" and case["num_q_heads"] is not None
                and set(case["time_us"]) == set(COLUMNS)]
    measured = {case["case"] for case in complete}
    incomplete = [label for label in dict.fromkeys(row["case"] for row in rows) if label not in measured]
    return complete, incomplete


def per_token_ratio(case: dict) -> float:
    """per_token / min(tiled, auto): the rule's measure (at most the margin: per-token on the host)."""
    t = case["time_us"]
    return t["per_token"] / min(t["tiled"], t["auto"])


def rule_key(case: dict) -> tuple[str, int, int]:
    """(mode, num_q_heads, num_kv_heads): PER_TOKEN_UP_TO's key for a case."""
    return case["mode"], case["num_q_heads"], case["num_kv_heads"]


def derive(cases: list[dict], margin: float = MARGIN) -> dict[tuple[str, int, int], list[tuple[int, int, dict | None]]]:
    """{(mode, num_q_heads, num_kv_heads): [(requests, L, the case that stopped L or None), ...]} by
    the module's rule, request counts rising."""
    groups: dict = {}
    for case in cases:
        groups.setdefault(rule_key(case), {}).setdefault(case["requests"], []).append(case)
    table = {}
    # Modes in SCALE_MODES' order, then the most q heads first (tp1, tp4, tp8: the ratio tables' order).
    for key in sorted(groups, key=lambda k: (_mode_order(k[0]), -k[1], -k[2])):
        buckets = []
        for requests in sorted(groups[key]):
            bucket = groups[key][requests]
            up_to, stopped = 0, None
            for query_len in sorted({c["query_len"] for c in bucket}):
                losing = [c for c in bucket if c["query_len"] == query_len and per_token_ratio(c) > margin]
                if losing:
                    stopped = max(losing, key=per_token_ratio)
                    break
                up_to = query_len
            buckets.append((requests, up_to, stopped))
        table[key] = buckets
    return table


def auto_as_shipped(cases: list[dict], table: dict, host_rule_ran: bool, margin: float = MARGIN) -> dict:
    """(c): `auto` over the faster path, as a user would get it: the run's auto column where the run
    already had a host rule; else (bench.py --no-host-rule: the device decided everywhere) the
    per-token time inside `table`'s region and the device decision outside it."""
    ratios, over = [], []
    for case in cases:
        t = case["time_us"]
        buckets = [(requests, up_to) for requests, up_to, _ in table.get(rule_key(case), [])]
        inside = not host_rule_ran and inside_buckets(buckets, case["requests"], case["query_len"])
        ratio = (t["per_token"] if inside else t["auto"]) / min(t["tiled"], t["per_token"])
        ratios.append(ratio)
        if ratio > margin:
            over.append((ratio, case["case"]))
    ratios.sort()
    return dict(cases=len(ratios), geomean=math.exp(sum(map(math.log, ratios)) / len(ratios)),
                median=ratios[len(ratios) // 2], worst=max(over, default=(ratios[-1], None)), over=len(over))


def _mode_order(mode: str) -> int:
    return SCALE_MODES.index(mode) if mode in SCALE_MODES else len(SCALE_MODES)


def ratio_tables(cases: list[dict]) -> str:
    """(a): per (mode, layout), rows pattern x requests x prefix, columns query lengths."""
    out = []
    keys = sorted({(c["mode"], c["layout"]) for c in cases}, key=lambda k: (_mode_order(k[0]), int(k[1][2:])))
    for mode, layout in keys:
        sub = [c for c in cases if c["mode"] == mode and c["layout"] == layout]
        lengths = sorted({c["query_len"] for c in sub})
        hq, hkv = HEAD_LAYOUTS[layout]
        out += [f"## {mode}, {layout} ({hq}/{hkv} heads, gqa {hq // hkv}): "
                "per_token / tiled, auto / min(tiled, per_token)", "",
                "| pattern | requests | prefix | " + " | ".join(map(str, lengths)) + " |",
                "|---|---:|---:|" + "---:|" * len(lengths)]
        by = {(c["pattern"], c["requests"], c["prefix"], c["query_len"]): c for c in sub}
        for pattern, requests, prefix in sorted({(c["pattern"], c["requests"], c["prefix"]) for c in sub}):
            cells = []
            for q in lengths:
                c = by.get((pattern, requests, prefix, q))
                if c is None:
                    cells.append("-")
                    continue
                t = c["time_us"]
                bad = "!" if max(c["rel_l2"].values()) > ACCURACY else ""
                fastest = min(t["tiled"], t["per_token"])
                cells.append(f"{t['per_token'] / t['tiled']:.2f} / {t['auto'] / fastest:.2f}{bad}")
            out.append(f"| {pattern} | {requests} | {token_count(prefix)} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def python_entries(table: dict, arch: str, cases: list[dict], margin: float, source: str) -> str:
    """(b): PER_TOKEN_UP_TO = {arch: {...}} as Python, a comment per bucket saying what stopped it."""
    layouts = {}
    for c in cases:
        layouts.setdefault(rule_key(c), set()).add(c["layout"])
    lines = [f"# benchmarks/break_even.py {source}: margin {margin}",
             "PER_TOKEN_UP_TO: dict[str, dict[tuple[str, int, int], tuple[tuple[int, int], ...]]] = {",
             f'    "{arch}": {{']
    for (mode, hq, hkv), buckets in table.items():
        names = ", ".join(sorted(layouts[(mode, hq, hkv)], key=lambda l: int(l[2:])))
        lines.append(f"        # {mode}, {hq}/{hkv} heads ({names}):")
        for requests, up_to, stopped in buckets:
            why = ("every length measured" if stopped is None else
                   f"{stopped['query_len']}: {stopped['case'].removeprefix('prefill ')}, per_token "
                   f"{per_token_ratio(stopped):.2f}x min(tiled, auto)")
            lines.append(f"        #   {requests} request{'s' if requests > 1 else ''}: up to {up_to} ({why})")
        entries = repr(tuple((requests, up_to) for requests, up_to, _ in buckets))
        lines.append(f'        ("{mode}", {hq}, {hkv}): {entries},')
    lines += ["    },", "}"]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench_json", nargs="+", help="bench.json files written by bench.py --grid short-appends --out")
    parser.add_argument("--margin", type=float, default=MARGIN,
                        help="per-token on the host where per_token <= MARGIN x min(tiled, auto) (default 1.05)")
    args = parser.parse_args(argv)
    if not args.margin > 0:
        parser.refuse(f"argument --margin: expected a number > 0, got {args.margin}")
    docs = [read_json(parser, path, keys=("env", "rows")) for path in args.bench_json]
    archs = {doc["env"].get("arch") for doc in docs}
    if len(archs) != 1:
        parser.refuse(f"the files were measured on different archs ({', '.join(sorted(map(str, archs)))})")
    (arch,) = archs
    cases, incomplete = measured_cases([row for doc in docs for row in doc["rows"]])
    if not cases:
        parser.refuse(f"{', '.join(args.bench_json)}: no prefill case timed with all of {', '.join(COLUMNS)} "
                      "(bench.py --grid short-appends)")
    for doc in docs:
        if doc["env"].get("host_rule"):
            print(f"note: auto ran under a host rule ({doc['env']['host_rule']}): inside it auto is the per-token "
                  "launch; bench.py --no-host-rule measures the device decision everywhere\n")
    print(ratio_tables(cases))
    if incomplete:
        print(f"left out (a column failed or is missing): {'; '.join(incomplete)}\n")
    inaccurate = [f"{c['case']} {col} {err:.1e}" for c in cases for col, err in c["rel_l2"].items() if err > ACCURACY]
    print(f"accuracy: {'every column of every case within' if not inaccurate else 'beyond'} rel L2 {ACCURACY}"
          + (f" ('!' above): {'; '.join(inaccurate)}" if inaccurate else ""))
    env = docs[0]["env"]
    source = f"on {', '.join(args.bench_json)} ({env.get('gpu')}, {env.get('date')})"
    table = derive(cases, args.margin)
    print("\n" + python_entries(table, arch, cases, args.margin, source))
    shipped = auto_as_shipped(cases, table, any(doc["env"].get("host_rule") for doc in docs), args.margin)
    worst, worst_case = shipped["worst"]
    print(f"\n# auto as shipped (the run's host rule, else these entries then the device decision) over the faster "
          f"path, {shipped['cases']} cases: geomean {shipped['geomean']:.3f}, median {shipped['median']:.3f}, "
          f"worst {worst:.2f}x{f' ({worst_case})' if worst_case else ''}; over {args.margin}x in {shipped['over']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
