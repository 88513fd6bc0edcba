"""Markdown table of one or more bench.json files (e.g. one per GPU of a sharded run), one row per
case and one column per config; each file's rows keep the fractions of its own run's ceilings.

  python benchmarks/report.py results/h200/bench/bench.json [more.json ...]
"""
from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from plots import ceiling_key  # noqa: E402  (benchmarks/plots.py; matplotlib only when plotting)
from script_cli import Parser, read_json  # noqa: E402


def _env_line(env: dict) -> str:
    return (f"{env['gpu']} ({env['arch']}), torch {env['torch']}, triton {env['triton']}, {env['date']}; "
            f"ceilings measured in the same run: copy {env['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
            f"bf16 matmul {env['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s"
            + (f", an empty one-launch call {env['empty_launch_us']:.2f} us" if "empty_launch_us" in env else "")
            + f". Command: `{env['command']}`.")


def markdown(*docs: dict) -> str:
    rows = [r for doc in docs for r in doc["rows"] if "error" not in r]
    columns = list(dict.fromkeys(r["config"] for r in rows))
    cases = list(dict.fromkeys(r["case"] for r in rows))
    by = {(r["case"], r["config"]): r for r in rows}
    ratios = [c for c in ("untuned", "unfolded", "tiled", "per_token", "auto") if c in columns]  # only columns the run measured
    head = ["case"] + [f"{c} us" for c in columns] + ["runtime % of floor"] + [f"{c} / runtime" for c in ratios]
    lines = ["\n".join(("- " if len(docs) > 1 else "") + _env_line(doc["env"]) for doc in docs), "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for case in cases:
        cells = [case]
        for c in columns:
            r = by.get((case, c))
            cells.append(f"{r['time_us']:.1f}" if r else "-")
        run = by.get((case, "runtime"))
        if run:
            floor = run[ceiling_key(case.split()[0])]
            cells.append(f"{100 * floor:.1f}% {'HBM' if case.startswith('decode') else 'bf16'}")
        else:
            cells.append("-")
        for other in ratios:
            r = by.get((case, other))
            cells.append(f"{r['time_us'] / run['time_us']:.2f}x" if r and run else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("bench_json", nargs="+", help="bench.json files written by benchmarks/bench.py --out")
    args = parser.parse_args(argv)
    print(markdown(*(read_json(parser, path, keys=("env", "rows")) for path in args.bench_json)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
